package rdb_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/poold/poold/internal/rdb"
	"github.com/poold/poold/internal/rdb/rdbtest"
)

// Of many concurrent claims of one key, from two clients, exactly one wins
// and every other learns the winner; once the lease ends, a new claim wins.
func TestClaim(t *testing.T) {
	url := rdbtest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var clients []*rdb.Client
	for range 2 {
		c, err := rdb.Open(ctx, url, rdb.Options{Prefix: "test:"})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		clients = append(clients, c)
	}
	results := make([]string, 40)
	var wg sync.WaitGroup
	for i := range results {
		wg.Go(func() {
			got, err := clients[i%2].Claim(ctx, "copy:m", fmt.Sprintf("host%d", i), 300*time.Millisecond)
			if err != nil {
				t.Error(err)
			}
			results[i] = got
		})
	}
	wg.Wait()
	winner := results[0]
	for i, r := range results {
		if r != winner {
			t.Fatalf("claim %d saw %q, claim 0 saw %q", i, r, winner)
		}
	}
	t.Logf("40 concurrent claims: all saw %s", winner)

	// Once the lease ends, the key is free again (bounded polling).
	deadline := time.Now().Add(10 * time.Second)
	for {
		got, err := clients[0].Claim(ctx, "copy:m", "late", time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if got == "late" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the claim of %s outlived its lease", got)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A Redis that does not answer is an error at Open, naming the address.
func TestOpenUnreachable(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := rdb.Open(ctx, "redis://127.0.0.1:1", rdb.Options{DialTimeout: time.Second}); err == nil {
		t.Fatal("no error")
	}
	if _, err := rdb.Open(ctx, "http://x", rdb.Options{}); err == nil {
		t.Fatal("a bad url gave no error")
	}
}

// Each replica's limits reach the others until their ttl ends, and not
// itself.
func TestShareLimits(t *testing.T) {
	url := rdbtest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	a, b := open(t, url), open(t, url)
	if peers, err := a.ShareLimits(ctx, "a", map[string]string{"team": "rpm=60 tpm=0"}, 200*time.Millisecond); err != nil || len(peers) != 0 {
		t.Fatalf("the first replica: %v %v", peers, err)
	}
	peers, err := b.ShareLimits(ctx, "b", map[string]string{"team": "rpm=600 tpm=0"}, time.Minute)
	if err != nil || len(peers) != 1 || peers["a"]["team"] != "rpm=60 tpm=0" {
		t.Fatalf("the second replica sees %v %v", peers, err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		peers, err := b.ShareLimits(ctx, "b", map[string]string{"team": "rpm=600 tpm=0"}, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if len(peers) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a's entry outlived its ttl: %v", peers)
		}
	}
	if peers, err := a.ShareLimits(ctx, "a", nil, time.Minute); err != nil || peers["b"]["team"] != "rpm=600 tpm=0" {
		t.Fatalf("a back: %v %v", peers, err)
	}
}
