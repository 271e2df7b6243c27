package engine

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/poold/poold/internal/shim"
)

// The adoption's checks of an engine that a previous poold left under its
// shim: that it is the recorded process, the profile in force would start
// it as it runs, it alone serves its port, and it answers as recorded.

// Want is the engine an adoption expects of a record: the profile in
// force's.
type Want struct {
	// ID is the profile's id, which the engine's /v1/models must list
	// when it was recorded awake.
	ID string
	// Argv, Env and Given are the command line and environment the
	// profile in force would start it with, as in Spec.
	Argv, Env, Given []string
	// MaySleep asks /is_sleeping of an engine recorded awake too: its
	// profile sleeps, and it may have slept by itself.
	MaySleep bool
	// AllowExposed lets it listen beyond loopback on its port
	// (CheckSockets).
	AllowExposed bool
}

// Verify checks that the engine under h, attached for rec, is the one
// that want describes and answers as recorded, each call to it bounded by
// AttachTimeout: it is the recorded process (Recorded; such an error
// wraps ErrNotRecorded, and the engine is then its shim's alone to stop);
// its shim's fingerprint is want's (a shim of an older poold holds one of
// the whole environment, which stands while poold's own has not changed);
// its sockets pass CheckSockets (unreadable ones are logged to log and
// pass); and api, its HTTP API, says it sleeps as recorded (/is_sleeping)
// and, when awake, lists want.ID (/v1/models).
func (h *Shimmed) Verify(ctx context.Context, rec LedgerEngine, api API, want Want, log *slog.Logger) error {
	if err := h.Recorded(); err != nil {
		return err
	}
	if fp := h.Fingerprint(); fp != shim.Fingerprint(want.Argv, want.Given) && fp != shim.Fingerprint(want.Argv, want.Env) {
		return fmt.Errorf("its profile changed while poold was down, or the vllm-command setting did: %s", changes(rec, want.Argv, want.Given))
	}
	if _, err := CheckSockets(h, want.ID, want.AllowExposed); errors.Is(err, ErrSocketsUnread) {
		log.Warn("the engine's port and exposure are not checked", "err", err)
	} else if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, AttachTimeout)
	defer cancel()
	if rec.Sleeping > 0 || want.MaySleep {
		asleep, err := api.IsSleeping(ctx)
		switch {
		case err != nil:
			return err
		case asleep != (rec.Sleeping > 0):
			return fmt.Errorf("it was recorded asleep at level %d, and GET /is_sleeping says %v", rec.Sleeping, asleep)
		}
	}
	if rec.Sleeping == 0 {
		if ok, seen := api.Serves(ctx, want.ID); !ok {
			return fmt.Errorf("GET /v1/models: %s", seen)
		}
	}
	return nil
}

// EnvSums is a digest of each variable of env by name: the first 16 hex
// digits of the sha256 of its value, enough to tell a change, without
// keeping a value that may be a secret.
func EnvSums(env []string) map[string]string {
	sums := make(map[string]string, len(env))
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		sum := sha256.Sum256([]byte(v))
		sums[k] = hex.EncodeToString(sum[:8])
	}
	return sums
}

// changes says what differs between the engine rec records and the one the
// profile in force would start with argv and given: the flags of the
// command line added, removed or changed, and the variables, by name only
// (a value may be a secret). A ledger of an older poold records neither.
func changes(rec LedgerEngine, argv, given []string) string {
	if rec.Argv == nil {
		return "another command line or environment"
	}
	var parts []string
	added, removed, changed := argChanges(rec.Argv, argv)
	for _, c := range []struct {
		what  string
		names []string
	}{{"added", added}, {"removed", removed}, {"changed", changed}} {
		if len(c.names) > 0 {
			parts = append(parts, fmt.Sprintf("argument %s %s", strings.Join(c.names, ", "), c.what))
		}
	}
	now := EnvSums(given)
	var vars [3][]string // added, removed, changed
	for _, k := range slices.Sorted(maps.Keys(now)) {
		switch old, ok := rec.EnvSums[k]; {
		case !ok:
			vars[0] = append(vars[0], k)
		case old != now[k]:
			vars[2] = append(vars[2], k)
		}
	}
	for _, k := range slices.Sorted(maps.Keys(rec.EnvSums)) {
		if _, ok := now[k]; !ok {
			vars[1] = append(vars[1], k)
		}
	}
	for i, what := range []string{"added", "removed", "changed"} {
		if len(vars[i]) > 0 {
			parts = append(parts, fmt.Sprintf("variable %s %s", strings.Join(vars[i], ", "), what))
		}
	}
	if len(parts) == 0 {
		return "another command line or environment"
	}
	return strings.Join(parts, "; ")
}

// argChanges names the arguments that differ between the command lines was
// and now, past what they share at both ends: each by its flag (cut at
// "="), a flag's value by the flag before it, or by its place ("#3"); the
// values themselves are not shown.
func argChanges(was, now []string) (added, removed, changed []string) {
	pre := 0
	for pre < len(was) && pre < len(now) && was[pre] == now[pre] {
		pre++
	}
	suf := 0
	for suf < len(was)-pre && suf < len(now)-pre && was[len(was)-1-suf] == now[len(now)-1-suf] {
		suf++
	}
	name := func(argv []string, i int) string {
		switch a := argv[i]; {
		case strings.HasPrefix(a, "-"):
			flag, _, _ := strings.Cut(a, "=")
			return flag
		case i > 0 && strings.HasPrefix(argv[i-1], "-"):
			flag, _, _ := strings.Cut(argv[i-1], "=")
			return flag
		}
		return "#" + strconv.Itoa(i)
	}
	var old, cur []string
	for i := pre; i < len(was)-suf; i++ {
		old = append(old, name(was, i))
	}
	for i := pre; i < len(now)-suf; i++ {
		cur = append(cur, name(now, i))
	}
	for _, n := range uniq(cur) {
		if slices.Contains(old, n) {
			changed = append(changed, n)
		} else {
			added = append(added, n)
		}
	}
	for _, n := range uniq(old) {
		if !slices.Contains(cur, n) {
			removed = append(removed, n)
		}
	}
	return added, removed, changed
}

// uniq is names without repeats, in their first order.
func uniq(names []string) []string {
	var out []string
	for _, n := range names {
		if !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	return out
}
