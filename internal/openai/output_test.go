package openai

import (
	"encoding/json"
	"testing"
)

func TestAddMember(t *testing.T) {
	for in, want := range map[string]string{
		`{"model":"m"}`:         `{"max_tokens":7,"model":"m"}`,
		" \n{ \"model\":\"m\"}": " \n{\"max_tokens\":7, \"model\":\"m\"}",
		`{ }`:                   `{"max_tokens":7 }`,
	} {
		got := AddMember([]byte(in), "max_tokens", 7)
		if string(got) != want || !json.Valid(got) {
			t.Errorf("AddMember(%q) = %q, want %q", in, got, want)
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
