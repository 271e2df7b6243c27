package headerbudget

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// serve runs an http.Server answering 200 on 127.0.0.1 behind b.
func serve(t *testing.T, b *Budget) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{
		Handler:   http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "ok") }),
		ConnState: b.ConnState,
	}
	go func() { _ = srv.Serve(b.Listener(ln)) }()
	t.Cleanup(func() { _ = srv.Close() })
	return ln.Addr().String()
}

// flood opens a connection and sends n bytes of a header block that never
// ends.
func flood(t *testing.T, addr string, n int) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	head := "GET / HTTP/1.1\r\nHost: x\r\nX-Flood: "
	if _, err := io.WriteString(c, head+strings.Repeat("f", n-len(head))); err != nil {
		t.Fatal(err)
	}
	return c
}

// waitUsed polls until b holds want bytes.
func waitUsed(t *testing.T, b *Budget, what string, cond func(int64) bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond(b.used.Load()) {
		if time.Now().After(deadline) {
			t.Fatalf("%s not reached within 5s: %d bytes held", what, b.used.Load())
		}
		time.Sleep(time.Millisecond)
	}
}

// A flood of large header blocks takes at most three quarters of the
// budget: the connection that would pass it is answered 503 and closed,
// while a real client's small block still fits and is served; once the
// flood is gone, nothing is held and memory is returned.
func TestFloodRefusedRealClientServed(t *testing.T) {
	const max = 64 << 10
	b := New(max)
	addr := serve(t, b)
	block := 20 << 10 // past smallBlock: two fit under the 48 KiB left to large blocks, not three
	var conns []net.Conn
	for range 2 {
		conns = append(conns, flood(t, addr, block))
	}
	waitUsed(t, b, "two blocks held", func(u int64) bool { return u == int64(2*block) })
	third := flood(t, addr, block)
	_ = third.SetReadDeadline(time.Now().Add(5 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(third), nil)
	if err != nil {
		t.Fatalf("the connection past the budget: %v", err)
	}
	if resp.StatusCode != http.StatusServiceUnavailable || !resp.Close {
		t.Fatalf("the connection past the budget: %d %v", resp.StatusCode, resp.Header)
	}
	if n := b.Refused(); n != 1 {
		t.Fatalf("refused %d connections, want 1", n)
	}
	waitUsed(t, b, "the refused connection released", func(u int64) bool { return u == int64(2*block) })

	got, err := http.Get("http://" + addr + "/")
	if err != nil {
		t.Fatalf("a real client during the flood: %v", err)
	}
	got.Body.Close()
	if got.StatusCode != http.StatusOK {
		t.Fatalf("a real client during the flood: %d", got.StatusCode)
	}
	if u := b.used.Load(); u > max {
		t.Fatalf("%d bytes held, over the budget of %d", u, max)
	}

	for _, c := range conns {
		c.Close()
	}
	waitUsed(t, b, "the flood released", func(u int64) bool { return u == 0 })
	deadline := time.Now().Add(5 * time.Second)
	for b.lastFree.Load() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("memory not returned to the OS within 5s of the flood's end")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Small header blocks may use the whole budget: past it even they are
// refused, and nothing is held beyond it.
func TestSmallBlocksBoundedByTheBudget(t *testing.T) {
	const max = 32 << 10
	b := New(max)
	addr := serve(t, b)
	block := 12 << 10 // under smallBlock: two fit in 32 KiB, not three
	flood(t, addr, block)
	flood(t, addr, block)
	waitUsed(t, b, "two blocks held", func(u int64) bool { return u == int64(2*block) })
	c := flood(t, addr, block)
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "HTTP/1.1 503 ") {
		t.Fatalf("the block past the budget: %q %v", line, err)
	}
}

// A keep-alive connection's requests each count their headers only until
// the server has read them, and a request's cycle through the budget (its
// header read, the server's state changes) allocates nothing.
func TestKeepAliveHoldsNothingBetweenRequests(t *testing.T) {
	b := New(1 << 20)
	addr := serve(t, b)
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := bufio.NewReader(c)
	for i := range 3 {
		if _, err := io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(r, nil)
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		waitUsed(t, b, "nothing held after the answer", func(u int64) bool { return u == 0 })
	}

	// The cycle on a connection of our own, outside a server.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	bl := b.Listener(ln)
	client, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	server, err := bl.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer server.Close()
	req := []byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	buf := make([]byte, 4096)
	allocs := testing.AllocsPerRun(100, func() {
		b.ConnState(server, http.StateIdle)
		if _, err := client.Write(req); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(server, buf[:len(req)]); err != nil {
			t.Fatal(err)
		}
		b.ConnState(server, http.StateActive)
	})
	if allocs != 0 {
		t.Fatalf("a request's cycle allocates %v times", allocs)
	}
	if u := b.used.Load(); u != 0 {
		t.Fatalf("%d bytes held after the cycles", u)
	}
}

// Large blocks flooding at once are each refused, and counted, once; what
// they held is given back.
func TestEachRefusedOnce(t *testing.T) {
	b := New(256 << 10)
	addr := serve(t, b)
	const conns = 40
	for i := range conns {
		c := flood(t, addr, 200<<10) // past the 192 KiB large blocks may use
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		line, err := bufio.NewReader(c).ReadString('\n')
		if err != nil || !strings.HasPrefix(line, "HTTP/1.1 503 ") {
			t.Fatalf("connection %d: %q %v", i, line, err)
		}
	}
	waitUsed(t, b, "every refused connection released", func(u int64) bool { return u == 0 })
	if n := b.Refused(); n != conns {
		t.Fatalf("refused %d times for %d connections", n, conns)
	}
}
