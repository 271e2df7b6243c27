//go:build linux && cgo

package gpu

import (
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
)

// fakeDevice is NVML's own fake of a device, answering what read asks;
// eccOff makes its ECC counters unsupported.
func fakeDevice(eccOff bool) *mock.Device {
	return &mock.Device{
		GetUUIDFunc:        func() (string, nvml.Return) { return "GPU-aaa", nvml.SUCCESS },
		GetNameFunc:        func() (string, nvml.Return) { return "NVIDIA H200", nvml.SUCCESS },
		GetMemoryInfoFunc:  func() (nvml.Memory, nvml.Return) { return nvml.Memory{Total: 80 << 30, Used: 1 << 30}, nvml.SUCCESS },
		GetTemperatureFunc: func(nvml.TemperatureSensors) (uint32, nvml.Return) { return 61, nvml.SUCCESS },
		GetPowerUsageFunc:  func() (uint32, nvml.Return) { return 412500, nvml.SUCCESS },
		GetUtilizationRatesFunc: func() (nvml.Utilization, nvml.Return) {
			return nvml.Utilization{Gpu: 93}, nvml.SUCCESS
		},
		GetComputeRunningProcessesFunc: func() ([]nvml.ProcessInfo, nvml.Return) { return nil, nvml.SUCCESS },
		GetTotalEccErrorsFunc: func(t nvml.MemoryErrorType, c nvml.EccCounterType) (uint64, nvml.Return) {
			switch {
			case eccOff:
				return 0, nvml.ERROR_NOT_SUPPORTED
			case c != nvml.VOLATILE_ECC:
				return 1 << 40, nvml.SUCCESS // aggregate counts: not what is asked for
			case t == nvml.MEMORY_ERROR_TYPE_CORRECTED:
				return 120, nvml.SUCCESS
			}
			return 2, nvml.SUCCESS
		},
	}
}

// The volatile ECC counts are read per GPU; a GPU without ECC has none.
func TestNVMLReadsECCErrors(t *testing.T) {
	for _, eccOff := range []bool{false, true} {
		dev := fakeDevice(eccOff)
		lib := &mock.Interface{
			DeviceGetCountFunc:         func() (int, nvml.Return) { return 1, nvml.SUCCESS },
			DeviceGetHandleByIndexFunc: func(int) (nvml.Device, nvml.Return) { return dev, nvml.SUCCESS },
			ErrorStringFunc:            func(r nvml.Return) string { return "error" },
		}
		devs, err := (&nvmlProvider{lib: lib}).Devices()
		if err != nil || len(devs) != 1 {
			t.Fatalf("Devices: %v, %v", devs, err)
		}
		d := devs[0]
		if d.TemperatureC != 61 || d.Utilization != 0.93 || d.MemoryUsedBytes != 1<<30 {
			t.Errorf("device %+v: the other readings are wrong", d)
		}
		switch e := d.ECCErrors; {
		case eccOff && e != nil:
			t.Errorf("ECC unsupported: counts %+v, want nil", e)
		case !eccOff && (e == nil || e.Corrected != 120 || e.Uncorrected != 2):
			t.Errorf("ECC counts %+v, want 120 corrected and 2 uncorrected (volatile)", e)
		}
	}
}
