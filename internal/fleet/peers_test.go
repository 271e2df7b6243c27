package fleet

import (
	"context"
	"log/slog"
	"path/filepath"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/poold/poold/internal/rdb"
	"github.com/poold/poold/internal/rdb/rdbtest"
	"github.com/poold/poold/internal/statusapi"
)

func TestDisagreements(t *testing.T) {
	ours := map[string]string{"a": "rpm=600 tpm=0", "b": "rpm=1 tpm=2", "c": "rpm=0 tpm=0"}
	peers := map[string]map[string]string{
		"r2": {"a": "rpm=60 tpm=0", "b": "rpm=1 tpm=2", "z": "rpm=5 tpm=5"},
		"r1": {"a": "rpm=60 tpm=0", "c": "rpm=0 tpm=9"},
	}
	want := []statusapi.LimitsDisagreement{
		{Tenant: "a", Replica: "r1", Limits: "rpm=60 tpm=0", Ours: "rpm=600 tpm=0"},
		{Tenant: "a", Replica: "r2", Limits: "rpm=60 tpm=0", Ours: "rpm=600 tpm=0"},
		{Tenant: "c", Replica: "r1", Limits: "rpm=0 tpm=9", Ours: "rpm=0 tpm=0"},
	}
	if got := disagreements(ours, peers); !reflect.DeepEqual(got, want) {
		t.Fatalf("got %+v\nwant %+v", got, want)
	}
	if got := disagreements(ours, map[string]map[string]string{"r": {"b": "rpm=1 tpm=2"}}); got != nil {
		t.Fatalf("agreeing replicas: %+v", got)
	}
}

// countedPeers counts the rounds of ShareLimits.
type countedPeers struct {
	PeerLimits
	n atomic.Int64
}

func (c *countedPeers) ShareLimits(ctx context.Context, replica string, limits map[string]string, ttl time.Duration) (map[string]map[string]string, error) {
	defer c.n.Add(1)
	return c.PeerLimits.ShareLimits(ctx, replica, limits, ttl)
}

// Two replicas sharing a Redis whose tenants files give team-a different
// limits each show the other's in their status and log it once; once the
// files agree (a reload), the disagreement is gone.
func TestLimitsDisagreementShown(t *testing.T) {
	url := rdbtest.Start(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	dir := t.TempDir()
	var logs [2]lockedLog
	var replicas [2]*Tenants
	var rounds [2]*countedPeers
	for i, rpm := range []string{"60", "600"} {
		c, err := rdb.Open(ctx, url, rdb.Options{Prefix: "test:"})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		path := filepath.Join(dir, "tenants-"+rpm+".json")
		tenantsFile(t, path, `{"name": "team-a", "rpm": `+rpm+`}`, `{"name": "team-b", "rpm": 5}`)
		ts, err := LoadTenants(path, TenantsOptions{Limiter: c.Limits(), Shared: true, Logger: slog.New(slog.NewTextHandler(&logs[i], nil))})
		if err != nil {
			t.Fatal(err)
		}
		replicas[i] = ts
		done := make(chan struct{})
		rounds[i] = &countedPeers{PeerLimits: c}
		go func() { ts.ShareLimits(ctx, rounds[i], "replica-"+rpm, 20*time.Millisecond, 0); close(done) }()
		defer func() { cancel(); <-done }()
	}
	for i, want := range []statusapi.LimitsDisagreement{
		{Tenant: "team-a", Replica: "replica-600", Limits: "rpm=600 tpm=0", Ours: "rpm=60 tpm=0"},
		{Tenant: "team-a", Replica: "replica-60", Limits: "rpm=60 tpm=0", Ours: "rpm=600 tpm=0"},
	} {
		waitFor(t, "the disagreement shown", func() bool {
			_, l := replicas[i].Status()
			return reflect.DeepEqual(l.Disagreements, []statusapi.LimitsDisagreement{want})
		})
	}
	// Ten rounds more: still logged once.
	for i := range replicas {
		after := rounds[i].n.Load() + 10
		waitFor(t, "ten rounds more", func() bool { return rounds[i].n.Load() >= after })
		if n := strings.Count(logs[i].String(), "tenant limits differ between replicas"); n != 1 {
			t.Fatalf("replica %d logged the disagreement %d times, want once:\n%s", i, n, logs[i].String())
		}
	}

	tenantsFile(t, replicas[0].path, `{"name": "team-a", "rpm": 600}`, `{"name": "team-b", "rpm": 5}`)
	if err := replicas[0].Reload(); err != nil {
		t.Fatal(err)
	}
	for i := range replicas {
		waitFor(t, "the files agree", func() bool { _, l := replicas[i].Status(); return l.Disagreements == nil })
	}
}
