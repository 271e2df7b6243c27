// Package tenant maps API keys to tenants, the teams that share a host or a
// fleet: each tenant's tier (its weight in the fair share), its request and
// token limits, its output cap, the models it may use and the pools whose
// model its pinned requests may swap. The tenants file
// (docs/tenancy.md) is decoded strictly and validated whole; keys are held
// only as SHA-256 hashes.
package tenant

import (
	"bytes"
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Tier is a class of service: its weight in the fair share of a pool, and
// whether its tenants are served only in the background.
type Tier struct {
	// Weight is the tier's share of an engine's slots against other tiers'
	// when all wait: a tenant of weight 10 gets ten slots for another's one.
	Weight int `json:"weight"`
	// Background tenants are served only when no other tenant waits, aged
	// so that they are never starved (see the pool's fair queue).
	Background bool `json:"background,omitempty"`
}

// Tenant is one team: the keys that identify it and what it may do. Zero
// limits mean none.
type Tenant struct {
	Name string `json:"name"`
	// Keys are "sha256:" followed by the hex SHA-256 of each API key.
	Keys []string `json:"keys"`
	Tier string   `json:"tier"`
	// RPM and TPM bound the requests and the tokens (prompt and completion)
	// per minute; zero: no bound.
	RPM int `json:"rpm,omitempty"`
	TPM int `json:"tpm,omitempty"`
	// MaxOutputTokens caps max_tokens: a request asking for more is
	// refused, one asking for nothing gets the cap; zero: no cap.
	MaxOutputTokens int `json:"maxOutputTokens,omitempty"`
	// Models are glob patterns (path.Match) over model ids and aliases; a
	// model matching none does not exist for the tenant. Empty: every model.
	Models []string `json:"models,omitempty"`
	// Pools are glob patterns (path.Match) over pool names: the pools
	// whose model a request of the tenant pinned to the pool
	// (/pools/{pool}/…) may swap out though poold would not place the
	// request there. Empty: none; a pinned request is then served only by
	// a model loaded or loading there, or where poold would place it.
	Pools []string `json:"pools,omitempty"`
	// MaxKeepAlive, a duration ("10m"), bounds the keep_alive the tenant's
	// requests may ask (KeepAlive), so that no tenant pins a GPU; ""
	// means the profile's maxKeepAlive alone bounds it.
	MaxKeepAlive string `json:"maxKeepAlive,omitempty"`

	tier         Tier
	maxKeepAlive time.Duration // MaxKeepAlive parsed; zero: none
}

// Weight is the tenant's weight in the fair share.
func (t *Tenant) Weight() int { return t.tier.Weight }

// KeepAlive is the keep_alive d that a request of the tenant asked (negative:
// as long as allowed) within its MaxKeepAlive: d, or the bound when d is
// beyond it or negative.
func (t *Tenant) KeepAlive(d time.Duration) time.Duration {
	if t.maxKeepAlive > 0 && (d < 0 || d > t.maxKeepAlive) {
		return t.maxKeepAlive
	}
	return d
}

// Background reports whether the tenant is served only in the background.
func (t *Tenant) Background() bool { return t.tier.Background }

// AllowsModel reports whether the tenant may use a model, known by names
// (the name it asked for, the canonical id, …): one name matching one
// pattern is enough.
func (t *Tenant) AllowsModel(names ...string) bool {
	if len(t.Models) == 0 {
		return true
	}
	for _, pat := range t.Models {
		for _, n := range names {
			if ok, _ := path.Match(pat, n); ok {
				return true
			}
		}
	}
	return false
}

// AllowsPool reports whether the tenant's requests pinned to pool may swap
// its model (see Tenant.Pools).
func (t *Tenant) AllowsPool(pool string) bool {
	for _, pat := range t.Pools {
		if ok, _ := path.Match(pat, pool); ok {
			return true
		}
	}
	return false
}

// Config is one decoded and validated tenants file. It is immutable: a
// reload builds another.
type Config struct {
	Tiers   map[string]Tier `json:"tiers"`
	Tenants []*Tenant       `json:"tenants"`

	byKey  map[[sha256.Size]byte]*Tenant
	byName map[string]*Tenant
}

// Lookup returns the tenant whose key was presented, or nil.
func (c *Config) Lookup(key string) *Tenant {
	if c == nil || key == "" {
		return nil
	}
	return c.byKey[sha256.Sum256([]byte(key))]
}

// Tenant returns the tenant called name, or nil.
func (c *Config) Tenant(name string) *Tenant {
	if c == nil {
		return nil
	}
	return c.byName[name]
}

// HashKey returns what the tenants file holds for key: "sha256:" and the
// hex SHA-256 of the key.
func HashKey(key string) string {
	sum := sha256.Sum256([]byte(key))
	return "sha256:" + hex.EncodeToString(sum[:])
}

// Load reads and parses the tenants file at path, returning the raw bytes
// too (for a hash of what was read), even when they do not parse.
func Load(file string) (*Config, []byte, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, nil, fmt.Errorf("reading tenants %q: %w", file, err)
	}
	c, err := Parse(data)
	return c, data, err
}

// namePattern is what a tenant's or a tier's name may be: it becomes a
// metric label and a log field.
var namePattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$`)

// Parse decodes and validates a tenants file. Decoding is strict: unknown
// fields, duplicate keys, values of the wrong type and anything after the
// top-level object are errors. Every problem is reported, joined, each with
// its JSON path (for example `tenants[1] "team-b": tier "gold": no such
// tier`): those of decoding each entry, then those of validating what
// decoded. A key is never shown.
func Parse(data []byte) (*Config, error) {
	var top struct {
		Tiers   map[string]json.RawMessage `json:"tiers"`
		Tenants []json.RawMessage          `json:"tenants"`
	}
	if !json.Valid(data) {
		var v any
		err := json.Unmarshal(data, &v)
		return nil, fmt.Errorf("tenants file: not JSON: %w", cleanErr(err))
	}
	if err := strict(data, &top); err != nil {
		return nil, fmt.Errorf("tenants file: %w", err)
	}
	c := &Config{Tiers: make(map[string]Tier), byKey: make(map[[sha256.Size]byte]*Tenant), byName: make(map[string]*Tenant)}
	var errs []error
	if len(top.Tiers) == 0 {
		errs = append(errs, errors.New("tiers: at least one tier is required"))
	}
	for _, name := range slices.Sorted(maps.Keys(top.Tiers)) {
		var tier Tier
		where := "tiers." + name
		if err := strict(top.Tiers[name], &tier); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", where, err))
			continue
		}
		if !namePattern.MatchString(name) {
			errs = append(errs, fmt.Errorf("%s: a tier name is letters, digits, '.', '_' and '-', at most 63", where))
		}
		if tier.Weight < 1 {
			errs = append(errs, fmt.Errorf("%s: weight: must be at least 1, not %d", where, tier.Weight))
		}
		c.Tiers[name] = tier
	}
	keyOwner := make(map[[sha256.Size]byte]string)
	for i, raw := range top.Tenants {
		t := new(Tenant)
		if err := strict(raw, t); err != nil {
			var named struct{ Name string }
			where := fmt.Sprintf("tenants[%d]", i)
			if json.Unmarshal(raw, &named) == nil && named.Name != "" {
				where += " " + strconv.Quote(named.Name)
			}
			errs = append(errs, fmt.Errorf("%s: %w", where, err))
			continue
		}
		where := fmt.Sprintf("tenants[%d] %s", i, strconv.Quote(t.Name))
		errs = append(errs, c.validate(t, where, keyOwner)...)
		c.Tenants = append(c.Tenants, t)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return c, nil
}

// validate checks one decoded tenant and indexes it, returning its problems.
func (c *Config) validate(t *Tenant, where string, keyOwner map[[sha256.Size]byte]string) []error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(where+": "+format, args...)) }
	switch {
	case !namePattern.MatchString(t.Name):
		bad("name: a tenant's name is letters, digits, '.', '_' and '-', at most 63")
	case c.byName[t.Name] != nil:
		bad("name: another tenant has this name")
	default:
		c.byName[t.Name] = t
	}
	if tier, ok := c.Tiers[t.Tier]; ok {
		t.tier = tier
	} else {
		bad("tier %s: no such tier (tiers: %s)", strconv.Quote(t.Tier), strings.Join(slices.Sorted(maps.Keys(c.Tiers)), ", "))
	}
	if len(t.Keys) == 0 {
		bad("keys: at least one key is required")
	}
	for j, k := range t.Keys {
		h, ok := strings.CutPrefix(k, "sha256:")
		b, err := hex.DecodeString(h)
		if !ok || err != nil || len(b) != sha256.Size {
			// Never echo the entry: it may be a key written in clear.
			bad("keys[%d]: must be sha256: and 64 hex digits (poold hash-key prints it for a key)", j)
			continue
		}
		sum := [sha256.Size]byte(b)
		if other, dup := keyOwner[sum]; dup {
			bad("keys[%d]: the same key as tenant %s", j, strconv.Quote(other))
			continue
		}
		keyOwner[sum] = t.Name
		c.byKey[sum] = t
	}
	for _, f := range []struct {
		name string
		v    int
	}{{"rpm", t.RPM}, {"tpm", t.TPM}, {"maxOutputTokens", t.MaxOutputTokens}} {
		if f.v < 0 {
			bad("%s: must not be negative, not %d", f.name, f.v)
		}
	}
	if t.MaxKeepAlive != "" {
		if d, err := time.ParseDuration(t.MaxKeepAlive); err != nil || d <= 0 {
			bad("maxKeepAlive %s: must be a positive duration such as \"10m\"", strconv.Quote(t.MaxKeepAlive))
		} else {
			t.maxKeepAlive = d
		}
	}
	for _, f := range []struct {
		name string
		pats []string
	}{{"models", t.Models}, {"pools", t.Pools}} {
		for j, pat := range f.pats {
			if _, err := path.Match(pat, ""); err != nil || pat == "" {
				bad("%s[%d] %s: not a glob pattern", f.name, j, strconv.Quote(pat))
			}
		}
	}
	return errs
}

// strict decodes data into v: unknown fields, duplicate keys and trailing
// data are errors.
func strict(data []byte, v any) error {
	if err := noDuplicateKeys(data); err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return cleanErr(err)
	}
	if dec.More() {
		return errors.New("unexpected data after the object")
	}
	return nil
}

// cleanErr rewords encoding/json's errors for people: "json: unknown field"
// becomes "unknown field".
func cleanErr(err error) error {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		return fmt.Errorf("%s: must be %s, not %s", cmp.Or(te.Field, "value"), typeName(te.Type.Kind().String()), te.Value)
	}
	return errors.New(strings.TrimPrefix(err.Error(), "json: "))
}

func typeName(kind string) string {
	switch {
	case strings.HasPrefix(kind, "int"):
		return "a whole number"
	case kind == "slice":
		return "a list"
	case kind == "struct", kind == "map":
		return "an object"
	}
	return "a " + kind
}

// noDuplicateKeys reports an object in data, valid JSON, that has a key
// twice, with its path: the decoder would keep the last in silence.
func noDuplicateKeys(data []byte) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	var walk func(at string) error
	walk = func(at string) error {
		tok, err := dec.Token()
		if err != nil {
			return err
		}
		d, ok := tok.(json.Delim)
		if !ok {
			return nil
		}
		seen := make(map[string]bool)
		for i := 0; dec.More(); i++ {
			kid := fmt.Sprintf("%s[%d]", at, i)
			if d == '{' {
				k, err := dec.Token()
				if err != nil {
					return err
				}
				key := k.(string)
				if seen[key] {
					return fmt.Errorf("%skey %s appears twice", strings.TrimPrefix(at+": ", ": "), strconv.Quote(key))
				}
				seen[key] = true
				kid = strings.TrimPrefix(at+"."+key, ".")
			}
			if err := walk(kid); err != nil {
				return err
			}
		}
		_, err = dec.Token() // the closing delimiter
		return err
	}
	return walk("")
}

// Diff names the tenants that next adds to, removes from and changes in
// prev (nil: no file), each list in file order.
func Diff(prev, next *Config) (added, removed, changed []string) {
	for _, t := range next.all() {
		switch p := prev.Tenant(t.Name); {
		case p == nil:
			added = append(added, t.Name)
		case !p.same(t):
			changed = append(changed, t.Name)
		}
	}
	for _, t := range prev.all() {
		if next.Tenant(t.Name) == nil {
			removed = append(removed, t.Name)
		}
	}
	return added, removed, changed
}

func (c *Config) all() []*Tenant {
	if c == nil {
		return nil
	}
	return c.Tenants
}

// same reports whether t and u hold the same keys, tier, limits, models and
// pools.
func (t *Tenant) same(u *Tenant) bool {
	return slices.Equal(t.Keys, u.Keys) && t.Tier == u.Tier && t.tier == u.tier && t.RPM == u.RPM && t.TPM == u.TPM &&
		t.MaxOutputTokens == u.MaxOutputTokens && slices.Equal(t.Models, u.Models) && slices.Equal(t.Pools, u.Pools)
}
