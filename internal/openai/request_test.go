package openai

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
)

func TestParseRequestValid(t *testing.T) {
	tests := []struct {
		name         string
		body         string
		model        string
		stream       bool
		hasOpts      bool
		includeUsage bool
	}{
		{"model only", `{"model":"m"}`, "m", false, false, false},
		{"surrounding whitespace", " \n\t{ \"model\" : \"m\" }\r\n ", "m", false, false, false},
		{"escaped model", `{"model":"caf\u00e9\/x"}`, "café/x", false, false, false},
		{"stream true", `{"model":"m","stream":true}`, "m", true, false, false},
		{"stream false", `{"model":"m","stream":false}`, "m", false, false, false},
		{"stream null", `{"model":"m","stream":null}`, "m", false, false, false},
		{"include_usage true", `{"model":"m","stream":true,"stream_options":{"include_usage":true}}`, "m", true, true, true},
		{"include_usage false", `{"model":"m","stream":true,"stream_options":{"include_usage":false}}`, "m", true, true, false},
		{"include_usage absent", `{"model":"m","stream":true,"stream_options":{"continuous_usage_stats":true}}`, "m", true, true, true},
		{"include_usage null", `{"model":"m","stream":true,"stream_options":{"include_usage":null}}`, "m", true, true, false},
		{"stream_options null", `{"model":"m","stream":true,"stream_options":null}`, "m", true, true, false},
		{"stream_options empty", `{"model":"m","stream":true,"stream_options":{}}`, "m", true, true, true},
		{"options before model", `{"stream_options":{"include_usage":true},"stream":true,"model":"m"}`, "m", true, true, true},
		{"nested model ignored", `{"messages":[{"model":"inner"}],"metadata":{"model":"x"},"model":"m"}`, "m", false, false, false},
		{"other members", `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":5,"temperature":0.5,"x":null}`, "m", false, false, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := parseRequest([]byte(tt.body))
			if err != nil {
				t.Fatalf("parseRequest: %v", err)
			}
			if r.Model != tt.model || r.Stream != tt.stream || r.IncludeUsage != tt.includeUsage || r.opts.empty() == tt.hasOpts {
				t.Fatalf("got model=%q stream=%v includeUsage=%v hasOpts=%v; want %q %v %v %v",
					r.Model, r.Stream, r.IncludeUsage, !r.opts.empty(), tt.model, tt.stream, tt.includeUsage, tt.hasOpts)
			}
			// The spans cover exactly the values' bytes.
			var model string
			if err := json.Unmarshal([]byte(tt.body[r.modelSpan.from:r.modelSpan.to]), &model); err != nil || model != tt.model {
				t.Errorf("model span %v = %q (%v)", r.modelSpan, tt.body[r.modelSpan.from:r.modelSpan.to], err)
			}
			if !r.opts.empty() {
				raw := tt.body[r.opts.from:r.opts.to]
				if !json.Valid([]byte(raw)) || raw != string(bytes.TrimSpace([]byte(raw))) {
					t.Errorf("opts span %v = %q", r.opts, raw)
				}
			}
		})
	}
}

// An ambiguous model is refused with a 400 whose param names the key as
// written.
func TestParseRequestAmbiguousModel(t *testing.T) {
	for body, param := range map[string]string{
		`{"model":"llmd-alias","MODEL":"evil"}`: "MODEL",
		`{"Model":"evil","model":"m"}`:          "Model",
		`{"model":"a","model":"b"}`:             "model",
	} {
		_, err := parseRequest([]byte(body))
		if got := errParam(err); got != param || !strings.Contains(err.Error(), strconv.Quote(param)) {
			t.Errorf("%s: error %v with param %q, want param %q named in the message", body, err, got, param)
		}
	}
}

// Every key poold decides on (the model, the stream flag and its options,
// the output bounds and the sequence counts) is refused with a 400 naming
// it when it appears twice, or in another case that a case-insensitive
// decoder (Go's, as in llm-d-inference-sim) reads as the same key: poold and
// the engine must read one request. Values of the copies do not matter.
func TestParseRequestAmbiguousKeys(t *testing.T) {
	values := map[string]string{"stream": "true", "stream_options": `{"include_usage":false}`, "n": "2", "best_of": "2"}
	// variants are case variants of k: as written in a body, and decoded.
	variants := func(k string) map[string]string {
		vs := map[string]string{strings.ToUpper(k): strings.ToUpper(k), strings.ToUpper(k[:1]) + k[1:]: strings.ToUpper(k[:1]) + k[1:]}
		if i := strings.IndexByte(k, 's'); i >= 0 {
			vs[k[:i]+"ſ"+k[i+1:]] = k[:i] + "ſ" + k[i+1:] // U+017F folds to s
		}
		if i := strings.IndexByte(k, 'k'); i >= 0 {
			vs[k[:i]+`\u212a`+k[i+1:]] = k[:i] + "\u212a" + k[i+1:] // the Kelvin sign folds to k
		}
		return vs
	}
	for _, k := range requestKeys {
		v := cmp.Or(values[k], "100")
		base := `"model":"m"`
		if k == "model" {
			v, base = `"m"`, `"x":1`
		}
		bodies := map[string]string{
			fmt.Sprintf(`{%s,"%s":%s,"%s":%s}`, base, k, v, k, v): k,
			fmt.Sprintf(`{%s,"%s":null,"%s":%s}`, base, k, k, v):  k,
			fmt.Sprintf(`{"%s":%s,%s,"%s":%s}`, k, v, base, k, v): k,
		}
		for written, decoded := range variants(k) {
			bodies[fmt.Sprintf(`{%s,"%s":%s,"%s":%s}`, base, k, v, written, v)] = decoded
			bodies[fmt.Sprintf(`{"%s":%s,%s,"%s":%s}`, written, v, base, k, v)] = decoded
			bodies[fmt.Sprintf(`{%s,"%s":%s}`, base, written, v)] = decoded
		}
		for body, param := range bodies {
			if !json.Valid([]byte(body)) {
				t.Fatalf("test body %s is not JSON", body)
			}
			_, err := parseRequest([]byte(body))
			if got := errParam(err); err == nil || got != param || !errors.Is(err, errBadBody) {
				t.Errorf("%s: error %v with param %q, want a 400 naming %q", body, err, got, param)
			}
		}
	}
	for body, param := range map[string]string{
		`{"model":"m","stream":true,"stream_options":{"include_usage":true,"Include_Usage":false}}`:                   "Include_Usage",
		`{"model":"m","stream":true,"stream_options":{"include_usage":true,"include_usage":false}}`:                   "include_usage",
		`{"model":"m","stream":true,"stream_options":{"INCLUDE_USAGE":false}}`:                                        "INCLUDE_USAGE",
		`{"model":"m","stream":true,"stream_options":{"continuous_usage_stats":true,"continuous_usage_stats":false}}`: "continuous_usage_stats",
	} {
		if _, err := parseRequest([]byte(body)); errParam(err) != param {
			t.Errorf("%s: error %v, want a 400 naming %q", body, err, param)
		}
	}
	// Keys that only resemble them, and the same keys nested, are the
	// engine's to judge.
	for _, body := range []string{
		`{"model":"m","max_tokens_x":1,"nn":2,"streams":true,"Max_Token":3}`,
		`{"model":"m","messages":[{"role":"user","content":"x","max_tokens":1,"MAX_TOKENS":2}],"metadata":{"n":1,"N":2}}`,
		`{"model":"m","stream_options":{"include_usage":true,"other":1,"Other":2}}`,
	} {
		if _, err := parseRequest([]byte(body)); err != nil {
			t.Errorf("%s: %v", body, err)
		}
	}
}

// n and best_of set Choices, the larger of them; null is unset; a value
// that is not a whole number of at least 1 makes it -1, naming the key.
func TestParseRequestChoices(t *testing.T) {
	for body, want := range map[string]struct {
		n     int64
		param string
	}{
		`{"model":"m"}`:                     {1, ""},
		`{"model":"m","n":3}`:               {3, "n"},
		`{"model":"m","n":"4"}`:             {4, "n"},
		`{"model":"m","n":2,"best_of":5}`:   {5, "best_of"},
		`{"model":"m","best_of":2,"n":5}`:   {5, "n"},
		`{"model":"m","n":null}`:            {1, ""},
		`{"model":"m","n":0}`:               {-1, "n"},
		`{"model":"m","n":1.5,"best_of":9}`: {-1, "n"},
		`{"model":"m","best_of":[1]}`:       {-1, "best_of"},
	} {
		r, err := parseRequest([]byte(body))
		if err != nil || r.Choices != want.n || r.ChoicesParam != want.param {
			t.Errorf("%s: Choices %d (%q), err %v; want %d (%q)", body, r.Choices, r.ChoicesParam, err, want.n, want.param)
		}
	}
}

func TestParseRequestSpansWithWhitespace(t *testing.T) {
	body := "{ \"n\" : 12 , \"model\" :\n \"m\"\t, \"stream_options\" : {\"include_usage\" : false} \n, \"k\": 1e3 }"
	r, err := parseRequest([]byte(body))
	if err != nil {
		t.Fatal(err)
	}
	if got := body[r.modelSpan.from:r.modelSpan.to]; got != `"m"` {
		t.Errorf("model span = %q", got)
	}
	if got := body[r.opts.from:r.opts.to]; got != `{"include_usage" : false}` {
		t.Errorf("opts span = %q", got)
	}
}

func TestParseRequestErrors(t *testing.T) {
	tests := []struct{ name, body string }{
		{"empty", ``},
		{"whitespace", " \n\t\r "},
		{"array", `[{"model":"m"}]`},
		{"string", `"model"`},
		{"number", `5`},
		{"null", `null`},
		{"malformed", `{"model":"m"`},
		{"malformed value", `{"model":"m","x":tru}`},
		{"missing colon", `{"model" "m"}`},
		{"missing comma", `{"model":"m" "x":1}`},
		{"trailing comma", `{"model":"m",}`},
		{"unquoted key", `{model:"m"}`},
		{"trailing garbage", `{"model":"m"} x`},
		{"trailing object", `{"model":"m"}{}`},
		{"trailing bracket", `{"model":"m"}]`},
		{"model number", `{"model": 5}`},
		{"model object", `{"model":{"id":"m"}}`},
		{"model null", `{"model":null}`},
		{"missing model", `{"stream":true}`},
		{"empty object", `{}`},
		{"empty model", `{"model":""}`},
		{"stream string", `{"model":"m","stream":"yes"}`},
		{"stream number", `{"model":"m","stream":1}`},
		{"stream_options number", `{"model":"m","stream_options":3}`},
		{"stream_options array", `{"model":"m","stream_options":[]}`},
		{"include_usage string", `{"model":"m","stream_options":{"include_usage":"yes"}}`},
		{"include_usage in other letters", `{"model":"m","stream":true,"stream_options":{"Include_Usage":false}}`},
		{"model case differs", `{"Model":"m"}`},
		{"duplicate model", `{"model":"a","model":"b"}`},
		{"duplicate model, same value", `{"model":"a","model":"a"}`},
		{"duplicate model, escaped", `{"model":"a","mod\u0065l":"b"}`},
		{"upper-case variant", `{"model":"a","MODEL":"b"}`},
		{"case variant first", `{"mOdel":"b","model":"a"}`},
		{"escaped case variant", `{"model":"a","\u004dodel":"b"}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := parseRequest([]byte(tt.body))
			if err == nil {
				t.Fatalf("parseRequest(%q) succeeded", tt.body)
			}
			if !errors.Is(err, errBadBody) {
				t.Fatalf("error %v does not wrap errBadBody", err)
			}
		})
	}
}

// members decodes a JSON object's top level, compacting each value.
func members(t testing.TB, b []byte) map[string]json.RawMessage {
	t.Helper()
	var m map[string]json.RawMessage
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("invalid JSON %q: %v", b, err)
	}
	for k, v := range m {
		var c bytes.Buffer
		if err := json.Compact(&c, v); err != nil {
			t.Fatalf("member %q: %v", k, err)
		}
		m[k] = c.Bytes()
	}
	return m
}

// streamOptions decodes the stream_options member of a rewritten body.
func streamOptions(t testing.TB, b []byte) map[string]json.RawMessage {
	t.Helper()
	var o map[string]json.RawMessage
	raw, ok := members(t, b)["stream_options"]
	if !ok {
		t.Fatalf("no stream_options in %s", b)
	}
	if err := json.Unmarshal(raw, &o); err != nil || o == nil {
		t.Fatalf("stream_options %s is not an object (%v)", raw, err)
	}
	return o
}

func mustParse(t testing.TB, body string) Request {
	t.Helper()
	r, err := parseRequest([]byte(body))
	if err != nil {
		t.Fatalf("parseRequest(%q): %v", body, err)
	}
	return r
}

func TestRewriteModelKeepsBytes(t *testing.T) {
	tests := []struct {
		name, prefix, model, suffix string
	}{
		{"first", `{"model":`, `"alias"`, `,"messages":[{"role":"user","content":"caf\u00e9 \ud83d\ude00 \"q\""}],"stream":false}`},
		{"last", "{\n  \"messages\" : [ {\"content\":\"\\u003chi\\u003e\"} ],\n  \"zeta\":1.50,\n  \"model\" :  ", `"alias"`, "\n}\n"},
		{"middle with tabs", "{\"a\":{\"model\":\"alias\"},\t\"model\":\t", `"alias"`, "\t,\"b\":[1,2,3e0]}"},
		{"escaped alias", `{"x":"\u00e9","model":`, `"\u0061lias"`, `,"y":"\/"}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			body := tt.prefix + tt.model + tt.suffix
			r := mustParse(t, body)
			if r.Model != "alias" {
				t.Fatalf("model = %q", r.Model)
			}
			got := Rewrite([]byte(body), r, Changes{Model: "org/Canonical-1"})
			want := tt.prefix + `"org/Canonical-1"` + tt.suffix
			if string(got) != want {
				t.Fatalf("rewrite:\n got %s\nwant %s", got, want)
			}
		})
	}
}

func TestRewriteUnchanged(t *testing.T) {
	for _, body := range []string{
		`{"model":"id"}`,
		`{"model":"i\u0064","stream":true}`, // same id, differently spelled: left alone
		`{"stream":true,"stream_options":{"continuous_usage_stats":true},"model":"id"}`,
	} {
		b := []byte(body)
		got := Rewrite(b, mustParse(t, body), Changes{Model: "id"})
		if len(got) != len(b) || &got[0] != &b[0] {
			t.Errorf("Rewrite(%s) returned a copy %s, want the body itself", b, got)
		}
	}
}

func TestRewriteInjectAbsent(t *testing.T) {
	for _, body := range []string{
		`{"model":"id","stream":true,"messages":[{"role":"user","content":"hi \u2603"}]}`,
		"  \n{ \"stream\" : true , \"model\":\"id\" , \"n\":2}",
		`{"prompt":"{not a brace}","model":"id","stream":true}`,
	} {
		t.Run("", func(t *testing.T) {
			got := Rewrite([]byte(body), mustParse(t, body), Changes{Model: "id", InjectUsage: true})
			if !json.Valid(got) {
				t.Fatalf("invalid JSON: %s", got)
			}
			o := streamOptions(t, got)
			if string(o["include_usage"]) != "true" || len(o) != 1 {
				t.Errorf("stream_options = %v", o)
			}
			in, out := members(t, []byte(body)), members(t, got)
			delete(out, "stream_options")
			if len(in) != len(out) {
				t.Errorf("members: got %d, want %d", len(out), len(in))
			}
			for k, v := range in {
				if !bytes.Equal(out[k], v) {
					t.Errorf("member %q = %s, want %s", k, out[k], v)
				}
			}
			if r2 := mustParse(t, string(got)); !r2.IncludeUsage || r2.Model != "id" {
				t.Errorf("reparsed: %+v", r2)
			}
		})
	}
}

func TestRewriteInjectExisting(t *testing.T) {
	tests := []struct {
		name string
		opts string
		want map[string]string // stream_options members, compacted
	}{
		{"include_usage false", `{"include_usage":false}`, map[string]string{"include_usage": "true"}},
		{"continuous only", `{"continuous_usage_stats":true}`, map[string]string{"include_usage": "true"}},
		{"continuous and usage", `{ "include_usage" : true, "continuous_usage_stats" : true }`, map[string]string{"include_usage": "true"}},
		{"obfuscation kept", `{"include_usage":false,"include_obfuscation":false,"continuous_usage_stats":true}`,
			map[string]string{"include_usage": "true", "include_obfuscation": "false"}},
		{"null", `null`, map[string]string{"include_usage": "true"}},
		{"empty", `{}`, map[string]string{"include_usage": "true"}},
		{"nested kept", `{"x":{"a":[1, 2]},"include_usage":null}`, map[string]string{"include_usage": "true", "x": `{"a":[1,2]}`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			prefix := "{\"model\":\"id\", \"stream\": true,\n\"stream_options\": "
			suffix := ",\n\"messages\":[{\"content\":\"\\u00e9\"}]}"
			body := prefix + tt.opts + suffix
			got := Rewrite([]byte(body), mustParse(t, body), Changes{Model: "id", InjectUsage: true})
			if !bytes.HasPrefix(got, []byte(prefix)) || !bytes.HasSuffix(got, []byte(suffix)) {
				t.Fatalf("bytes around stream_options changed: %s", got)
			}
			o := streamOptions(t, got)
			if len(o) != len(tt.want) {
				t.Errorf("stream_options = %s", got[len(prefix):len(got)-len(suffix)])
			}
			for k, v := range tt.want {
				var c bytes.Buffer
				_ = json.Compact(&c, o[k])
				if c.String() != v {
					t.Errorf("stream_options.%s = %s, want %s", k, o[k], v)
				}
			}
		})
	}
}

func TestRewriteModelAndOptions(t *testing.T) {
	tests := []struct{ name, body, want string }{
		{"model first, options absent",
			`{"model":"alias","stream":true}`,
			`{"stream_options":{"include_usage":true},"model":"canon","stream":true}`},
		{"model last, options absent",
			`{"stream":true,"model":"alias"}`,
			`{"stream_options":{"include_usage":true},"stream":true,"model":"canon"}`},
		{"model before options",
			`{"model":"alias","stream":true,"stream_options":{"include_usage":false},"n":1}`,
			`{"model":"canon","stream":true,"stream_options":{"include_usage":true},"n":1}`},
		{"options before model",
			`{"stream_options":{"continuous_usage_stats":true},"stream":true,"model":"alias","n":1}`,
			`{"stream_options":{"include_usage":true},"stream":true,"model":"canon","n":1}`},
		{"longer id",
			`{"stream_options":{},"model":"a"}`,
			`{"stream_options":{"include_usage":true},"model":"a-much-longer-canonical-id"}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			id := "canon"
			if tt.name == "longer id" {
				id = "a-much-longer-canonical-id"
			}
			got := Rewrite([]byte(tt.body), mustParse(t, tt.body), Changes{Model: id, InjectUsage: true})
			if string(got) != tt.want {
				t.Fatalf("rewrite:\n got %s\nwant %s", got, tt.want)
			}
		})
	}
}

func FuzzRewrite(f *testing.F) {
	for _, s := range []string{
		`{"model":"m"}`,
		`{"model":"m","stream":true}`,
		`{"stream":true,"stream_options":{"include_usage":false,"continuous_usage_stats":true},"model":"alias"}`,
		`{"model":"canonical-id","stream_options":null,"messages":[{"role":"user","content":"h\u00e9 \ud83d\ude00"}]}`,
		" {\n \"model\" : \"x\" , \"stream_options\" : { \"include_obfuscation\" : true } , \"n\" : 1e2 } ",
		`{"model":"a","model":"b","stream_options":{},"stream_options":{"include_usage":true}}`,
		`{"prompt":"{\"model\":1}","model":"\u0063anonical-id"}`,
		`{"Model":"x","model":"y","MODEL":3}`,
		`{"keep_alive":"5m","model":"m","max_tokens":1}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		r, err := parseRequest(body)
		if err != nil {
			if !errors.Is(err, errBadBody) {
				t.Fatalf("error %v does not wrap errBadBody", err)
			}
			return
		}
		in := append([]byte(nil), body...)
		got := Rewrite(body, r, Changes{Model: "canonical-id", InjectUsage: true, DropKeepAlive: true})
		if !bytes.Equal(body, in) {
			t.Fatalf("rewrite modified its input")
		}
		if !json.Valid(got) {
			t.Fatalf("Rewrite(%q) = %q: invalid JSON", body, got)
		}
		out := members(t, got)
		var model string
		if json.Unmarshal(out["model"], &model) != nil || model != "canonical-id" {
			t.Fatalf("model = %s in %q", out["model"], got)
		}
		o := streamOptions(t, got)
		if string(o["include_usage"]) != "true" {
			t.Fatalf("include_usage = %s in %q", o["include_usage"], got)
		}
		if _, ok := o["continuous_usage_stats"]; ok {
			t.Fatalf("continuous_usage_stats kept in %q", got)
		}
		if _, ok := out["keep_alive"]; ok {
			t.Fatalf("keep_alive kept in %q", got)
		}
		inM := members(t, body)
		for k, v := range inM {
			if k == "model" || k == "stream_options" || k == "keep_alive" {
				continue
			}
			if !bytes.Equal(out[k], v) {
				t.Fatalf("member %q: got %s, want %s (body %q → %q)", k, out[k], v, body, got)
			}
		}
		for k := range out {
			if _, ok := inM[k]; !ok && k != "stream_options" {
				t.Fatalf("new member %q in %q", k, got)
			}
		}
		r2, err := parseRequest(got)
		if err != nil || r2.Model != "canonical-id" || !r2.IncludeUsage || r2.Stream != r.Stream {
			t.Fatalf("reparse of %q: %+v, %v", got, r2, err)
		}
	})
}
