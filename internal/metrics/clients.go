package metrics

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"sort"
	"strings"
)

// OtherClient is the class of every request no configured class claims.
const OtherClient = "other"

// MaxClientClasses bounds the number of configured classes, and so the
// cardinality of every metric's client label (plus OtherClient).
const MaxClientClasses = 64

// ClientConfig is the settings file's `clients` section: named classes, each
// claiming a set of API keys, and optionally a header whose value names a
// class directly. The zero value has no classes: every request is "other".
type ClientConfig struct {
	// Header, when set, is a request header (such as X-Client) whose value, when
	// it is exactly one of the class names, is the request's class. A key match
	// takes precedence.
	Header string
	// Classes maps a class name to what it claims.
	Classes map[string]ClientClass
}

// ClientClass is what one class claims.
type ClientClass struct {
	// Keys are API keys, sent as "Authorization: Bearer KEY" or "x-api-key: KEY",
	// each written either as the key itself or as "sha256:" followed by the hex
	// SHA-256 of the key (so the settings file need not hold it).
	Keys []string
}

// Clients classifies requests into the configured classes. Only SHA-256 hashes
// of the keys are kept. A nil *Clients classifies everything as "other". It is
// immutable and safe for concurrent use.
type Clients struct {
	header string
	byKey  map[[sha256.Size]byte]string
	names  map[string]bool
}

var classNameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9_.-]{0,62}$`)

// NewClients validates cfg and builds the classifier. Its errors name the
// offending class and key index, never a key.
func NewClients(cfg ClientConfig) (*Clients, error) {
	c := &Clients{header: http.CanonicalHeaderKey(strings.TrimSpace(cfg.Header)), byKey: make(map[[sha256.Size]byte]string), names: make(map[string]bool)}
	var errs []error
	if len(cfg.Classes) > MaxClientClasses {
		errs = append(errs, fmt.Errorf("clients.classes: %d classes, at most %d are allowed", len(cfg.Classes), MaxClientClasses))
	}
	names := make([]string, 0, len(cfg.Classes))
	for name := range cfg.Classes {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		if !classNameRE.MatchString(name) || name == OtherClient {
			errs = append(errs, fmt.Errorf("clients.classes.%s: a class name is 1-63 of [a-z0-9_.-], starting with a letter or digit, and not %q", name, OtherClient))
			continue
		}
		c.names[name] = true
		for i, key := range cfg.Classes[name].Keys {
			sum, err := keyHash(key)
			if err != nil {
				errs = append(errs, fmt.Errorf("clients.classes.%s.keys[%d]: %w", name, i, err))
				continue
			}
			if other, dup := c.byKey[sum]; dup {
				errs = append(errs, fmt.Errorf("clients.classes.%s.keys[%d]: the same key is already in class %q", name, i, other))
				continue
			}
			c.byKey[sum] = name
		}
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return c, nil
}

func keyHash(key string) ([sha256.Size]byte, error) {
	var sum [sha256.Size]byte
	if h, ok := strings.CutPrefix(key, "sha256:"); ok {
		b, err := hex.DecodeString(h)
		if err != nil || len(b) != sha256.Size {
			return sum, errors.New("sha256: must be followed by 64 hex digits")
		}
		copy(sum[:], b)
		return sum, nil
	}
	if key == "" {
		return sum, errors.New("empty key")
	}
	return sha256.Sum256([]byte(key)), nil
}

// Classify returns the class of a request with header h: the class of its API
// key, else the class its configured header names, else "other".
func (c *Clients) Classify(h http.Header) string {
	if c == nil {
		return OtherClient
	}
	if len(c.byKey) > 0 {
		key := h.Get("X-Api-Key")
		if auth := h.Get("Authorization"); len(auth) > 7 && strings.EqualFold(auth[:7], "bearer ") {
			key = strings.TrimSpace(auth[7:])
		}
		if key != "" {
			if name, ok := c.byKey[sha256.Sum256([]byte(key))]; ok {
				return name
			}
		}
	}
	if c.header != "" {
		if v := h.Get(c.header); c.names[v] {
			return v
		}
	}
	return OtherClient
}
