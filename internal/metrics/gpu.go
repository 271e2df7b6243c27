package metrics

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/poold/poold/internal/statusapi"
)

var (
	gpuAvailableDesc = prometheus.NewDesc("poold_gpu_telemetry_available", "1 if the last scrape read GPU telemetry through NVML, 0 if NVML is absent or failed.", nil, nil)
	gpuUsedDesc      = prometheus.NewDesc("poold_gpu_memory_used_bytes", "GPU memory in use, per GPU (NVML index).", []string{"gpu", "uuid"}, nil)
	gpuTotalDesc     = prometheus.NewDesc("poold_gpu_memory_total_bytes", "GPU memory in total, per GPU.", []string{"gpu", "uuid"}, nil)
	gpuUtilDesc      = prometheus.NewDesc("poold_gpu_utilization_ratio", "Fraction of NVML's last sample period during which a kernel ran, per GPU.", []string{"gpu", "uuid"}, nil)
	gpuTempDesc      = prometheus.NewDesc("poold_gpu_temperature_celsius", "GPU core temperature.", []string{"gpu", "uuid"}, nil)
	gpuPowerDesc     = prometheus.NewDesc("poold_gpu_power_watts", "GPU power draw.", []string{"gpu", "uuid"}, nil)
	gpuProcsDesc     = prometheus.NewDesc("poold_gpu_processes", "Compute processes on the GPU.", []string{"gpu", "uuid"}, nil)
	gpuECCDesc       = prometheus.NewDesc("poold_gpu_ecc_errors_total", "ECC memory errors since the driver last loaded (NVML's volatile counters), by type (corrected, uncorrected); absent where ECC is off.", []string{"gpu", "uuid", "type"}, nil)
)

// GPUs reads the GPUs' telemetry, as gpu.Provider does. The collector asks
// for no more, so that this package links no NVML.
type GPUs interface {
	Devices() ([]statusapi.GPU, error)
}

// GPUCollector exports p's telemetry, read at scrape time. Where p cannot read
// (no NVML), only poold_gpu_telemetry_available (0) is exported; a GPU
// without ECC has no ECC series.
func GPUCollector(p GPUs) prometheus.Collector { return &gpuCollector{p: p} }

type gpuCollector struct{ p GPUs }

func (c *gpuCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{gpuAvailableDesc, gpuUsedDesc, gpuTotalDesc, gpuUtilDesc, gpuTempDesc, gpuPowerDesc, gpuProcsDesc, gpuECCDesc} {
		ch <- d
	}
}

func (c *gpuCollector) Collect(ch chan<- prometheus.Metric) {
	devs, err := c.p.Devices()
	if err != nil {
		ch <- prometheus.MustNewConstMetric(gpuAvailableDesc, prometheus.GaugeValue, 0)
		return
	}
	ch <- prometheus.MustNewConstMetric(gpuAvailableDesc, prometheus.GaugeValue, 1)
	for _, d := range devs {
		idx := strconv.Itoa(d.Index)
		gauge := func(desc *prometheus.Desc, v float64) {
			ch <- prometheus.MustNewConstMetric(desc, prometheus.GaugeValue, v, idx, d.UUID)
		}
		gauge(gpuUsedDesc, float64(d.MemoryUsedBytes))
		gauge(gpuTotalDesc, float64(d.MemoryTotalBytes))
		gauge(gpuUtilDesc, d.Utilization)
		gauge(gpuTempDesc, float64(d.TemperatureC))
		gauge(gpuPowerDesc, d.PowerWatts)
		gauge(gpuProcsDesc, float64(len(d.Processes)))
		if e := d.ECCErrors; e != nil {
			ch <- prometheus.MustNewConstMetric(gpuECCDesc, prometheus.CounterValue, float64(e.Corrected), idx, d.UUID, "corrected")
			ch <- prometheus.MustNewConstMetric(gpuECCDesc, prometheus.CounterValue, float64(e.Uncorrected), idx, d.UUID, "uncorrected")
		}
	}
}
