package main

import (
	"context"
	"log/slog"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/poold/poold/internal/activity"
	"github.com/poold/poold/internal/gpu"
	"github.com/poold/poold/internal/proxy"
	"github.com/poold/poold/internal/statusapi"
	"github.com/poold/poold/internal/usage"
)

// servedLedger is the usage ledger as serve wires it; nil when it is off,
// and every method is then a no-op that returns nil.
type servedLedger struct{ l *usage.Ledger }

// openUsage opens the usage ledger when it is on. A ledger that cannot be
// opened at the default path (poold run outside systemd, without a state
// directory) only disables it, with a warning; at a path given explicitly
// it is an error.
func openUsage(ctx context.Context, s settings, host string, log *slog.Logger, reg prometheus.Registerer, gpus gpu.Provider) (*servedLedger, error) {
	if !s.Usage.On {
		return nil, nil
	}
	l, err := usage.Open(ctx, usage.Options{Path: s.Usage.DB, Host: host, Logger: log, Registerer: reg,
		Retention: s.Usage.Retention, Postgres: s.Usage.Postgres, GPUModel: gpuModels(gpus)})
	if err != nil && !s.Usage.Explicit {
		log.Warn("no usage ledger: requests and pool time are not recorded", "usage-db", s.Usage.DB, "err", err)
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return &servedLedger{l: l}, nil
}

// gpuModels names the model of a pool's GPUs (its first GPU's, as NVML
// reports it at start-up), or "" without NVML.
func gpuModels(p gpu.Provider) func([]int) string {
	names := map[int]string{}
	if ok, _ := p.Available(); ok {
		if devs, err := p.Devices(); err == nil {
			for _, d := range devs {
				names[d.Index] = d.Name
			}
		}
	}
	return func(gpus []int) string {
		if len(gpus) == 0 {
			return ""
		}
		return names[gpus[0]]
	}
}

func (u *servedLedger) close() {
	if u != nil {
		_ = u.l.Close()
	}
}

func (u *servedLedger) activity() activity.Observer {
	if u == nil {
		return nil
	}
	return u.l
}

func (u *servedLedger) requests() proxy.Usage {
	if u == nil {
		return nil
	}
	return u.l
}

func (u *servedLedger) report(s usageSettings) http.Handler {
	if u == nil {
		return nil
	}
	return usage.Handler(s.DB, s.Prices)
}

func (u *servedLedger) status() *statusapi.Usage {
	if u == nil {
		return nil
	}
	return u.l.Status()
}

// degraded says why the ledger's rows are not all being written, for
// /health and /ready; "" when they are.
func (u *servedLedger) degraded() string {
	if u == nil {
		return ""
	}
	return u.l.Degraded()
}
