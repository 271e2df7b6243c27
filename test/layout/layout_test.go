// Package layout checks the package map of docs/architecture.md: which of
// our packages each package may import, and what fleetd's binary links.
package layout

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/poold/poold/"

// allowed lists, for each package, the packages of this module it may
// import (as in docs/architecture.md's table). A package missing from the
// table fails the test: a new package gets a row here and there.
var allowed = map[string][]string{
	"internal/statusapi":    nil,
	"internal/openai":       nil,
	"internal/upstream":     nil,
	"internal/watch":        nil,
	"internal/placement":    nil,
	"internal/profile":      nil,
	"internal/enginesim":    {"internal/simgpu"},
	"internal/simgpu":       nil,
	"internal/cli":          nil,
	"internal/logqueue":     nil,
	"internal/headerbudget": nil,
	"internal/rdb":          {"internal/tenant"},
	"internal/rdb/rdbtest":  nil,
	"internal/tenant":       {"internal/openai"},
	"internal/gpu":          {"internal/statusapi", "internal/simgpu"},
	"internal/shim":         nil,
	"internal/record":       nil,
	"internal/activity":     nil,
	"internal/engine":       {"internal/statusapi", "internal/shim"},
	"internal/pool":         {"internal/profile", "internal/placement", "internal/statusapi", "internal/shim", "internal/engine", "internal/activity"},
	"internal/metrics":      {"internal/pool", "internal/statusapi", "internal/profile", "internal/record"},
	"internal/proxy":        {"internal/openai", "internal/upstream", "internal/statusapi", "internal/pool", "internal/profile", "internal/metrics", "internal/tenant", "internal/record", "internal/pipeline"},
	"internal/fleet":        {"internal/openai", "internal/upstream", "internal/statusapi", "internal/placement", "internal/tenant", "internal/pipeline", "internal/record"},
	"internal/pipeline":     {"internal/openai", "internal/tenant"},
	"internal/usage":        {"internal/record", "internal/activity", "internal/statusapi", "internal/openai"},
	"internal/pgtest":       nil,
	"internal/enginestats":  {"internal/statusapi"},
}

type pkg struct {
	ImportPath string
	Dir        string
	GoFiles    []string
	Imports    []string
	Deps       []string
}

func list(t *testing.T, args ...string) []pkg {
	t.Helper()
	out, err := exec.Command("go", append([]string{"list", "-json"}, args...)...).Output()
	if err != nil {
		t.Fatalf("go list %v: %v", args, err)
	}
	var pkgs []pkg
	dec := json.NewDecoder(strings.NewReader(string(out)))
	for dec.More() {
		var p pkg
		if err := dec.Decode(&p); err != nil {
			t.Fatal(err)
		}
		pkgs = append(pkgs, p)
	}
	return pkgs
}

func TestImports(t *testing.T) {
	for _, p := range list(t, "../../internal/...") {
		name := strings.TrimPrefix(p.ImportPath, module)
		ok, known := allowed[name]
		if !known {
			t.Errorf("%s is not in the package map (docs/architecture.md and this test)", name)
			continue
		}
		for _, imp := range p.Imports {
			if dep, ours := strings.CutPrefix(imp, module); ours && !slices.Contains(ok, dep) {
				t.Errorf("%s imports %s, which the package map does not allow", name, dep)
			}
		}
	}
}

// fleetd links none of poold's own packages (its pools and engines, their
// metrics, GPUs and usage, its HTTP handler), nor NVML.
func TestFleetdDependencies(t *testing.T) {
	pkgs := list(t, "../../cmd/fleetd")
	if len(pkgs) != 1 {
		t.Fatalf("go list gave %d packages", len(pkgs))
	}
	for _, dep := range pkgs[0].Deps {
		for _, banned := range []string{module + "internal/pool", module + "internal/metrics", module + "internal/gpu", module + "internal/proxy",
			module + "internal/profile", module + "internal/shim", module + "internal/enginestats", module + "internal/enginesim", module + "internal/simgpu",
			module + "internal/usage", module + "internal/activity", "github.com/NVIDIA/go-nvml"} {
			if dep == banned || strings.HasPrefix(dep, banned+"/") {
				t.Errorf("fleetd depends on %s", dep)
			}
		}
	}
}

// The pool package links no command-line or settings parsing (cmd/poold
// parses the engine shim's flags, and its own settings).
func TestPoolDependencies(t *testing.T) {
	pkgs := list(t, "../../internal/pool")
	if len(pkgs) != 1 {
		t.Fatalf("go list gave %d packages", len(pkgs))
	}
	for _, dep := range pkgs[0].Deps {
		for _, banned := range []string{"github.com/spf13/viper", "github.com/spf13/pflag", "go.yaml.in/yaml", "gopkg.in/yaml", module + "internal/cli"} {
			if dep == banned || strings.HasPrefix(dep, banned+"/") {
				t.Errorf("internal/pool depends on %s", dep)
			}
		}
	}
}

// maxLines bounds a source file of the product (tests and the simulator,
// which mirrors vLLM's own sprawl, aside): past it, a file holds more than
// one thing, and its parts get files named for them.
const maxLines = 600

func TestFileSizes(t *testing.T) {
	checked := 0
	for _, p := range list(t, module+"...") {
		if strings.HasPrefix(p.ImportPath, module+"internal/enginesim") {
			continue
		}
		for _, f := range p.GoFiles {
			b, err := os.ReadFile(filepath.Join(p.Dir, f))
			if err != nil {
				t.Fatal(err)
			}
			checked++
			if n := bytes.Count(b, []byte("\n")); n > maxLines {
				t.Errorf("%s/%s: %d lines, over %d", strings.TrimPrefix(p.ImportPath, module), f, n, maxLines)
			}
		}
	}
	if checked < 50 {
		t.Fatalf("only %d files checked: the listing lost them", checked)
	}
}
