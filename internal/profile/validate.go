package profile

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"
)

// MaxNameLen is the longest profile id or alias, in bytes.
const MaxNameLen = 256

// validate returns every problem in c, grouped by top-level section in the order the
// sections appear in the file (order lists the top-level keys as written), and in
// field order within each element.
func (c *Config) validate(order []string) []error {
	// Resolve names first: pool defaults refer to profiles and profiles to pools.
	poolNames := make(map[string]bool, len(c.Pools))
	for _, p := range c.Pools {
		if p.Name != "" {
			poolNames[p.Name] = true
		}
	}
	byName := make(map[string]int) // id or alias → index of the first profile claiming it
	for i, p := range c.Profiles {
		for _, n := range p.names() {
			if _, ok := byName[n]; !ok && n != "" {
				byName[n] = i
			}
		}
	}

	sections := map[string][]error{
		"pools":    c.validatePools(byName),
		"defaults": c.Defaults.validate(),
		"profiles": c.validateProfiles(poolNames, byName),
	}
	var errs []error
	for _, k := range append(order, "pools", "defaults", "profiles") {
		errs = append(errs, sections[k]...)
		delete(sections, k)
	}
	return errs
}

func (c *Config) validatePools(byName map[string]int) []error {
	var v checker
	if len(c.Pools) == 0 {
		v.add("pools", "at least one pool is required")
	}
	gpuPool := make(map[int]int) // GPU index → index of the first pool holding it
	for i, p := range c.Pools {
		v.path = elem("pools", i, p.Name)
		switch {
		case p.Name == "":
			v.add("name", "required")
		case !validPoolName(p.Name):
			v.add(fmt.Sprintf("name %q", p.Name), "must match [A-Za-z0-9._-]+")
		case p.Name == "." || p.Name == "..":
			v.add(fmt.Sprintf("name %q", p.Name), "must not be a dot-segment (it is a URL path segment)")
		case slices.ContainsFunc(c.Pools[:i], func(q *PoolSpec) bool { return q.Name == p.Name }):
			v.add("", "duplicate pool name")
		}

		if len(p.GPUs) == 0 {
			v.add("gpus", "at least one GPU is required")
		}
		for j, g := range p.GPUs {
			f := fmt.Sprintf("gpus[%d]", j)
			if g < 0 {
				v.add(f, "%d is negative", g)
				continue
			}
			owner, ok := gpuPool[g]
			switch {
			case !ok:
				gpuPool[g] = i
			case owner == i:
				v.add(f, "GPU %d is listed twice", g)
			case c.Pools[owner].Name == "":
				v.add(f, "GPU %d is already in pools[%d]", g, owner)
			default:
				v.add(f, "GPU %d is already in pool %q", g, c.Pools[owner].Name)
			}
		}

		if p.Default != "" {
			f := fmt.Sprintf("default %q", p.Default)
			if j, ok := byName[p.Default]; !ok {
				v.add(f, "no such profile")
			} else if q := c.Profiles[j]; !q.EligibleOn(p.Name) {
				v.add(f, "profile %q is not eligible on this pool", q.ID)
			}
		}
		v.duration("minResidency", p.MinResidency)
		v.nonNegative("maxQueue", int64(p.MaxQueue))
		v.duration("maxQueueWait", p.MaxQueueWait)
		v.nonNegative("maxSleeping", int64(p.MaxSleeping))
	}
	return v.errs
}

func (d *Defaults) validate() []error {
	v := checker{path: "defaults"}
	v.duration("startupTimeout", d.StartupTimeout)
	v.duration("stopTimeout", d.StopTimeout)
	v.env(d.Env)
	v.passEnv(d.PassEnv)
	v.duration("minResidency", d.MinResidency)
	v.nonNegative("maxQueue", int64(d.MaxQueue))
	v.duration("maxQueueWait", d.MaxQueueWait)
	v.duration("idleTimeout", d.IdleTimeout)
	v.duration("maxKeepAlive", d.MaxKeepAlive)
	v.nonNegative("sleepMemoryBudget", d.SleepMemoryBudget)
	return v.errs
}

func (c *Config) validateProfiles(poolNames map[string]bool, byName map[string]int) []error {
	var v checker
	for i, p := range c.Profiles {
		v.path = elem("profiles", i, p.ID)
		// name claims a name for profile i, reporting it when invalid or taken.
		name := func(f, n, empty string) {
			if n == "" {
				v.add(f, "%s", empty)
				return
			}
			f = fmt.Sprintf("%s %q", f, n)
			if msg := nameProblem(n); msg != "" {
				v.add(f, "%s", msg)
			}
			if j := byName[n]; j != i {
				v.add(f, "name already used by %s", elem("profiles", j, c.Profiles[j].ID))
			}
		}
		name("id", p.ID, "required")
		for j, a := range p.Aliases {
			f := fmt.Sprintf("aliases[%d]", j)
			// The alias may repeat this profile's id or an earlier alias of its own.
			if a != "" && (a == p.ID || slices.Contains(p.Aliases[:j], a)) {
				v.add(fmt.Sprintf("%s %q", f, a), "name already used by %s", v.path)
				continue
			}
			name(f, a, "must not be empty")
		}

		if p.Model == "" && p.Command == nil {
			v.add("model", "required unless command is set")
		}
		for j, pool := range p.Pools {
			if !poolNames[pool] {
				v.add(fmt.Sprintf("pools[%d] %q", j, pool), "no such pool")
			}
		}
		v.nonNegative("maxModelLen", int64(p.MaxModelLen))
		v.nonNegative("maxInFlight", int64(p.MaxInFlight))
		v.env(p.Env)
		v.passEnv(p.PassEnv)
		if p.Command != nil {
			switch {
			case len(p.Command) == 0:
				v.add("command", "must not be empty")
			case p.Command[0] == "":
				v.add("command[0]", "must not be empty")
			case !slices.ContainsFunc(p.Command, func(a string) bool { return strings.Contains(a, "{port}") }):
				v.add("command", "no argument contains {port}")
			}
		}
		v.duration("startupTimeout", p.StartupTimeout)
		v.duration("stopTimeout", p.StopTimeout)
		v.duration("minResidency", p.MinResidency)
		v.duration("maxQueueWait", p.MaxQueueWait)
		v.duration("idleTimeout", p.IdleTimeout)
		v.duration("maxKeepAlive", p.MaxKeepAlive)
		if p.Sleep != nil && p.Sleep.Level != 1 && p.Sleep.Level != 2 {
			v.add("sleep: level", "must be 1 or 2, not %d", p.Sleep.Level)
		}
		v.nonNegative("weightBytes", p.WeightBytes)
	}
	return v.errs
}

// A checker collects errors for the element at path.
type checker struct {
	path string
	errs []error
}

// add records "path: field: msg"; an empty field names the element itself.
func (v *checker) add(field, format string, args ...any) {
	v.errs = append(v.errs, at(join(v.path, field), format, args...))
}

func (v *checker) duration(field string, d Duration) {
	if msg := d.problem(field == "minResidency" || field == "idleTimeout"); msg != "" {
		v.add(field, "%s", msg)
	}
}

func (v *checker) nonNegative(field string, n int64) {
	if n < 0 {
		v.add(field, "%d is negative", n)
	}
}

// env checks the keys of an environment, in sorted order.
func (v *checker) env(env map[string]string) {
	for _, k := range slices.Sorted(maps.Keys(env)) {
		switch {
		case k == "":
			v.add("env", "empty key")
		case strings.Contains(k, "="):
			v.add("env", "key %q contains \"=\"", k)
		}
	}
}

// passEnv checks the names of inherited variables: each a plain variable
// name, listed once, and none of poold's own (POOLD_*), which may hold its
// secrets.
func (v *checker) passEnv(names []string) {
	for i, n := range names {
		f := fmt.Sprintf("passEnv[%d] %q", i, n)
		switch {
		case !validEnvName(n):
			v.add(f, "not a variable name ([A-Za-z_][A-Za-z0-9_]*)")
		case strings.HasPrefix(strings.ToUpper(n), "POOLD_"):
			v.add(f, "poold's own variables are never passed to engines")
		case slices.Contains(names[:i], n):
			v.add(f, "listed twice")
		}
	}
}

// validEnvName reports whether n is a portable environment variable name.
func validEnvName(n string) bool {
	for i := 0; i < len(n); i++ {
		switch b := n[i]; {
		case 'a' <= b && b <= 'z', 'A' <= b && b <= 'Z', b == '_', i > 0 && '0' <= b && b <= '9':
		default:
			return false
		}
	}
	return n != ""
}

// names returns the profile's id followed by its aliases.
func (p *Profile) names() []string {
	return append([]string{p.ID}, p.Aliases...)
}

// nameProblem says why n cannot be a profile id or alias, or returns "".
func nameProblem(n string) string {
	if len(n) > MaxNameLen {
		return fmt.Sprintf("longer than %d bytes", MaxNameLen)
	}
	if !utf8.ValidString(n) {
		return "not valid UTF-8"
	}
	if strings.ContainsFunc(n, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }) {
		return "contains whitespace or control characters"
	}
	return ""
}

func validPoolName(n string) bool {
	for i := 0; i < len(n); i++ {
		switch b := n[i]; {
		case 'a' <= b && b <= 'z', 'A' <= b && b <= 'Z', '0' <= b && b <= '9', b == '.', b == '_', b == '-':
		default:
			return false
		}
	}
	return n != ""
}
