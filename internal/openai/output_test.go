package openai

import (
	"encoding/json"
	"testing"
)

// A Rewrite with a Bound leaves the body exactly one output bound, the one
// given, whatever bounds, nulls and whitespace the body had, and keeps the
// rest byte for byte.
func TestRewriteBound(t *testing.T) {
	bound := &OutputCap{"max_tokens", 7}
	for in, want := range map[string]string{
		`{"model":"m"}`:                                             `{"max_tokens":7,"model":"m"}`,
		" \n{ \"model\":\"m\"}":                                     " \n{\"max_tokens\":7, \"model\":\"m\"}",
		`{"model":"m","max_tokens":null}`:                           `{"max_tokens":7,"model":"m"}`,
		`{"max_tokens":null,"model":"m"}`:                           `{"max_tokens":7,"model":"m"}`,
		`{"max_tokens":1, "max_completion_tokens":2, "model":"m"}`:  `{"max_tokens":7,"model":"m"}`,
		`{"model":"m", "max_tokens":1 , "max_output_tokens":null }`: `{"max_tokens":7,"model":"m"  }`,
		`{"model":"m","max_tokens":1,"x":[1,{"max_tokens":2}],"max_completion_tokens":3,"y":2}`: `{"max_tokens":7,"model":"m","x":[1,{"max_tokens":2}],"y":2}`,
		`{"model":"m","max_tokens":7}`: `{"model":"m","max_tokens":7}`,
	} {
		got := Rewrite([]byte(in), mustParse(t, in), Changes{Bound: bound})
		if string(got) != want || !json.Valid(got) {
			t.Errorf("Rewrite(%q, bound 7) = %q, want %q", in, got, want)
		}
		if r := mustParse(t, string(got)); len(r.OutputCaps) != 1 || r.OutputCaps[0] != *bound {
			t.Errorf("Rewrite(%q, bound 7) has bounds %+v", in, r.OutputCaps)
		}
	}
}

// Output bounds are read as vLLM reads them: numbers, whole floats and
// strings holding numbers; null is no bound; anything else is -1.
func TestOutputCaps(t *testing.T) {
	r, err := parseRequest([]byte(`{"model":"m","max_tokens":12,"max_completion_tokens":"30","max_output_tokens":null,"n":2}`))
	if err != nil {
		t.Fatal(err)
	}
	if len(r.OutputCaps) != 2 || r.OutputCaps[0] != (OutputCap{"max_tokens", 12}) || r.OutputCaps[1] != (OutputCap{"max_completion_tokens", 30}) {
		t.Fatalf("caps %+v", r.OutputCaps)
	}
	for _, v := range []string{`1.5`, `-3`, `"x"`, `[1]`, `true`} {
		r, err := parseRequest([]byte(`{"model":"m","max_tokens":` + v + `}`))
		if err != nil || len(r.OutputCaps) != 1 || r.OutputCaps[0].N != -1 {
			t.Errorf("max_tokens %s: %+v %v", v, r.OutputCaps, err)
		}
	}
	if r, _ := parseRequest([]byte(`{"model":"m","max_tokens":1e3}`)); r.OutputCaps[0].N != 1000 {
		t.Errorf("1e3: %+v", r.OutputCaps)
	}
}
