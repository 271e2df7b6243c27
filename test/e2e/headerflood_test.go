package e2e

// A header flood: connections sending about a megabyte of
// headers that never end, before any authentication. The memory they cost is
// bounded by header-bytes-budget and returned once they are gone
// (docs/security.md, docs/reliability.md).

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// The flood: floodBlock bytes of one header block on each connection, under
// a max-header-bytes of 1 MiB (net/http's default, the attack's setting).
const (
	floodBlock          = 1_000_000
	floodMaxHeaderBytes = 1 << 20
)

// floodBound is the RSS growth a header flood may cause under a budget of
// budget bytes held by conns connections: the parser's copy of a header
// block grows by appending (up to twice its bytes with the copy being
// made) and the garbage collector lets the heap reach twice its live size
// (GOGC=100), four times the budget; each connection costs besides what it
// costs without headers (its goroutine's stack, its buffered reader and
// writer, the server's conn: 32 KiB is generous); and 16 MiB is left to the
// runtime's own. Built with the race detector, every byte of heap touched
// is shadowed by two more and its metadata by half of one: three times it
// all (measured: 2.4 to 3 times the growth without it).
func floodBound(budget int64, conns int) int64 {
	b := 4*budget + int64(conns)*(32<<10) + 16<<20
	if raceEnabled {
		b *= 3
	}
	return b
}

// floodReturned is how far above its RSS before the flood a daemon may stay
// once the flood under budget is gone: half the budget (what the heap may
// keep of its peak, the pools of buffered readers and goroutine stacks among
// them) and 8 MiB. Built with the race detector, it stays higher whatever
// it returns: the race runtime keeps the shadow of the heap it grew to,
// which FreeOSMemory does not release; only the bound on the peak is
// checked then.
func floodReturned(budget int64) int64 { return budget/2 + 8<<20 }

// headerFlood opens conns connections to addr, each sending floodBlock bytes
// of a header block that never ends, and returns once every one has sent them
// or been refused; its connections stay open until the test ends or close
// is called.
func headerFlood(t *testing.T, addr string, conns int) (close func()) {
	t.Helper()
	raiseFileLimit(t, uint64(conns)+256)
	head := "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Flood: "
	chunk := []byte(strings.Repeat("f", 64<<10))
	var (
		mu   sync.Mutex // guards open
		open []net.Conn
		wg   sync.WaitGroup
	)
	for range conns {
		wg.Go(func() {
			c, err := net.Dial("tcp", addr)
			if err != nil {
				t.Errorf("dialing the flood: %v", err)
				return
			}
			mu.Lock()
			open = append(open, c)
			mu.Unlock()
			_ = c.SetWriteDeadline(time.Now().Add(30 * time.Second))
			sent, err := c.Write([]byte(head))
			for err == nil && sent < floodBlock { // an error: refused
				var n int
				n, err = c.Write(chunk[:min(len(chunk), floodBlock-sent)])
				sent += n
			}
		})
	}
	wg.Wait()
	close = func() {
		mu.Lock()
		defer mu.Unlock()
		for _, c := range open {
			c.Close()
		}
		open = nil
	}
	t.Cleanup(close)
	return close
}

// unreadBytes is what the connections to port hold that the daemon on it
// has not read yet, from /proc/net/tcp: its sockets' rx_queue and the
// clients' tx_queue.
func unreadBytes(t *testing.T, port int) int64 {
	t.Helper()
	b, err := os.ReadFile("/proc/net/tcp")
	if err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf(":%04X", port)
	var sum int64
	for line := range strings.Lines(string(b)) {
		f := strings.Fields(line)
		// sl local_address rem_address st tx_queue:rx_queue ...
		if len(f) < 5 {
			continue
		}
		tx, rx, _ := strings.Cut(f[4], ":")
		queue := ""
		switch {
		case strings.HasSuffix(f[1], want):
			queue = rx
		case strings.HasSuffix(f[2], want):
			queue = tx
		default:
			continue
		}
		n, err := strconv.ParseInt(queue, 16, 64)
		if err != nil {
			t.Fatalf("/proc/net/tcp queues %q: %v", f[4], err)
		}
		sum += n
	}
	return sum
}

// waitRead waits until the daemon on addr has read everything sent to it.
func waitRead(t *testing.T, addr string) {
	t.Helper()
	_, p, _ := net.SplitHostPort(addr)
	port, _ := strconv.Atoi(p)
	deadline := time.Now().Add(30 * time.Second)
	for unreadBytes(t, port) > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the daemon did not read the flood within 30s: %d bytes unread", unreadBytes(t, port))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// checkFlood measures pid's memory around a flood of conns connections to
// addr under budget: its peak growth (VmHWM at the end over the RSS before) is bounded,
// serve answers during the flood, and the RSS comes back down once the
// flood's connections are closed; refused reads the daemon's count of
// refused connections.
func checkFlood(t *testing.T, pid int, addr string, conns int, budget int64, serve func(), refused func() float64) {
	t.Helper()
	serve() // the first request's allocations are not the flood's
	before := procMemory(t, pid, "VmRSS")
	closeFlood := headerFlood(t, addr, conns)
	waitRead(t, addr)
	n := refused()
	t.Logf("%d connections × %d bytes of headers, %v refused: RSS %d MiB before, %d MiB once read", conns, floodBlock, n, before>>20, procMemory(t, pid, "VmRSS")>>20)
	if n <= 0 {
		t.Errorf("no connection of the flood refused (%v)", n)
	}
	serve()
	closeFlood()
	wait := 30 * time.Second
	if raceEnabled {
		wait = 5 * time.Second // long enough to log what came back
	}
	deadline := time.Now().Add(wait)
	rss := procMemory(t, pid, "VmRSS")
	returned := floodReturned(budget)
	for rss > before+returned && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
		rss = procMemory(t, pid, "VmRSS")
	}
	// The peak includes the flood's end: the server's parser copies what
	// it holds of a connection's headers when the connection closes.
	peak := procMemory(t, pid, "VmHWM")
	bound := floodBound(budget, conns)
	t.Logf("RSS %d MiB after the flood; peak %d MiB (growth %d MiB, bound %d MiB)", rss>>20, peak>>20, (peak-before)>>20, bound>>20)
	if peak-before > bound {
		t.Errorf("the flood grew RSS by %d MiB at its peak, over the %d MiB that a budget of %d MiB allows", (peak-before)>>20, bound>>20, budget>>20)
	}
	if rss > before+returned && !raceEnabled {
		t.Errorf("RSS %d MiB %s after the flood, not back within %d MiB of the %d MiB before", rss>>20, wait, returned>>20, before>>20)
	}
	serve()
}

// 300 connections each sending a megabyte of headers that never end, with
// max-header-bytes at 1 MiB and a 16 MiB budget: poold's memory grows by
// about the budget, not the flood's 300 MB; a real request is served during
// the flood; the memory is returned to the OS once the flood is gone.
func TestHeaderFloodBounded(t *testing.T) {
	const budget = 16 << 20
	tag := t.Name()
	d := startPoold(t, tag, profilesJSON(tag, []pool{{Name: "p0", GPUs: []int{0}, Default: "m"}}, []sim{{ID: "m"}}, nil),
		"--max-header-bytes", strconv.Itoa(floodMaxHeaderBytes), "--header-bytes-budget", strconv.Itoa(budget), "--read-header-timeout", "2m")
	d.waitPool("p0", 20*time.Second, "ready", func(p poolView) bool { return p.State == "ready" })
	checkFlood(t, d.cmd.Process.Pid, strings.TrimPrefix(d.url, "http://"), 300, budget, func() { stillServes(t, d, "m") },
		func() float64 { return d.metricValue("poold_header_budget_refused_connections_total") })
}

// The same flood, smaller, against fleetd.
func TestFleetHeaderFloodBounded(t *testing.T) {
	const budget = 8 << 20
	tag := t.Name()
	host := startPoold(t, tag, hostProfiles(tag, "m", []string{"m"}))
	f := startFleetd(t, []*daemon{host}, "--max-header-bytes", strconv.Itoa(floodMaxHeaderBytes), "--header-bytes-budget", strconv.Itoa(budget), "--read-header-timeout", "2m")
	serve := func() {
		t.Helper()
		code, _, body, err := f.post(context.Background(), fmt.Sprintf(shortChat, "m"))
		if err != nil || code != http.StatusOK {
			t.Fatalf("fleetd stopped serving: %d %v %s", code, err, body)
		}
	}
	// fleetd's /metrics read as a daemon's: metricValue needs only its URL.
	metrics := &daemon{t: t, url: f.url}
	checkFlood(t, f.cmd.Process.Pid, strings.TrimPrefix(f.url, "http://"), 150, budget, serve,
		func() float64 { return metrics.metricValue("fleetd_header_budget_refused_connections_total") })
}
