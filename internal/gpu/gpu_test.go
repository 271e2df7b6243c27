package gpu

import (
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// fakeProvider serves scripted readings: each Devices call returns the next
// one, and the last one forever after.
type fakeProvider struct {
	mu    sync.Mutex // guards reads and calls
	reads [][]Device
	calls int
}

func (f *fakeProvider) Available() (bool, string) { return true, "" }

func (f *fakeProvider) Devices() ([]Device, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	i := min(f.calls, len(f.reads)-1)
	f.calls++
	return f.reads[i], nil
}

const gib = 1 << 30

func dev(index int, used uint64, procs ...Process) Device {
	return Device{Index: index, UUID: "GPU-" + string(rune('a'+index)), MemoryUsedBytes: used, MemoryTotalBytes: 80 * gib, Processes: procs}
}

func TestOpenWithoutNVMLIsUnavailable(t *testing.T) {
	var log strings.Builder
	p, closeFn := Open(slog.New(slog.NewTextHandler(&log, nil)))
	defer closeFn()
	ok, reason := p.Available()
	if ok {
		t.Skip("NVML is present on this machine")
	}
	if reason == "" {
		t.Fatal("unavailable provider gives no reason")
	}
	if _, err := p.Devices(); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("Devices: %v, want ErrUnavailable", err)
	}
	if n := strings.Count(log.String(), "GPU telemetry unavailable"); n != 1 {
		t.Fatalf("logged the absence %d times, want once:\n%s", n, log.String())
	}
}

func TestSelect(t *testing.T) {
	devs := []Device{dev(0, 0), dev(1, 0), dev(2, 0)}
	got := Select(devs, []int{2, 0, 7})
	if len(got) != 2 || got[0].Index != 2 || got[1].Index != 0 {
		t.Fatalf("Select: %+v", got)
	}
}

func TestReleaseWaitsForPidsAndMemory(t *testing.T) {
	engine := []Process{{PID: 100, UsedBytes: 30 * gib}, {PID: 101, UsedBytes: 10 * gib}}
	f := &fakeProvider{reads: [][]Device{
		{dev(0, 45*gib, append(engine, Process{PID: 7, UsedBytes: 5 * gib})...), dev(1, 1*gib)}, // before the stop
		{dev(0, 45*gib, engine[1], Process{PID: 7, UsedBytes: 5 * gib}), dev(1, 1*gib)},         // 101 lingers
		{dev(0, 40*gib, Process{PID: 7, UsedBytes: 5 * gib}), dev(1, 1*gib)},                    // pids gone, memory not yet
		{dev(0, 5*gib, Process{PID: 7, UsedBytes: 5 * gib}), dev(1, 1*gib)},                     // released
	}}
	r := &Releaser{Provider: f, Timeout: time.Minute}
	wait := r.Watch([]int{0, 1}, []int{100, 101, 102})
	if err := wait(); err != nil {
		t.Fatalf("release: %v", err)
	}
	if f.calls != 4 {
		t.Fatalf("released after %d readings, want 4", f.calls)
	}
}

func TestReleaseWithoutVisibleMemoryNeedsOnlyThePidsGone(t *testing.T) {
	f := &fakeProvider{reads: [][]Device{
		{dev(0, 2*gib, Process{PID: 100})}, // NVML could not tell the usage
		{dev(0, 3*gib)},                    // someone else allocated meanwhile
	}}
	r := &Releaser{Provider: f, Timeout: time.Minute}
	if err := r.Watch([]int{0}, []int{100})(); err != nil {
		t.Fatalf("release: %v", err)
	}
}

func TestReleaseTimeoutNamesForeignPids(t *testing.T) {
	f := &fakeProvider{reads: [][]Device{
		{dev(0, 20*gib, Process{PID: 100, UsedBytes: 15 * gib}, Process{PID: 7, UsedBytes: 5 * gib}), dev(3, 0)},
		{dev(0, 20*gib, Process{PID: 7, UsedBytes: 5 * gib}), dev(3, 0)}, // the driver still holds the memory
	}}
	r := &Releaser{Provider: f, Timeout: 30 * time.Millisecond}
	err := r.Watch([]int{0, 3}, []int{100})()
	var nr *NotReleasedError
	if !errors.As(err, &nr) {
		t.Fatalf("err = %v, want *NotReleasedError", err)
	}
	if len(nr.Holders) != 1 || len(nr.Holders[0]) != 1 || nr.Holders[0][0] != 7 {
		t.Fatalf("holders %v, want gpu 0: [7]", nr.Holders)
	}
	if want := "gpu 0 lists pids [7] (foreign [7])"; !strings.Contains(err.Error(), want) {
		t.Fatalf("error %q does not say %q", err, want)
	}
}

func TestReleaseReportsUnreadableGPUs(t *testing.T) {
	r := &Releaser{Provider: Unavailable{Reason: "no driver"}}
	if err := r.Watch([]int{0}, []int{1})(); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("err = %v, want ErrUnavailable", err)
	}
}

func TestWatchSleepNeedsOnlyTheMemoryToDrop(t *testing.T) {
	engine := Process{PID: 100, UsedBytes: 40 * gib}
	f := &fakeProvider{reads: [][]Device{
		{dev(0, 41*gib, engine)},                                         // before the sleep
		{dev(0, 30*gib, Process{PID: 100, UsedBytes: 29 * gib})},         // offloading
		{dev(0, 1*gib+512<<20, Process{PID: 100, UsedBytes: 512 << 20})}, // asleep: CUDA context left
	}}
	r := &Releaser{Provider: f, Timeout: time.Minute}
	if err := r.WatchSleep([]int{0}, []int{100})(); err != nil {
		t.Fatalf("sleep check: %v", err)
	}
	if f.calls != 3 {
		t.Fatalf("passed after %d readings, want 3", f.calls)
	}
}

func TestWatchSleepTimeoutWhenMemoryStays(t *testing.T) {
	f := &fakeProvider{reads: [][]Device{
		{dev(0, 41*gib, Process{PID: 100, UsedBytes: 40 * gib})},
		{dev(0, 35*gib, Process{PID: 100, UsedBytes: 34 * gib})}, // expandable_segments: little released
	}}
	r := &Releaser{Provider: f, Timeout: 30 * time.Millisecond}
	var nr *NotReleasedError
	if err := r.WatchSleep([]int{0}, []int{100})(); !errors.As(err, &nr) || len(nr.Holders[0]) != 1 {
		t.Fatalf("err = %v, want *NotReleasedError naming gpu 0", err)
	}
}

func TestGPUsReadsThePoolsGPUs(t *testing.T) {
	f := &fakeProvider{reads: [][]Device{{dev(0, 70*gib), dev(1, 10*gib), dev(2, 80*gib)}}}
	r := &Releaser{Provider: f}
	devs, err := r.GPUs([]int{1, 0, 7})
	if err != nil || len(devs) != 2 || devs[0].Index != 1 || devs[0].MemoryUsedBytes != 10*gib || devs[1].Index != 0 || devs[1].MemoryUsedBytes != 70*gib {
		t.Fatalf("GPUs = %+v, %v; want gpus 1 and 0, in that order", devs, err)
	}
	if _, err := r.GPUs([]int{5}); err == nil {
		t.Fatal("GPUs of a GPU no device has: no error")
	}
	r = &Releaser{Provider: Unavailable{Reason: "no driver"}}
	if _, err := r.GPUs([]int{0}); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("GPUs without NVML: %v, want ErrUnavailable", err)
	}
}

// blockingProvider counts its reads and holds each until release is closed.
type blockingProvider struct {
	reads   atomic.Int32
	release chan struct{}
}

func (b *blockingProvider) Available() (bool, string) { return true, "" }

func (b *blockingProvider) Devices() ([]Device, error) {
	b.reads.Add(1)
	<-b.release
	return []Device{{Index: 0, MemoryTotalBytes: 80}}, nil
}

// Concurrent reads through Shared cost one read of the provider.
func TestSharedReads(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := &blockingProvider{release: make(chan struct{})}
		s := Shared(b)
		const callers = 5
		results := make(chan []Device, callers)
		for range callers {
			go func() {
				devs, _ := s.Devices()
				results <- devs
			}()
		}
		synctest.Wait() // every caller is blocked: one in the read, the others on it
		close(b.release)
		for range callers {
			if devs := <-results; len(devs) != 1 || devs[0].MemoryTotalBytes != 80 {
				t.Fatalf("devices %+v", devs)
			}
		}
		if n := b.reads.Load(); n != 1 {
			t.Fatalf("%d reads for %d concurrent callers, want 1", n, callers)
		}
	})
}
