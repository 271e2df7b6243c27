package cli

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"
)

// statusTimeout bounds a whole GET /status.
const statusTimeout = 10 * time.Second

// maxStatusBytes bounds the /status body read.
const maxStatusBytes = 16 << 20

// baseURL turns a daemon's address, given as host:port or as an http(s) URL,
// into a base URL without a trailing slash.
func baseURL(addr string) (string, error) {
	s := strings.TrimSpace(addr)
	if !strings.Contains(s, "://") {
		s = "http://" + s
	}
	u, err := url.Parse(s)
	switch {
	case err != nil:
		return "", fmt.Errorf("address %q: %w", addr, err)
	case u.Scheme != "http" && u.Scheme != "https":
		return "", fmt.Errorf("address %q: scheme %q is neither http nor https", addr, u.Scheme)
	case u.Host == "":
		return "", fmt.Errorf("address %q: no host", addr)
	}
	return strings.TrimSuffix(s, "/"), nil
}

// fetchStatus returns the body of GET base/status.
func fetchStatus(base string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), statusTimeout)
	defer cancel()
	u := base + "/status"
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxStatusBytes))
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", u, err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", u, resp.Status)
	}
	return body, nil
}

// A StatusCommand is the "status" command of a daemon: it reads the
// daemon's GET /status, decodes it into a T and prints it as a table, or
// with --json prints it as sent.
type StatusCommand[T any] struct {
	// Daemon is the daemon whose /status this reads: "poold" or "fleetd".
	Daemon string
	// AddrEnv names the environment variable that gives --addr's default,
	// else DefaultAddr (each as host:port or URL).
	AddrEnv, DefaultAddr string
	// Print writes the status as a table.
	Print func(w io.Writer, st T)
}

// statusKeys are the top-level keys that tell each daemon's /status apart.
var statusKeys = map[string][2]string{
	"poold":  {"config", "pools"},
	"fleetd": {"hostsFile", "hosts"},
}

// Run runs the command with args and returns its exit code: 0, 1 when the
// daemon cannot be asked or is not the one expected, 2 on a usage error.
func (c StatusCommand[T]) Run(args []string, stdout, stderr io.Writer) int {
	const usage = "[--addr ADDR] [--json]"
	fl := NewFlagSet(c.Daemon + " status")
	addr := fl.String("addr", cmp.Or(os.Getenv(c.AddrEnv), c.DefaultAddr),
		fmt.Sprintf("%s's address, host:port or URL; %s sets the default", c.Daemon, c.AddrEnv))
	raw := fl.Bool("json", false, "print /status as "+c.Daemon+" sent it")
	if code, ok := ParseFlags(fl, usage, args, stdout, stderr); !ok {
		return code
	}
	if fl.NArg() > 0 {
		return UsageError(stderr, fl, usage, fmt.Errorf("unexpected arguments %q", fl.Args()))
	}
	base, err := baseURL(*addr)
	if err != nil {
		return UsageError(stderr, fl, usage, fmt.Errorf("--addr: %w", err))
	}
	body, err := fetchStatus(base)
	if err == nil {
		err = c.expect(base, body)
	}
	switch {
	case err != nil:
	case *raw:
		_, err = stdout.Write(body)
	default:
		var st T
		if err = json.Unmarshal(body, &st); err != nil {
			err = fmt.Errorf("decoding %s/status: %w", base, err)
			break
		}
		c.Print(stdout, st)
	}
	if err != nil {
		fmt.Fprintf(stderr, "%s status: %v\n", c.Daemon, err)
		return ExitFailure
	}
	return ExitOK
}

// expect returns an error unless body is the /status of c.Daemon, naming
// the daemon that answered when it is the other one.
func (c StatusCommand[T]) expect(base string, body []byte) error {
	var top map[string]json.RawMessage
	if err := json.Unmarshal(body, &top); err != nil {
		return fmt.Errorf("decoding %s/status: %w", base, err)
	}
	is := func(daemon string) bool {
		keys := statusKeys[daemon]
		return top[keys[0]] != nil && top[keys[1]] != nil
	}
	if is(c.Daemon) {
		return nil
	}
	for other := range statusKeys {
		if other != c.Daemon && is(other) {
			var version string
			_ = json.Unmarshal(top["version"], &version)
			return fmt.Errorf("%s is a %s (version %s), not a %s; run: %s status --addr %s", base, other, version, c.Daemon, other, base)
		}
	}
	return fmt.Errorf("%s/status is not %s's status (no %q and %q)", base, c.Daemon, statusKeys[c.Daemon][0], statusKeys[c.Daemon][1])
}
