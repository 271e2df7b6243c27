package openai

import (
	"bytes"
	"math"
	"slices"
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
var outputParams = map[string]bool{"max_tokens": true, "max_completion_tokens": true, "max_output_tokens": true}

// outputCap reads the value of the output bound key; null is no bound (ok
// false).
func outputCap(key string, raw []byte) (OutputCap, bool) {
	if string(raw) == "null" {
		return OutputCap{}, false
	}
	return OutputCap{Param: key, N: count(raw)}, true
}

// count reads a JSON value that should be a whole number of at least zero
// as the engine does (a string holding a number counts as that number, 1e3
// as 1000); -1 when it is not one.
func count(raw []byte) int64 {
	s := raw
	if len(s) >= 2 && s[0] == '"' {
		s = bytes.TrimSpace(s[1 : len(s)-1])
	}
	f, err := strconv.ParseFloat(string(s), 64)
	if err != nil || f != math.Trunc(f) || f < 0 {
		return -1
	}
	return int64(min(f, math.MaxInt64/2))
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

// MaxOutput is the most tokens the request may make the engine generate on
// route path: bound times Choices when bound is not nil (the bound that
// Rewrite makes the body's only one), else the largest of the route's
// bounds the request sets, times Choices; ok is false when it sets none of
// them (the engine's context is then the only bound), or a bound or
// Choices is not a whole number.
func (r Request) MaxOutput(path string, bound *OutputCap) (n int64, ok bool) {
	if r.Choices < 1 {
		return 0, false
	}
	if bound != nil {
		return satMul(bound.N, r.Choices), true
	}
	params := OutputParams(path)
	for _, c := range r.OutputCaps {
		if !slices.Contains(params, c.Param) {
			continue
		}
		if c.N < 0 {
			return 0, false
		}
		n, ok = max(n, c.N), true
	}
	if !ok {
		return 0, false
	}
	return satMul(n, r.Choices), true
}

// satMul is a×b for a, b ≥ 0, saturated at math.MaxInt64/2.
func satMul(a, b int64) int64 {
	if b != 0 && a > math.MaxInt64/2/b {
		return math.MaxInt64 / 2
	}
	return a * b
}
