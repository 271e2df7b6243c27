//go:build linux && cgo

package gpu

import (
	"errors"
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// nvmlProvider reads telemetry through an initialised NVML library.
type nvmlProvider struct {
	lib nvml.Interface
}

func openNVML() (Provider, func(), error) {
	lib := nvml.New()
	switch ret := lib.Init(); ret {
	case nvml.SUCCESS:
	case nvml.ERROR_LIBRARY_NOT_FOUND:
		return nil, nil, errors.New("libnvidia-ml.so.1 not found")
	default:
		return nil, nil, fmt.Errorf("initialising NVML: %s", lib.ErrorString(ret))
	}
	return &nvmlProvider{lib: lib}, func() { lib.Shutdown() }, nil
}

func (p *nvmlProvider) Available() (bool, string) { return true, "" }

func (p *nvmlProvider) Devices() ([]Device, error) {
	n, ret := p.lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("counting GPUs: %s", p.lib.ErrorString(ret))
	}
	devs := make([]Device, 0, n)
	for i := range n {
		h, ret := p.lib.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			return nil, fmt.Errorf("gpu %d: %s", i, p.lib.ErrorString(ret))
		}
		d, err := p.read(i, h)
		if err != nil {
			return nil, fmt.Errorf("gpu %d: %w", i, err)
		}
		devs = append(devs, d)
	}
	return devs, nil
}

// read reads one device. Memory and processes are required; utilisation,
// temperature and power are left at zero, and the ECC counts nil, where the
// device does not support them.
func (p *nvmlProvider) read(i int, h nvml.Device) (Device, error) {
	d := Device{Index: i, Processes: []Process{}}
	d.UUID, _ = h.GetUUID()
	d.Name, _ = h.GetName()
	mem, ret := h.GetMemoryInfo()
	if ret != nvml.SUCCESS {
		return d, fmt.Errorf("memory info: %s", p.lib.ErrorString(ret))
	}
	d.MemoryUsedBytes, d.MemoryTotalBytes = mem.Used, mem.Total
	if u, ret := h.GetUtilizationRates(); ret == nvml.SUCCESS {
		d.Utilization = float64(u.Gpu) / 100
	}
	if t, ret := h.GetTemperature(nvml.TEMPERATURE_GPU); ret == nvml.SUCCESS {
		d.TemperatureC = int(t)
	}
	if mw, ret := h.GetPowerUsage(); ret == nvml.SUCCESS {
		d.PowerWatts = float64(mw) / 1000
	}
	d.ECCErrors = p.eccErrors(h)
	procs, ret := h.GetComputeRunningProcesses()
	if ret != nvml.SUCCESS {
		return d, fmt.Errorf("compute processes: %s", p.lib.ErrorString(ret))
	}
	for _, pr := range procs {
		used := pr.UsedGpuMemory
		if used == ^uint64(0) { // NVML_VALUE_NOT_AVAILABLE
			used = 0
		}
		d.Processes = append(d.Processes, Process{PID: int(pr.Pid), UsedBytes: used})
	}
	return d, nil
}

// eccErrors reads the device's volatile ECC error counts, or nil where ECC
// is off or unsupported.
func (p *nvmlProvider) eccErrors(h nvml.Device) *ECCErrors {
	corrected, ret := h.GetTotalEccErrors(nvml.MEMORY_ERROR_TYPE_CORRECTED, nvml.VOLATILE_ECC)
	if ret != nvml.SUCCESS {
		return nil
	}
	uncorrected, ret := h.GetTotalEccErrors(nvml.MEMORY_ERROR_TYPE_UNCORRECTED, nvml.VOLATILE_ECC)
	if ret != nvml.SUCCESS {
		return nil
	}
	return &ECCErrors{Corrected: corrected, Uncorrected: uncorrected}
}
