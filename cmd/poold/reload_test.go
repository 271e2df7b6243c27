package main

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"reflect"
	"testing"

	"github.com/poold/poold/internal/profile"
)

// A reload's log line names what changed, list by list, and says so when
// nothing did.
func TestReloadLogNamesChanges(t *testing.T) {
	for _, tt := range []struct {
		c    profile.Changes
		want map[string]any
	}{
		{profile.Changes{}, map[string]any{"no_change": true}},
		{profile.Changes{ProfilesAdded: []string{"b"}, PoolsAffected: []string{"p0"}},
			map[string]any{"profiles_added": []any{"b"}, "pools_affected": []any{"p0"}}},
		{profile.Changes{ProfilesRemoved: []string{"a"}, ProfilesChanged: []string{"c", "d"}, PoolsAdded: []string{"p9"}, PoolsRemoved: []string{"p1"}, PoolsChanged: []string{"p2"}, PoolsAffected: []string{"p2", "p9", "p1"}, SleepMemoryBudget: true},
			map[string]any{"profiles_removed": []any{"a"}, "profiles_changed": []any{"c", "d"}, "pools_added": []any{"p9"}, "pools_removed": []any{"p1"},
				"pools_changed": []any{"p2"}, "pools_affected": []any{"p2", "p9", "p1"}, "sleep_memory_budget_changed": true}},
	} {
		var out bytes.Buffer
		slog.New(slog.NewJSONHandler(&out, &slog.HandlerOptions{ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
			if a.Key == slog.TimeKey || a.Key == slog.LevelKey || a.Key == slog.MessageKey {
				return slog.Attr{}
			}
			return a
		}})).Info("profiles reloaded", changeAttrs(tt.c)...)
		var got map[string]any
		if err := json.Unmarshal(out.Bytes(), &got); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, tt.want) {
			t.Errorf("changes %+v logged %v, want %v", tt.c, got, tt.want)
		}
	}
}
