package engine

import (
	"strings"
	"testing"
)

// changes names what differs between a record and the command line and
// environment of the profile in force, by flag and variable name, never
// a value.
func TestChanges(t *testing.T) {
	base := []string{"vllm", "serve", "--model", "m", "--port", "41000", "--max-model-len", "4096"}
	rec := LedgerEngine{Argv: base, EnvSums: EnvSums([]string{"A=1", "B=2", "HF_TOKEN=secret"})}
	for _, tt := range []struct {
		name        string
		argv, given []string
		want        string
	}{
		{"a value", []string{"vllm", "serve", "--model", "m", "--port", "41000", "--max-model-len", "8192"},
			[]string{"A=1", "B=2", "HF_TOKEN=secret"}, "argument --max-model-len changed"},
		{"flags added and removed", []string{"vllm", "serve", "--model", "m", "--port", "41000", "--enforce-eager", "--seed=3"},
			[]string{"A=1", "B=2", "HF_TOKEN=secret"}, "argument --enforce-eager, --seed added; argument --max-model-len removed"},
		{"the launcher", append([]string{"python", "-m", "vllm.entrypoints.openai.api_server"}, base[2:]...),
			[]string{"A=1", "B=2", "HF_TOKEN=secret"}, "argument -m added; argument #1 removed; argument #0 changed"},
		{"variables", base, []string{"A=1", "C=3", "HF_TOKEN=t0ken"}, "variable C added; variable B removed; variable HF_TOKEN changed"},
		{"nothing told apart", base, []string{"A=1", "B=2", "HF_TOKEN=secret"}, "another command line or environment"},
	} {
		got := changes(rec, tt.argv, tt.given)
		if got != tt.want {
			t.Errorf("%s: changes = %q, want %q", tt.name, got, tt.want)
		}
		if strings.Contains(got, "secret") || strings.Contains(got, "t0ken") {
			t.Errorf("%s: a value shown: %q", tt.name, got)
		}
	}
	if got := changes(LedgerEngine{}, base, nil); got != "another command line or environment" {
		t.Errorf("an older ledger's record: %q", got)
	}
}
