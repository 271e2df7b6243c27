// Package rdb is the Redis that fleetd replicas share (--redis-url): the
// connection, checked at start-up, and the atomic operations fleetd's
// coordination needs, each one round trip. fleetd's claims of a model's new
// copy use it; fleet-wide rate limits are meant to share the same
// connection. Package rdbtest starts a private redis-server for tests.
package rdb

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/redis/go-redis/v9"
)

// Client is a connection pool to one Redis. Create it with Open; it is safe
// for concurrent use.
type Client struct {
	rc     *redis.Client
	prefix string
}

// Options configures Open. Zero values: Prefix → "fleetd:"; DialTimeout →
// 2 s; Logger → go-redis's own lines discarded.
type Options struct {
	// Prefix starts every key, so that several fleets may share one Redis.
	Prefix      string
	DialTimeout time.Duration
	// Logger gets go-redis's own lines (a failed dial, say) at debug level,
	// instead of its stderr: the callers report what matters. go-redis has
	// one logger per process, so the last Open's wins.
	Logger *slog.Logger
}

// redisLog is a go-redis logger on a slog.Logger.
type redisLog struct{ log *slog.Logger }

func (l redisLog) Printf(ctx context.Context, format string, v ...any) {
	l.log.DebugContext(ctx, fmt.Sprintf(format, v...))
}

// Open parses url (redis://[user:password@]host:port[/db], or rediss:// for
// TLS) and checks that the server answers a PING within ctx.
func Open(ctx context.Context, url string, opts Options) (*Client, error) {
	ro, err := redis.ParseURL(url)
	if err != nil {
		return nil, fmt.Errorf("redis url: %w", err)
	}
	ro.DialTimeout = cmpOr(opts.DialTimeout, 2*time.Second)
	// Coordination is worth little late: a caller bounds each call with its
	// context and goes its own way past it, so no retries behind its back,
	// of a command or of a dial.
	ro.MaxRetries = -1
	ro.DialerRetries = 1
	ro.ContextTimeoutEnabled = true
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	redis.SetLogger(redisLog{log.With("component", "redis")})
	c := &Client{rc: redis.NewClient(ro), prefix: opts.Prefix}
	if c.prefix == "" {
		c.prefix = "fleetd:"
	}
	if err := c.rc.Ping(ctx).Err(); err != nil {
		c.rc.Close()
		return nil, fmt.Errorf("redis at %s: %w", ro.Addr, err)
	}
	return c, nil
}

func cmpOr(d, dflt time.Duration) time.Duration {
	if d > 0 {
		return d
	}
	return dflt
}

// Close closes the connections.
func (c *Client) Close() error { return c.rc.Close() }

// Claim sets key to value for lease unless key is set, and returns the value
// in force: value when this claim won, else the earlier claim's. It is one
// atomic command (SET key value NX PX lease GET), so that of concurrent
// claims exactly one wins and every other learns the winner.
func (c *Client) Claim(ctx context.Context, key, value string, lease time.Duration) (string, error) {
	old, err := c.rc.SetArgs(ctx, c.prefix+key, value, redis.SetArgs{Mode: "NX", TTL: lease, Get: true}).Result()
	switch {
	case errors.Is(err, redis.Nil):
		return value, nil // nothing was there: this claim is in force
	case err != nil:
		return "", fmt.Errorf("redis claim %q: %w", key, err)
	}
	return old, nil
}
