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
	// br guards every call: past a few failures in a row (a stalled or
	// unreachable Redis), calls fail at once with ErrBreakerOpen instead of
	// each waiting out its timeout.
	br        Breaker
	onBreaker func(BreakerState, time.Duration)
}

// Options configures Open. Zero values: Prefix → "fleetd:"; DialTimeout →
// 2 s; Logger → go-redis's own lines discarded; BreakerAfter, BreakerBackoff
// and BreakerMaxBackoff → Breaker's defaults; OnBreaker → none.
type Options struct {
	// Prefix starts every key, so that several fleets may share one Redis.
	Prefix      string
	DialTimeout time.Duration
	// Logger gets go-redis's own lines (a failed dial, say) at debug level,
	// instead of its stderr: the callers report what matters. go-redis has
	// one logger per process, so the last Open's wins.
	Logger *slog.Logger
	// BreakerAfter failures in a row stop every call for BreakerBackoff,
	// doubled at each failed probe up to BreakerMaxBackoff (see Breaker).
	BreakerAfter                      int
	BreakerBackoff, BreakerMaxBackoff time.Duration
	// OnBreaker, if not nil, is told each change of the breaker's state,
	// with the length of an opening; it must not block.
	OnBreaker func(state BreakerState, backoff time.Duration)
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
	c := &Client{rc: redis.NewClient(ro), prefix: opts.Prefix, onBreaker: opts.OnBreaker,
		br: Breaker{After: opts.BreakerAfter, Backoff: opts.BreakerBackoff, MaxBackoff: opts.BreakerMaxBackoff}}
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

// ErrBreakerOpen is the error of a call that the breaker refused: Redis
// failed the calls before it, and was not asked.
var ErrBreakerOpen = errors.New("redis not asked: its breaker is open after calls that failed")

// call runs fn, one round trip to Redis, unless the breaker refuses it,
// and records how it ended: an answer (redis.Nil included) or a failure.
func (c *Client) call(fn func() error) error {
	if !c.br.Allow(time.Now()) {
		return ErrBreakerOpen
	}
	err := fn()
	state, changed, backoff := c.br.Record(time.Now(), err == nil || errors.Is(err, redis.Nil))
	if changed && c.onBreaker != nil {
		c.onBreaker(state, backoff)
	}
	return err
}

// Close closes the connections.
func (c *Client) Close() error { return c.rc.Close() }

// Claim sets key to value for lease unless key is set, and returns the value
// in force: value when this claim won, else the earlier claim's. It is one
// atomic command (SET key value NX PX lease GET), so that of concurrent
// claims exactly one wins and every other learns the winner. A ctx
// cancelled before its deadline (the client left) does not cut the claim
// short: only its deadline bounds it, so that what the breaker is told is
// Redis's doing.
func (c *Client) Claim(ctx context.Context, key, value string, lease time.Duration) (string, error) {
	if d, ok := ctx.Deadline(); ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(context.WithoutCancel(ctx), d)
		defer cancel()
	}
	var old string
	err := c.call(func() error {
		var err error
		old, err = c.rc.SetArgs(ctx, c.prefix+key, value, redis.SetArgs{Mode: "NX", TTL: lease, Get: true}).Result()
		return err
	})
	switch {
	case errors.Is(err, redis.Nil):
		return value, nil // nothing was there: this claim is in force
	case err != nil:
		return "", fmt.Errorf("redis claim %q: %w", key, err)
	}
	return old, nil
}
