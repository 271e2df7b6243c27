// Package gpu reads GPU telemetry (memory, utilisation, temperature, power and
// compute processes per GPU) through NVML, and implements the stop contract's
// last step: waiting until a stopped engine's GPU memory is released.
//
// Where NVML is absent the provider is Unavailable: it reads nothing and says
// why, once in the log and in /status.
package gpu

import (
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"

	"golang.org/x/sync/singleflight"

	"github.com/poold/poold/internal/statusapi"
)

// Device is one GPU's telemetry at one moment, in the shape /status shows
// it. Index is NVML's index (the one nvidia-smi shows), which is what a pool's
// "gpus" list names.
type Device = statusapi.GPU

// ECCErrors are a GPU's volatile ECC error counts.
type ECCErrors = statusapi.ECCErrors

// Process is one compute process on a GPU. UsedBytes is 0 when NVML cannot
// tell (as in some containers).
type Process = statusapi.GPUProcess

// Provider reads GPU telemetry. Implementations are safe for concurrent use.
type Provider interface {
	// Available reports whether telemetry can be read, and if not, why.
	Available() (ok bool, reason string)
	// Devices reads every GPU, in index order.
	Devices() ([]Device, error)
}

// ErrUnavailable is returned by Unavailable.Devices.
var ErrUnavailable = errors.New("gpu telemetry unavailable")

// Unavailable is the no-op provider used where NVML is absent; Reason says why.
type Unavailable struct{ Reason string }

// Available implements Provider.
func (u Unavailable) Available() (bool, string) { return false, u.Reason }

// Devices implements Provider: it always fails with ErrUnavailable.
func (u Unavailable) Devices() ([]Device, error) {
	return nil, fmt.Errorf("%w: %s", ErrUnavailable, u.Reason)
}

// Open returns the NVML provider, or Unavailable (logged once, at info level)
// when NVML cannot be loaded or initialised. close releases NVML; it is a no-op
// for Unavailable.
func Open(log *slog.Logger) (p Provider, close func()) {
	p, close, err := openNVML()
	if err != nil {
		log.Info("GPU telemetry unavailable", "reason", err.Error())
		return Unavailable{Reason: err.Error()}, func() {}
	}
	return p, close
}

// Select returns the devices whose index is in indexes, in the order of indexes;
// indexes no device has are left out.
func Select(devs []Device, indexes []int) []Device {
	out := make([]Device, 0, len(indexes))
	for _, i := range indexes {
		if j := slices.IndexFunc(devs, func(d Device) bool { return d.Index == i }); j >= 0 {
			out = append(out, devs[j])
		}
	}
	return out
}

// NotReleasedError reports GPU memory still held after a stopped engine's
// release wait ran out: Holders maps each of the pool's GPUs that failed the
// check to the pids NVML still lists on it.
type NotReleasedError struct {
	Holders map[int][]int
	// Engine is the pids, among the holders, that belonged to the stopped engine;
	// the others are foreign.
	Engine []int
	Waited string
}

func (e *NotReleasedError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "gpu memory not released after %s:", e.Waited)
	for _, idx := range sortedKeys(e.Holders) {
		pids := e.Holders[idx]
		var foreign []int
		for _, pid := range pids {
			if !slices.Contains(e.Engine, pid) {
				foreign = append(foreign, pid)
			}
		}
		fmt.Fprintf(&b, " gpu %d lists pids %v (foreign %v);", idx, pids, foreign)
	}
	return strings.TrimSuffix(b.String(), ";")
}

func sortedKeys(m map[int][]int) []int {
	keys := make([]int, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// Shared returns a Provider whose concurrent Devices calls share one read of
// p: /status, a metrics scrape and a pool's VRAM check arriving together cost
// one NVML read, not three. Callers must not modify the devices returned:
// they may be shared.
func Shared(p Provider) Provider { return &shared{p: p} }

type shared struct {
	p     Provider
	reads singleflight.Group
}

func (s *shared) Available() (bool, string) { return s.p.Available() }

func (s *shared) Devices() ([]Device, error) {
	v, err, _ := s.reads.Do("", func() (any, error) { return s.p.Devices() })
	devs, _ := v.([]Device)
	return devs, err
}
