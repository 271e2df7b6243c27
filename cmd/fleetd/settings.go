package main

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/poold/poold/internal/cli"
	"github.com/poold/poold/internal/fleet"
	"github.com/poold/poold/internal/headerbudget"
	"github.com/poold/poold/internal/openai"
)

// settings are fleetd's own settings (the hosts file says where to route).
// Precedence, highest first: flags, FLEETD_* environment variables (dashes
// become underscores: FLEETD_SCALE_IN_WINDOW), defaults.
type settings struct {
	Listen          string
	Hosts           string
	LogLevel        slog.Level
	LogFormat       string
	MaxBodyBytes    int64
	ShutdownTimeout time.Duration
	// ReadTimeout bounds reading a request, body included (408 after), and
	// ReadHeaderTimeout its headers; MaxHeaderBytes caps the headers' size
	// (431 above), HeaderBytesBudget the header bytes of every connection
	// still in its headers together (headerbudget): the same limits as
	// poold's.
	ReadTimeout, ReadHeaderTimeout time.Duration
	MaxHeaderBytes                 int
	HeaderBytesBudget              int64
	// ClientWriteTimeout bounds how long one write of an answer may wait for
	// a client that does not read (openai.WriteDeadline; 0: none).
	ClientWriteTimeout time.Duration
	// RedisURL, when set, is the Redis the replicas share (rdb.Open):
	// claims of new copies and the tenants' limits. RedisTimeout bounds each
	// call; RedisFailClosed refuses the requests whose limits it could not
	// check (else they go through).
	RedisURL        string
	RedisTimeout    time.Duration
	RedisFailClosed bool
	// APIKeys, when non-nil, is required on /v1/* before any host is asked
	// (api-keys, api-keys-file); the client's Authorization still goes to
	// the host as sent. Only the keys' hashes are kept.
	APIKeys *openai.APIKeys
	// Tenants, when set, is the tenants file (fleet.LoadTenants): the keys
	// fleetd requires, which is why it excludes APIKeys.
	Tenants string
	Fleet   fleet.Options
	Handler fleet.HandlerOptions
	// Loaded says where the settings came from, for the start-up log.
	Loaded *cli.Settings
}

// serveFlags defines serve's flags.
func serveFlags() *pflag.FlagSet {
	fl := cli.NewFlagSet("fleetd serve")
	fl.String("listen", "127.0.0.1:8090", "address to serve the API on")
	fl.String("hosts", "", "hosts JSON file (required)")
	fl.String("log-level", "info", "log level: debug, info, warn or error")
	fl.String("log-format", "text", "log format: json or text")
	cli.BytesFlag(fl, "max-body-bytes", openai.DefaultMaxBodyBytes, "request body limit (bytes, or with a unit: 32MiB)")
	cli.BytesFlag(fl, openai.MaxEventSetting, openai.DefaultMaxEvent, "largest server-sent event of a stream (a larger one ends the stream with an error event)")
	fl.Duration("shutdown-timeout", 2*time.Minute, "how long in-flight requests may run on after SIGTERM before they are cut")
	fl.Duration("poll-interval", fleet.DefaultPollInterval, "how often each host's /status and /v1/models are read")
	fl.Duration("poll-timeout", fleet.DefaultPollTimeout, "time limit of one poll; a poll that times out is followed by another at once")
	fl.Int("silent-after", fleet.DefaultSilentAfter, "polls in a row that time out that eject a host as silent")
	fl.Bool("retry-silent", true, "cancel the requests of a host ejected as silent that have no response byte yet, and retry them on another host")
	fl.Int("eject-after", fleet.DefaultEjectAfter, "failed polls, unanswered forwards, or failed answers of one model (5xx, cut streams) in a row that eject the host, or the model there")
	fl.Duration("max-backoff", fleet.DefaultMaxBackoff, "longest ejection (each lasts at least poll-interval, doubling when a host keeps failing)")
	fl.Int("max-attempts", fleet.DefaultMaxAttempts, "hosts one request may be tried on (no answer, silence, a refused key, or a refusal that started nothing)")
	fl.String("affinity-header", fleet.DefaultAffinityHeader, "request header whose value keeps a session on one host")
	cli.BytesFlag(fl, "affinity-bytes", fleet.DefaultAffinityBytes, "bytes of the first message that key affinity when the header is absent")
	fl.Float64("affinity-epsilon", fleet.DefaultAffinityEpsilon, "a session stays on its host while the host's load is within (1+ε)× the mean")
	fl.Int("load-slack", fleet.DefaultLoadSlack, "requests by which a host may exceed the least loaded one and still keep its sessions, whatever the mean")
	fl.Bool("scale-out", true, "load another copy of a model on a host that can take it when every awake copy is saturated")
	fl.Duration("scale-in-window", fleet.DefaultScaleInWindow, "how long a model's copies must stay unsaturated before a copy this fleetd loaded by scaling out is unloaded (needs host-admin-token-file); the hosts file may set it per model")
	fl.Duration("scale-out-cooldown", fleet.DefaultScaleOutCooldown, "least time between two scale-outs of one model by this fleetd, times a factor in [1, 2) drawn at start")
	fl.Duration("claim-lease", fleet.DefaultClaimLease, "how long a claim of a model's new copy (cold load or scale-out) sends its model's requests to the claimed host")
	fl.String("redis-url", "", "Redis shared by the replicas (redis://host:port[/db]): claims of new copies, so that replicas load one copy, and the tenants' rate limits")
	fl.Duration("redis-timeout", fleet.DefaultClaimTimeout, "time limit of each call to Redis (a claim, a limit check); past it the call has failed")
	fl.Bool("redis-fail-closed", false, "refuse (429) the requests whose tenant limits Redis cannot check, instead of letting them through")
	fl.String("tenants", "", "tenants JSON file: API keys to tenants, with their rate limits, output caps and models, enforced before any host is asked; watched and reloaded (excludes api-keys)")
	fl.Duration("read-timeout", time.Minute, "how long a client may take to send a whole request, body included (408 after)")
	fl.Duration("read-header-timeout", 10*time.Second, "how long a client may take to send a request's headers")
	cli.BytesFlag(fl, "max-header-bytes", headerbudget.DefaultMaxHeaderBytes, "largest request header block accepted (431 above)")
	cli.BytesFlag(fl, "header-bytes-budget", headerbudget.DefaultMaxBytes, "header bytes that connections still sending their headers may hold together (503 and closed past it; blocks over 16KiB get three quarters)")
	fl.Duration(openai.ClientWriteTimeoutSetting, time.Minute, "how long a client may accept no byte of an answer before it is cut (client_stalled in the access log) and its host's request cancelled; 0: no bound")
	fl.Duration("stream-idle-timeout", fleet.DefaultStreamIdleTimeout, "how long a host may go without completing an event of a stream (or sending a byte of a plain answer) before the answer ends (host_timeout) and counts as the host's failure; 0: no bound")
	fl.StringSlice("api-keys", nil, "API keys fleetd itself requires on /v1 (comma-separated; prefer FLEETD_API_KEYS or api-keys-file: flags show in ps)")
	fl.String("api-keys-file", "", "file of API keys fleetd itself requires on /v1, one per line (KEY or sha256:HEX; # comments)")
	fl.String("host-api-key-file", "", "file holding the API key fleetd presents on its polls of hosts whose poold requires keys")
	fl.String("host-admin-token-file", "", "file holding the hosts' admin token (poold's admin-token), with which scale-in unloads the copies scale-out loaded")
	return fl
}

// loadSettings parses serve's flags and merges them with the environment.
// -h or --help returns pflag.ErrHelp.
func loadSettings(args []string) (settings, error) {
	v, err := cli.LoadSettings(serveFlags(), args, cli.Sources{EnvPrefix: "FLEETD"})
	if err != nil {
		return settings{}, err
	}
	s := settings{
		Listen:             v.String("listen"),
		Hosts:              v.String("hosts"),
		LogFormat:          v.String("log-format"),
		MaxBodyBytes:       v.Bytes("max-body-bytes"),
		ShutdownTimeout:    v.Duration("shutdown-timeout"),
		ReadTimeout:        v.Duration("read-timeout"),
		ReadHeaderTimeout:  v.Duration("read-header-timeout"),
		MaxHeaderBytes:     int(v.Bytes("max-header-bytes")),
		HeaderBytesBudget:  v.Bytes("header-bytes-budget"),
		ClientWriteTimeout: v.Duration(openai.ClientWriteTimeoutSetting),
		RedisURL:           v.String("redis-url"),
		RedisTimeout:       v.Duration("redis-timeout"),
		RedisFailClosed:    v.Bool("redis-fail-closed"),
		Tenants:            v.String("tenants"),
		Fleet: fleet.Options{
			PollInterval:  v.Duration("poll-interval"),
			PollTimeout:   v.Duration("poll-timeout"),
			SilentAfter:   v.Int("silent-after"),
			EjectAfter:    v.Int("eject-after"),
			MaxBackoff:    v.Duration("max-backoff"),
			KeepSilent:    !v.Bool("retry-silent"),
			ScaleInWindow: v.Duration("scale-in-window"),
		},
		Handler: fleet.HandlerOptions{
			MaxBodyBytes:      v.Bytes("max-body-bytes"),
			MaxEventBytes:     v.Bytes(openai.MaxEventSetting),
			MaxAttempts:       v.Int("max-attempts"),
			AffinityHeader:    v.String("affinity-header"),
			AffinityBytes:     int(v.Bytes("affinity-bytes")),
			AffinityEpsilon:   v.Float64("affinity-epsilon"),
			LoadSlack:         v.Int("load-slack"),
			ScaleOut:          v.Bool("scale-out"),
			ScaleOutCooldown:  v.Duration("scale-out-cooldown"),
			ClaimLease:        v.Duration("claim-lease"),
			ClaimTimeout:      v.Duration("redis-timeout"),
			StreamIdleTimeout: v.Duration("stream-idle-timeout"),
			Version:           version,
		},
		Loaded: v,
	}
	var errs []error
	if s.APIKeys, err = openai.LoadAPIKeys(v.Strings("api-keys"), v.String("api-keys-file")); err != nil {
		errs = append(errs, err)
	}
	if s.Tenants != "" && (len(v.Strings("api-keys")) > 0 || v.String("api-keys-file") != "") {
		errs = append(errs, errors.New("tenants: not with api-keys or api-keys-file: the tenants file holds the keys fleetd accepts"))
	}
	if s.RedisFailClosed && s.RedisURL == "" {
		errs = append(errs, errors.New("redis-fail-closed: needs redis-url (without it, the limits are kept in memory and always checked)"))
	}
	if s.Fleet.PollKey, err = secretFile(v, "host-api-key-file", "key"); err != nil {
		errs = append(errs, err)
	}
	if s.Fleet.AdminToken, err = secretFile(v, "host-admin-token-file", "token"); err != nil {
		errs = append(errs, err)
	}
	if s.Fleet.ScaleInWindow < time.Second {
		errs = append(errs, fmt.Errorf("scale-in-window: %s is shorter than 1s", s.Fleet.ScaleInWindow))
	}
	if err := s.LogLevel.UnmarshalText([]byte(v.String("log-level"))); err != nil {
		errs = append(errs, fmt.Errorf("log-level: %w", err))
	}
	if s.LogFormat != "json" && s.LogFormat != "text" {
		errs = append(errs, fmt.Errorf("log-format: %q is neither json nor text", s.LogFormat))
	}
	if s.Hosts == "" {
		errs = append(errs, errors.New("hosts: a hosts file is required (--hosts or FLEETD_HOSTS)"))
	}
	for _, c := range []struct {
		name string
		ok   bool
	}{
		{"max-body-bytes", s.MaxBodyBytes > 0}, {openai.MaxEventSetting, s.Handler.MaxEventBytes > 0}, {"poll-interval", s.Fleet.PollInterval > 0}, {"poll-timeout", s.Fleet.PollTimeout > 0},
		{"eject-after", s.Fleet.EjectAfter > 0}, {"max-backoff", s.Fleet.MaxBackoff > 0}, {"max-attempts", s.Handler.MaxAttempts > 0},
		{"affinity-bytes", s.Handler.AffinityBytes > 0}, {"silent-after", s.Fleet.SilentAfter > 0},
		{"scale-out-cooldown", s.Handler.ScaleOutCooldown > 0}, {"claim-lease", s.Handler.ClaimLease > 0},
		{"max-header-bytes", s.MaxHeaderBytes > 0}, {"redis-timeout", s.RedisTimeout > 0},
	} {
		if !c.ok {
			errs = append(errs, fmt.Errorf("%s: must be positive", c.name))
		}
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"shutdown-timeout", s.ShutdownTimeout}, {"read-timeout", s.ReadTimeout}, {"read-header-timeout", s.ReadHeaderTimeout},
		{openai.ClientWriteTimeoutSetting, s.ClientWriteTimeout}, {"stream-idle-timeout", s.Handler.StreamIdleTimeout}} {
		if d.v < 0 {
			errs = append(errs, fmt.Errorf("%s: must not be negative", d.name))
		}
	}
	if s.HeaderBytesBudget < int64(s.MaxHeaderBytes) {
		errs = append(errs, fmt.Errorf("header-bytes-budget: must hold one largest header block (max-header-bytes, %d), not %d", s.MaxHeaderBytes, s.HeaderBytesBudget))
	}
	if s.Handler.AffinityEpsilon < 0 {
		errs = append(errs, errors.New("affinity-epsilon: must not be negative"))
	}
	if s.Handler.LoadSlack < 0 {
		errs = append(errs, errors.New("load-slack: must not be negative"))
	}
	if s.Handler.AffinityHeader == "" {
		errs = append(errs, errors.New("affinity-header: must not be empty"))
	}
	return s, errors.Join(errs...)
}

// secretFile returns the secret (a key, a token) held by the file that
// setting names, or "" when the setting is empty.
func secretFile(v *cli.Settings, setting, what string) (string, error) {
	file := v.String(setting)
	if file == "" {
		return "", nil
	}
	b, err := os.ReadFile(file)
	secret := strings.TrimSpace(string(b))
	switch {
	case err != nil:
		return "", fmt.Errorf("%s: %w", setting, err)
	case secret == "":
		return "", fmt.Errorf("%s: %q holds no %s", setting, file, what)
	}
	return secret, nil
}

// newLogger builds fleetd's logger on stderr.
func newLogger(s settings) *slog.Logger {
	opts := &slog.HandlerOptions{Level: s.LogLevel}
	if s.LogFormat == "json" {
		return slog.New(slog.NewJSONHandler(os.Stderr, opts))
	}
	return slog.New(slog.NewTextHandler(os.Stderr, opts))
}
