package rdb

import (
	"context"
	"encoding/json"
	"fmt"
	"time"
)

// peerEntry is one replica's field of the limits hash: what its tenants
// file says of each tenant's limits, and until when it holds.
type peerEntry struct {
	Limits map[string]string `json:"limits"`
	Until  time.Time         `json:"until"`
}

// ShareLimits publishes this replica's tenants' limits (tenant → a string
// that is equal for equal limits) under replica for ttl, in the hash
// "limits" (one field per replica), and returns those of the other
// replicas whose entries have not expired, by replica. It is one round
// trip, one more when it removes expired entries: meant for every few
// seconds, not per request.
func (c *Client) ShareLimits(ctx context.Context, replica string, limits map[string]string, ttl time.Duration) (map[string]map[string]string, error) {
	now := time.Now()
	raw, err := json.Marshal(peerEntry{Limits: limits, Until: now.Add(ttl)})
	if err != nil {
		return nil, fmt.Errorf("redis limits of %s: %w", replica, err)
	}
	key := c.prefix + "limits"
	var all map[string]string
	err = c.call(func() error {
		pipe := c.rc.TxPipeline()
		pipe.HSet(ctx, key, replica, raw)
		pipe.PExpire(ctx, key, ttl)
		get := pipe.HGetAll(ctx, key)
		if _, err := pipe.Exec(ctx); err != nil {
			return err
		}
		all = get.Val()
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("redis limits of the replicas: %w", err)
	}
	peers := make(map[string]map[string]string)
	var expired []string
	for name, v := range all {
		var e peerEntry
		switch {
		case name == replica:
		case json.Unmarshal([]byte(v), &e) != nil || now.After(e.Until):
			expired = append(expired, name)
		default:
			peers[name] = e.Limits
		}
	}
	if len(expired) > 0 {
		_ = c.call(func() error { return c.rc.HDel(ctx, key, expired...).Err() })
	}
	return peers, nil
}
