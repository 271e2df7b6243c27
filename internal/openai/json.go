package openai

import (
	"bytes"
	"encoding/json"
)

// Member returns the raw value of the member key of the JSON object obj (the
// last one when the key repeats, as encoding/json decodes it; keys match
// exactly, not case-insensitively), or nil when obj is not an object or has
// no such member. obj is meant to be valid JSON, such as a body ReadRequest
// accepted or a value taken from one; on other input the result is
// unspecified but Member never panics. Only obj's top level is walked, and
// nothing is decoded or allocated (but an escaped key).
func Member(obj []byte, key string) []byte {
	i := skipSpace(obj, 0)
	if i >= len(obj) || obj[i] != '{' {
		return nil
	}
	var v []byte
	for i = skipSpace(obj, i+1); i < len(obj) && obj[i] != '}'; i = skipSpace(obj, i) {
		if obj[i] == ',' {
			i = skipSpace(obj, i+1)
		}
		keyEnd := valueEnd(obj, i)
		from := skipSpace(obj, skipSpace(obj, keyEnd)+1) // past the colon
		if from >= len(obj) {
			break
		}
		k := obj[i:keyEnd]
		i = valueEnd(obj, from)
		if keyIs(k, key) {
			v = obj[from:i]
		}
	}
	return v
}

// keyIs reports whether the quoted JSON string k is key.
func keyIs(k []byte, key string) bool {
	if len(k) < 2 || k[0] != '"' {
		return false
	}
	if bytes.IndexByte(k, '\\') < 0 {
		return string(k[1:len(k)-1]) == key
	}
	var s string
	return json.Unmarshal(k, &s) == nil && s == key
}

// FirstElement returns the raw first element of the JSON array arr, or nil
// when arr is not an array or is empty; like Member, it expects valid JSON.
func FirstElement(arr []byte) []byte {
	i := skipSpace(arr, 0)
	if i >= len(arr) || arr[i] != '[' {
		return nil
	}
	if i = skipSpace(arr, i+1); i >= len(arr) || arr[i] == ']' {
		return nil
	}
	return arr[i:valueEnd(arr, i)]
}

// eachKey calls fn with each quoted key of the JSON object obj's top level,
// in order, and returns fn's first error; obj not an object calls nothing.
// Like Member, it expects valid JSON.
func eachKey(obj []byte, fn func(key []byte) error) error {
	i := skipSpace(obj, 0)
	if i >= len(obj) || obj[i] != '{' {
		return nil
	}
	for i = skipSpace(obj, i+1); i < len(obj) && obj[i] != '}'; i = skipSpace(obj, i) {
		if obj[i] == ',' {
			i = skipSpace(obj, i+1)
		}
		keyEnd := valueEnd(obj, i)
		if err := fn(obj[i:keyEnd]); err != nil {
			return err
		}
		from := skipSpace(obj, skipSpace(obj, keyEnd)+1) // past the colon
		if from >= len(obj) {
			break
		}
		i = valueEnd(obj, from)
	}
	return nil
}
