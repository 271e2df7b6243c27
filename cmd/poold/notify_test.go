package main

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// fakeSystemd listens on a unixgram socket, points NOTIFY_SOCKET at it, and
// hands every datagram received to the test.
func fakeSystemd(t *testing.T) <-chan string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "notify.sock")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("NOTIFY_SOCKET", path)
	msgs := make(chan string, 100)
	go func() {
		defer close(msgs)
		buf := make([]byte, 4096)
		for {
			n, err := conn.Read(buf)
			if err != nil {
				return
			}
			msgs <- string(buf[:n])
		}
	}()
	t.Cleanup(func() { conn.Close() })
	return msgs
}

// expect reads messages until one satisfies ok, failing after 10 s; it
// returns the messages read before it.
func expect(t *testing.T, msgs <-chan string, what string, ok func(string) bool) []string {
	t.Helper()
	var before []string
	timeout := time.After(10 * time.Second)
	for {
		select {
		case m := <-msgs:
			if ok(m) {
				return before
			}
			before = append(before, m)
		case <-timeout:
			t.Fatalf("no %s within 10s; got %q", what, before)
		}
	}
}

func is(s string) func(string) bool { return func(m string) bool { return m == s } }

func prefix(s string) func(string) bool {
	return func(m string) bool { return strings.HasPrefix(m, s) }
}

const notifyProfiles = `{"pools": [{"name": "a", "gpus": [0]}],
  "profiles": [{"id": "m", "model": "m", "command": ["true", "{port}"]}]}`

// TestSystemdNotifications runs the daemon in-process under a fake systemd
// and checks what it tells systemd: READY once it listens, a STATUS line per
// pool, RELOADING then READY around a reload (by the watcher and by SIGHUP,
// accepted or refused), and STOPPING at shutdown.
func TestSystemdNotifications(t *testing.T) {
	msgs := fakeSystemd(t)
	dir := t.TempDir()
	path := filepath.Join(dir, "profiles.json")
	if err := os.WriteFile(path, []byte(notifyProfiles), 0o644); err != nil {
		t.Fatal(err)
	}
	s, err := loadSettings([]string{"--listen", "127.0.0.1:0", "--profiles", path, "--state-dir", filepath.Join(dir, "state"), "--reload-debounce", "0s"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- run(ctx, s, slog.New(slog.DiscardHandler)) }()

	expect(t, msgs, "READY=1", is("READY=1"))
	expect(t, msgs, "STATUS for pool a", is("STATUS=a empty"))

	// The watcher sees a new file with a second pool.
	next := strings.Replace(notifyProfiles, `{"name": "a", "gpus": [0]}`, `{"name": "a", "gpus": [0]}, {"name": "b", "gpus": [1]}`, 1)
	if err := os.WriteFile(path, []byte(next), 0o644); err != nil {
		t.Fatal(err)
	}
	expect(t, msgs, "RELOADING=1", prefix("RELOADING=1\nMONOTONIC_USEC="))
	expect(t, msgs, "READY=1 after the reload", is("READY=1"))
	expect(t, msgs, "STATUS with pool b", is("STATUS=a empty; b empty"))

	// A bad file is refused, still between RELOADING and READY; so is
	// the reload SIGHUP asks for.
	if err := os.WriteFile(path, []byte(`{"pools": []}`), 0o644); err != nil {
		t.Fatal(err)
	}
	expect(t, msgs, "RELOADING=1 for the bad file", prefix("RELOADING=1"))
	expect(t, msgs, "READY=1 after the refusal", is("READY=1"))
	expect(t, msgs, "STATUS noting the refusal", is("STATUS=a empty; b empty; last profiles reload refused"))
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	expect(t, msgs, "RELOADING=1 on SIGHUP", prefix("RELOADING=1"))
	expect(t, msgs, "READY=1 after SIGHUP", is("READY=1"))

	cancel()
	expect(t, msgs, "STOPPING=1", is("STOPPING=1"))
	if err := <-done; err != nil {
		t.Fatalf("run: %v", err)
	}
}

// TestWatchdogStopsWhenAPoolIsStuck drives supervise's health checks one by
// one: each healthy check pings, a failing one does not (and says why once).
func TestWatchdogStopsWhenAPoolIsStuck(t *testing.T) {
	msgs := fakeSystemd(t)
	t.Setenv("WATCHDOG_USEC", "20000") // checks every 10 ms
	t.Setenv("WATCHDOG_PID", "")
	results := make(chan error)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		newNotifier(slog.New(slog.DiscardHandler)).supervise(ctx, time.Hour,
			func() string { return "a ready m" },
			func() error { return <-results })
	}()
	defer func() { cancel(); <-done }()
	answer := func(err error) {
		select {
		case results <- err:
		case <-time.After(10 * time.Second):
			t.Fatal("supervise did not check health")
		}
	}

	expect(t, msgs, "the first STATUS", is("STATUS=a ready m"))
	answer(nil)
	expect(t, msgs, "a ping while healthy", is("WATCHDOG=1"))
	stuck := errors.New(`pool "a": its state has been locked for over 5s`)
	answer(stuck)
	answer(stuck)
	answer(nil)
	// Two failed checks made one STATUS and no ping: the next message is the
	// STATUS, and the one after it the ping of the last, healthy check.
	if before := expect(t, msgs, "a ping once healthy again", is("WATCHDOG=1")); len(before) != 1 || before[0] != "STATUS=unhealthy: "+stuck.Error() {
		t.Fatalf("messages while stuck: %q, want only the unhealthy STATUS", before)
	}
}
