package openai

import (
	"bytes"
	"math"
	"strconv"
)

// OutputCap is one field of a request that bounds the tokens generated:
// max_tokens, max_completion_tokens (chat) or max_output_tokens (responses).
type OutputCap struct {
	Param string
	// N is the bound asked for; -1 when the value is not an integer (vLLM
	// reads a string holding a number as that number, so a string counts
	// as its number).
	N int64
}

// outputParams are the request fields that bound generated tokens.
var outputParams = map[string]bool{`"max_tokens"`: true, `"max_completion_tokens"`: true, `"max_output_tokens"`: true}

// outputCap reads the value of an output bound; null is no bound (ok false).
func outputCap(key, raw []byte) (OutputCap, bool) {
	if string(raw) == "null" {
		return OutputCap{}, false
	}
	c := OutputCap{Param: string(key[1 : len(key)-1]), N: -1}
	s := raw
	if len(s) >= 2 && s[0] == '"' {
		s = bytes.TrimSpace(s[1 : len(s)-1])
	}
	if f, err := strconv.ParseFloat(string(s), 64); err == nil && f == math.Trunc(f) && f >= 0 {
		c.N = int64(min(f, math.MaxInt64/2))
	}
	return c, true
}

// OutputParams are the fields that bound the tokens an inference route
// generates, as the engine reads them; the first is the one to insert when
// a cap applies and the request sets none. Nil for routes that generate no
// tokens (embeddings, scoring, audio and the rest).
func OutputParams(path string) []string {
	switch path {
	case "/v1/chat/completions":
		return []string{"max_completion_tokens", "max_tokens"}
	case "/v1/completions", "/v1/messages":
		return []string{"max_tokens"}
	case "/v1/responses":
		return []string{"max_output_tokens"}
	}
	return nil
}

// AddMember returns body, a JSON object, with "key": n as its first member.
func AddMember(body []byte, key string, n int) []byte {
	brace := bytes.IndexByte(body, '{')
	out := make([]byte, 0, len(body)+len(key)+16)
	out = append(out, body[:brace+1]...)
	out = strconv.AppendQuote(out, key)
	out = append(out, ':')
	out = strconv.AppendInt(out, int64(n), 10)
	if rest := bytes.TrimLeft(body[brace+1:], " \t\r\n"); len(rest) == 0 || rest[0] != '}' {
		out = append(out, ',')
	}
	return append(out, body[brace+1:]...)
}
