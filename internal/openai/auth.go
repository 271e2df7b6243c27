package openai

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"
)

// APIKeys is optional API-key enforcement for the OpenAI surface. Only the
// SHA-256 of each key is kept, and a presented key is compared against every
// one in constant time. It is immutable and safe for concurrent use; a nil
// *APIKeys enforces nothing.
type APIKeys struct {
	sums [][sha256.Size]byte
}

// NewAPIKeys builds the set from keys, each either the key itself or "sha256:"
// followed by the key's hex SHA-256 (so that files need not hold keys). Blank
// entries are skipped; with no key left it returns nil (no enforcement). Its
// errors name an entry's index, never a key.
func NewAPIKeys(keys []string) (*APIKeys, error) {
	k := &APIKeys{}
	var errs []error
	for i, key := range keys {
		key = strings.TrimSpace(key)
		if key == "" {
			continue
		}
		if h, ok := strings.CutPrefix(key, "sha256:"); ok {
			b, err := hex.DecodeString(h)
			if err != nil || len(b) != sha256.Size {
				errs = append(errs, fmt.Errorf("api key %d: sha256: must be followed by 64 hex digits", i))
				continue
			}
			k.sums = append(k.sums, [sha256.Size]byte(b))
			continue
		}
		k.sums = append(k.sums, sha256.Sum256([]byte(key)))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	if len(k.sums) == 0 {
		return nil, nil
	}
	return k, nil
}

// LoadAPIKeys builds the API-key set from the api-keys list (each entry may hold
// several keys separated by commas) and the api-keys-file (one key per line;
// blank lines and # comments skipped). It returns nil when no key is set.
// Errors never show a key.
func LoadAPIKeys(list []string, file string) (*APIKeys, error) {
	var keys []string
	for _, k := range list {
		keys = append(keys, strings.Split(k, ",")...)
	}
	if file != "" {
		b, err := os.ReadFile(file)
		if err != nil {
			return nil, fmt.Errorf("api-keys-file: %w", err)
		}
		n := len(keys)
		for line := range strings.Lines(string(b)) {
			if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "#") {
				keys = append(keys, line)
			}
		}
		if len(keys) == n {
			return nil, fmt.Errorf("api-keys-file: %q holds no key", file)
		}
	}
	k, err := NewAPIKeys(keys)
	if err != nil {
		return nil, fmt.Errorf("api-keys: %w", err)
	}
	return k, nil
}

// valid reports whether h carries an accepted key, as "Authorization: Bearer
// KEY" or "x-api-key: KEY". Every stored hash is compared, match or not.
func (k *APIKeys) valid(h http.Header) bool {
	key := PresentedKey(h)
	if key == "" {
		return false
	}
	sum := sha256.Sum256([]byte(key))
	ok := 0
	for i := range k.sums {
		ok |= subtle.ConstantTimeCompare(sum[:], k.sums[i][:])
	}
	return ok == 1
}

// PresentedKey is the API key h carries, as "Authorization: Bearer KEY"
// (first) or "x-api-key: KEY"; "" when none.
func PresentedKey(h http.Header) string {
	if auth := h.Get("Authorization"); len(auth) > 7 && strings.EqualFold(auth[:7], "bearer ") {
		return strings.TrimSpace(auth[7:])
	}
	return h.Get("X-Api-Key")
}

// Require wraps next so that every request answers 401 in poold's shape
// (WriteError) without an accepted key, but for the key-free paths
// (KeyFree), which pass through.
func (k *APIKeys) Require(next http.Handler) http.Handler {
	if k == nil {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !KeyFree(r.URL.Path) && !k.valid(r.Header) {
			w.Header().Set("WWW-Authenticate", `Bearer realm="poold"`)
			WriteError(w, r, http.StatusUnauthorized, "invalid_api_key", "", "a valid API key is required: Authorization: Bearer <key> or x-api-key: <key>")
			return
		}
		next.ServeHTTP(w, r)
	})
}

// KeyFree reports whether path is one that the API-key and tenant layers
// let through without a key, for the handler to decide: the operations
// endpoints (/health, /ready, /status, /metrics and /pools/{pool}/metrics),
// which need none, and the paths that check credentials of their own, the
// admin API (/admin/…, behind the admin token) and poold's usage report
// (/usage: the admin token, or a tenant's key for its own usage).
func KeyFree(path string) bool {
	switch path {
	case "/health", "/ready", "/status", "/metrics", "/usage":
		return true
	}
	if strings.HasPrefix(path, "/admin/") {
		return true
	}
	rest, pinned := strings.CutPrefix(path, "/pools/")
	pool, metrics := strings.CutSuffix(rest, "/metrics")
	return pinned && metrics && pool != "" && !strings.Contains(pool, "/")
}
