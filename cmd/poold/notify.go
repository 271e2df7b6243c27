package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/coreos/go-systemd/v22/daemon"

	"github.com/poold/poold/internal/statusapi"
)

// notifier tells systemd what the daemon is doing (sd_notify). Without
// NOTIFY_SOCKET, as outside systemd, every method does nothing.
type notifier struct {
	log     *slog.Logger
	enabled bool
}

func newNotifier(log *slog.Logger) *notifier {
	return &notifier{log: log.With("component", "systemd"), enabled: os.Getenv("NOTIFY_SOCKET") != ""}
}

func (n *notifier) send(state string) {
	if !n.enabled {
		return
	}
	if _, err := daemon.SdNotify(false, state); err != nil {
		n.log.Warn("sd_notify", "state", state, "err", err)
	}
}

// ready: the listener is bound (or a reload is over).
func (n *notifier) ready() { n.send(daemon.SdNotifyReady) }

// reloading: a reload has begun; ready follows when it is over.
func (n *notifier) reloading() {
	n.send(daemon.SdNotifyReloading + "\n" + daemon.SdNotifyMonotonicUsec())
}

// stopping: the graceful shutdown has begun.
func (n *notifier) stopping() { n.send(daemon.SdNotifyStopping) }

// supervise runs until ctx ends. It sends STATUS=summary() at once and then
// every statusEvery when it changed; and, when systemd's watchdog is on
// (WATCHDOG_USEC), every half watchdog interval it sends WATCHDOG=1 if
// healthy() returns nil. A pool that stops answering thus stops the pings,
// and systemd restarts the daemon; the first failed check also goes to the
// log and to STATUS=.
func (n *notifier) supervise(ctx context.Context, statusEvery time.Duration, summary func() string, healthy func() error) {
	if !n.enabled {
		return
	}
	var ping <-chan time.Time
	if wd, err := daemon.SdWatchdogEnabled(false); err != nil {
		n.log.Warn("reading the systemd watchdog settings", "err", err)
	} else if wd > 0 {
		t := time.NewTicker(wd / 2)
		defer t.Stop()
		ping = t.C
	}
	tick := time.NewTicker(statusEvery)
	defer tick.Stop()
	last := summary()
	n.send("STATUS=" + last)
	failing := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			if failing {
				continue // a stuck pool would block the summary too
			}
			if s := summary(); s != last {
				last = s
				n.send("STATUS=" + s)
			}
		case <-ping:
			if err := healthy(); err != nil {
				if !failing {
					n.log.Error("a pool is stuck; withholding watchdog pings", "err", err)
					n.send("STATUS=unhealthy: " + err.Error())
				}
				failing = true
				continue
			}
			if failing {
				last = "" // send the summary again at the next tick
			}
			failing = false
			n.send(daemon.SdNotifyWatchdog)
		}
	}
}

// poolSummary is the one-line STATUS=: each pool's state and profile, and a
// note when the last reload was refused.
func poolSummary(pools []statusapi.Pool, reloadRefused bool) string {
	parts := make([]string, 0, len(pools)+1)
	for _, p := range pools {
		s := fmt.Sprintf("%s %s", p.Name, p.State)
		switch {
		case p.SwitchingTo != nil:
			s += " → " + *p.SwitchingTo
		case p.Profile != nil:
			s += " " + *p.Profile
		}
		parts = append(parts, s)
	}
	if reloadRefused {
		parts = append(parts, "last profiles reload refused")
	}
	return strings.Join(parts, "; ")
}
