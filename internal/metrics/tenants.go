package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// TenantsReload is the state of the tenants file's reloads, registered only
// when a tenants file is in force: poold_tenants_last_reload_successful and
// the time of the last good load.
type TenantsReload struct {
	ok, at prometheus.Gauge
}

// NewTenantsReload registers the tenants file's reload gauges on reg.
func NewTenantsReload(reg prometheus.Registerer) *TenantsReload {
	t := &TenantsReload{
		ok: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "poold_tenants_last_reload_successful", Help: "1 if the last tenants file load succeeded (a refused file leaves the previous one in force).",
		}),
		at: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "poold_tenants_last_reload_success_timestamp_seconds", Help: "Unix time of the last successful tenants file load.",
		}),
	}
	reg.MustRegister(t.ok, t.at)
	return t
}

// Loaded records a load of the tenants file at at: good or refused.
func (t *TenantsReload) Loaded(ok bool, at time.Time) {
	if !ok {
		t.ok.Set(0)
		return
	}
	t.ok.Set(1)
	t.at.Set(float64(at.UnixNano()) / 1e9)
}
