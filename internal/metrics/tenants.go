package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// FileReload is the state of the loads of one watched file: whether the
// last load succeeded (poold_<name>_last_reload_successful) and when the
// last good one was (…_last_reload_success_timestamp_seconds).
type FileReload struct {
	ok, at prometheus.Gauge
}

// newFileReload makes the gauges of the file named name in the metric names
// and what in their help.
func newFileReload(name, what string) FileReload {
	return FileReload{
		ok: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "poold_" + name + "_last_reload_successful", Help: "1 if the last " + what + " file load succeeded (a refused file leaves the previous one in force).",
		}),
		at: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "poold_" + name + "_last_reload_success_timestamp_seconds", Help: "Unix time of the last successful " + what + " file load.",
		}),
	}
}

// NewTenantsReload registers the tenants file's reload gauges on reg: only
// when a tenants file is in force.
func NewTenantsReload(reg prometheus.Registerer) FileReload {
	f := newFileReload("tenants", "tenants")
	reg.MustRegister(f.ok, f.at)
	return f
}

// Loaded records a load of the file at at: good or refused.
func (f FileReload) Loaded(ok bool, at time.Time) {
	if !ok {
		f.ok.Set(0)
		return
	}
	f.ok.Set(1)
	f.at.Set(float64(at.UnixNano()) / 1e9)
}
