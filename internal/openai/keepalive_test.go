package openai

import (
	"errors"
	"testing"
	"time"
)

// keep_alive reads as Ollama reads it: a number of seconds or a duration
// string, negative as -1; null is none; anything else is a 400 naming it.
func TestParseRequestKeepAlive(t *testing.T) {
	for v, want := range map[string]time.Duration{
		`0`:          0,
		`300`:        300 * time.Second,
		`1.5`:        1500 * time.Millisecond,
		`-1`:         -1,
		`-0.5`:       -1,
		`"10m"`:      10 * time.Minute,
		`"0s"`:       0,
		`"-1m"`:      -1,
		`1e300`:      1<<63 - 1,
		`"1h30m"`:    90 * time.Minute,
		`"10\u006d"`: 10 * time.Minute,
	} {
		r, err := parseRequest([]byte(`{"model":"m","keep_alive":` + v + `}`))
		if err != nil || !r.HasKeepAlive || r.KeepAlive != want {
			t.Errorf("keep_alive %s: %v (set %v), %v; want %v", v, r.KeepAlive, r.HasKeepAlive, err, want)
		}
	}
	for _, body := range []string{`{"model":"m","keep_alive":null}`, `{"model":"m"}`} {
		if r, err := parseRequest([]byte(body)); err != nil || r.HasKeepAlive {
			t.Errorf("%s: set %v, %v; want none", body, r.HasKeepAlive, err)
		}
	}
	for _, v := range []string{`"forever"`, `true`, `{}`, `[]`, `"300"`, `""`} {
		_, err := parseRequest([]byte(`{"model":"m","keep_alive":` + v + `}`))
		if errParam(err) != "keep_alive" || !errors.Is(err, errBadBody) {
			t.Errorf("keep_alive %s: %v, want a 400 naming keep_alive", v, err)
		}
	}
}

// DropKeepAlive removes the member and one comma beside it, wherever it
// lies, also next to removed output bounds; the rest is kept byte for byte.
func TestRewriteDropKeepAlive(t *testing.T) {
	bound := &OutputCap{Param: "max_tokens", N: 7}
	for _, tt := range []struct {
		body, want string
		bound      *OutputCap
	}{
		{`{"model":"m","keep_alive":"5m"}`, `{"model":"m"}`, nil},
		{`{"keep_alive":0, "model":"m"}`, `{"model":"m"}`, nil},
		{`{"model":"m" , "keep_alive" : -1 , "n":1}`, `{"model":"m"  , "n":1}`, nil},
		{`{"model":"m","keep_alive":null}`, `{"model":"m"}`, nil},
		{`{"model":"m","max_tokens":9,"keep_alive":0,"max_completion_tokens":3}`, `{"max_tokens":7,"model":"m"}`, bound},
		{`{"keep_alive":0,"max_tokens":9,"model":"m"}`, `{"max_tokens":7,"model":"m"}`, bound},
		{`{"model":"m","n":1}`, `{"model":"m","n":1}`, nil},
	} {
		got := Rewrite([]byte(tt.body), mustParse(t, tt.body), Changes{DropKeepAlive: true, Bound: tt.bound})
		if string(got) != tt.want {
			t.Errorf("%s:\n got %s\nwant %s", tt.body, got, tt.want)
		}
	}
	body := `{"model":"m","keep_alive":0}`
	if got := Rewrite([]byte(body), mustParse(t, body), Changes{}); string(got) != body {
		t.Errorf("without DropKeepAlive: %s", got)
	}
}
