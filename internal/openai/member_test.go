package openai

import (
	"bytes"
	"encoding/json"
	"testing"
)

// Member finds what decoding into a map finds (the last of repeated keys),
// FirstElement what decoding into a slice finds, and neither panics on
// invalid JSON.
func FuzzMember(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","messages":[{"role":"user","content":"hi"}]}`,
		` { "a" : [ 1 , {"b":"]\"}"} ] , "k" : 2 , "k":"last" } `,
		`{"k\u0031":true,"k1":null}`,
		`{"k":1e5}`, `[ "x" , 1 ]`, `[]`, `{}`, `{"k":`, `{"k"`, `[`, `"s"`, ``,
	} {
		f.Add([]byte(s), "k")
	}
	f.Fuzz(func(t *testing.T, obj []byte, key string) {
		got := Member(obj, key)
		first := FirstElement(obj)
		if !json.Valid(obj) {
			return
		}
		var m map[string]json.RawMessage
		if json.Unmarshal(obj, &m) == nil && m != nil {
			if want, ok := m[key]; ok != (got != nil) || !bytes.Equal(got, want) {
				t.Errorf("Member(%s, %q) = %s, want %s (present %v)", obj, key, got, want, ok)
			}
		} else if got != nil {
			t.Errorf("Member(%s, %q) = %s for a non-object", obj, key, got)
		}
		var a []json.RawMessage
		if json.Unmarshal(obj, &a) == nil && len(a) > 0 {
			if !bytes.Equal(first, a[0]) {
				t.Errorf("FirstElement(%s) = %s, want %s", obj, first, a[0])
			}
		} else if first != nil {
			t.Errorf("FirstElement(%s) = %s for a non-array or empty one", obj, first)
		}
	})
}
