package enginesim

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// listenReusePort holds a loopback port with SO_REUSEPORT (or without).
func listenReusePort(t *testing.T, reuse bool) (net.Listener, int) {
	t.Helper()
	lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) {
			if reuse {
				serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, unix.SO_REUSEPORT, 1)
			}
		})
		return errors.Join(err, serr)
	}}
	ln, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln, ln.Addr().(*net.TCPAddr).Port
}

// A taken port fails at once (before the load), with Python's message or
// the newer one, and exit 1.
func TestProcessPortInUse(t *testing.T) {
	t.Parallel()
	_, port := listenReusePort(t, false)
	for _, tc := range []struct {
		flags []string
		line  string
	}{
		{nil, "OSError: [Errno 98] Address already in use"},
		{[]string{"--sim-port-message", "new"}, fmt.Sprintf("Port %d is already in use", port)},
		{[]string{"--sim-port-message", "go"}, fmt.Sprintf("listen tcp 127.0.0.1:%d: bind: address already in use", port)},
		{[]string{"--sim-reuseport"}, "OSError: [Errno 98] Address already in use"}, // the holder did not set SO_REUSEPORT
	} {
		p := startSim(t, append([]string{"m", "--port", strconv.Itoa(port), "--sim-load-delay", "1h"}, tc.flags...)...)
		if st := p.wait(t, 20*time.Second); !st.Exited() || st.ExitStatus() != 1 {
			t.Fatalf("%v: %v, want exit 1", tc.flags, st)
		}
		if !hasLine(p.log(), tc.line) || strings.Contains(p.log(), "loading model") {
			t.Errorf("%v: output lacks %q, or it went on loading:\n%s", tc.flags, tc.line, p.log())
		}
	}
}

// With --sim-reuseport, an engine shares a port that another socket holds
// with SO_REUSEPORT, as some vLLM versions allow: the kernel then splits the
// connections between the two.
func TestProcessReusePort(t *testing.T) {
	t.Parallel()
	holder, port := listenReusePort(t, true)
	p := startSim(t, "m", "--port", strconv.Itoa(port), "--sim-reuseport", "--served-model-name", "shared")
	if got := p.port(t); got != port {
		t.Fatalf("ready on port %d, want %d", got, port)
	}
	// Connections land on either socket; the holder accepts and closes its
	// own. Some reach the engine.
	go func() {
		for {
			c, err := holder.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 5 * time.Second}
	engine := 0
	for i := 0; i < 200 && engine == 0; i++ {
		resp, err := client.Get(fmt.Sprintf("http://127.0.0.1:%d/v1/models", port))
		if err != nil {
			continue // the holder's
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if strings.Contains(string(b), `"id":"shared"`) {
			engine++
		}
	}
	if engine == 0 {
		t.Fatal("no connection reached the engine sharing the port")
	}
}

// Idle client connections close after VLLM_HTTP_TIMEOUT_KEEP_ALIVE seconds,
// as uvicorn closes them; a connection in use stays open.
func TestProcessKeepAliveTimeout(t *testing.T) {
	t.Parallel()
	p := startSimEnv(t, []string{"VLLM_HTTP_TIMEOUT_KEEP_ALIVE=1"}, "m", "--port", "0")
	port := p.port(t)
	conn, err := net.Dial("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	br := bufio.NewReader(conn)
	for i := range 2 { // two requests on one connection: it is kept alive
		fmt.Fprintf(conn, "GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || resp.Close {
			t.Fatalf("request %d: %d, close %v", i, resp.StatusCode, resp.Close)
		}
	}
	start := time.Now()
	_ = conn.SetReadDeadline(time.Now().Add(30 * time.Second))
	if _, err := br.ReadByte(); err != io.EOF {
		t.Fatalf("idle connection: %v, want EOF (closed by the engine)", err)
	}
	t.Logf("idle connection closed after %v", time.Since(start))
}

// An invalid integer in VLLM_HTTP_TIMEOUT_KEEP_ALIVE or VLLM_SERVER_DEV_MODE
// fails at start, as Python's int() does.
func TestProcessBadIntegerEnv(t *testing.T) {
	t.Parallel()
	for _, env := range []string{"VLLM_HTTP_TIMEOUT_KEEP_ALIVE=five", "VLLM_SERVER_DEV_MODE=true"} {
		p := startSimEnv(t, []string{env}, "m", "--port", "0")
		if st := p.wait(t, 20*time.Second); !st.Exited() || st.ExitStatus() != 1 || !strings.Contains(p.log(), "ValueError: invalid literal for int() with base 10") {
			t.Errorf("%s: %v\n%s", env, st, p.log())
		}
	}
}

func TestReadEnv(t *testing.T) {
	env := map[string]string{
		"VLLM_SERVER_DEV_MODE": "1", "VLLM_API_KEY": "k", "VLLM_KEEP_ALIVE_ON_ENGINE_DEATH": "0",
		"VLLM_HTTP_TIMEOUT_KEEP_ALIVE": "7", "CUDA_VISIBLE_DEVICES": "2, 3",
	}
	var cfg Config
	if err := ReadEnv(&cfg, func(k string) string { return env[k] }); err != nil {
		t.Fatal(err)
	}
	// VLLM_KEEP_ALIVE_ON_ENGINE_DEATH is on when set at all, even to "0", as in vLLM.
	if !cfg.DevMode || cfg.APIKey != "k" || !cfg.KeepAliveOnEngineDeath || cfg.KeepAlive != 7*time.Second ||
		len(cfg.VisibleDevices) != 2 || cfg.VisibleDevices[1] != 3 {
		t.Fatalf("%+v", cfg)
	}
	if err := ReadEnv(&cfg, func(string) string { return "" }); err != nil || cfg.DevMode || cfg.KeepAlive != 5*time.Second || cfg.VisibleDevices != nil {
		t.Fatalf("defaults: %+v, %v", cfg, err)
	}
	for _, bad := range []map[string]string{{"VLLM_SERVER_DEV_MODE": "yes"}, {"CUDA_VISIBLE_DEVICES": "GPU-1"}} {
		if err := ReadEnv(&cfg, func(k string) string { return bad[k] }); err == nil {
			t.Errorf("%v accepted", bad)
		}
	}
}
