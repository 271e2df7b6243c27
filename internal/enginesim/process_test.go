package enginesim

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// envRunMain makes the test binary act as `poold engine-sim`, so that process-level
// tests run the real Main in a real process.
const envRunMain = "ENGINESIM_TEST_RUN_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(envRunMain) == "1" {
		os.Exit(Main(os.Args[1:]))
	}
	os.Exit(m.Run())
}

// simProc is a simulator process started by startSim, in its own process group.
type simProc struct {
	cmd    *exec.Cmd
	logf   string        // stdout and stderr of the group
	done   chan struct{} // closed once cmd has been waited for
	status syscall.WaitStatus
}

// startSim runs the simulator with args in a new process group, killed with its
// whole group when the test ends.
func startSim(t *testing.T, args ...string) *simProc {
	t.Helper()
	return startSimEnv(t, nil, args...)
}

// startSimEnv is startSim with env added to the environment.
func startSimEnv(t *testing.T, env []string, args ...string) *simProc {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	p := &simProc{logf: filepath.Join(t.TempDir(), "log"), done: make(chan struct{})}
	f, err := os.Create(p.logf)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	p.cmd = exec.Command(exe, args...)
	p.cmd.Env = append(append(os.Environ(), envRunMain+"=1"), env...)
	p.cmd.Stdout, p.cmd.Stderr = f, f
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		_ = p.cmd.Wait()
		p.status = p.cmd.ProcessState.Sys().(syscall.WaitStatus)
		close(p.done)
	}()
	t.Cleanup(func() {
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		select {
		case <-p.done:
		case <-time.After(10 * time.Second):
			t.Errorf("simulator %d not reaped after SIGKILL", p.cmd.Process.Pid)
		}
		if t.Failed() {
			b, _ := os.ReadFile(p.logf)
			t.Logf("simulator output:\n%s", b)
		}
	})
	return p
}

func (p *simProc) log() string {
	b, _ := os.ReadFile(p.logf)
	return string(b)
}

// hasLine reports whether output has line as a whole line.
func hasLine(output, line string) bool {
	return slices.Contains(strings.Split(output, "\n"), line)
}

func (p *simProc) waitLog(t *testing.T, substr string) {
	t.Helper()
	waitFor(t, 20*time.Second, fmt.Sprintf("log line %q", substr), func() bool { return strings.Contains(p.log(), substr) })
}

var readyPortRE = regexp.MustCompile(`msg=ready .*port=(\d+)`)

// port waits for the "ready" log line and returns its port.
func (p *simProc) port(t *testing.T) int {
	t.Helper()
	var port int
	waitFor(t, 20*time.Second, "the ready line", func() bool {
		m := readyPortRE.FindStringSubmatch(p.log())
		if m == nil {
			return false
		}
		port, _ = strconv.Atoi(m[1])
		return true
	})
	return port
}

// wait waits for the process to exit and returns its wait status.
func (p *simProc) wait(t *testing.T, timeout time.Duration) syscall.WaitStatus {
	t.Helper()
	select {
	case <-p.done:
		return p.status
	case <-time.After(timeout):
		t.Fatalf("simulator still running after %v", timeout)
		return 0
	}
}

func (p *simProc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

func TestProcessLoadDelayRefusesThenServes(t *testing.T) {
	t.Parallel()
	port := freePort(t)
	p := startSim(t, "/models/x", "--port", strconv.Itoa(port), "--served-model-name", "x", "--sim-load-delay", "2s")
	p.waitLog(t, "loading model")
	_, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), time.Second)
	if !errors.Is(err, syscall.ECONNREFUSED) {
		if strings.Contains(p.log(), "msg=ready") {
			t.Skip("machine too slow: the load delay passed before the first dial")
		}
		t.Fatalf("dial during load: %v, want connection refused", err)
	}
	url := fmt.Sprintf("http://127.0.0.1:%d", port)
	waitFor(t, 20*time.Second, "/health to answer", func() bool {
		resp, err := http.Get(url + "/health")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	})
	resp, err := http.Get(url + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(b), `"id":"x"`) {
		t.Fatalf("/v1/models: %d %s", resp.StatusCode, b)
	}
	if p.port(t) != port {
		t.Fatalf("ready line port %d, want %d", p.port(t), port)
	}
	if err := syscall.Kill(p.cmd.Process.Pid, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if st := p.wait(t, 10*time.Second); !st.Exited() || st.ExitStatus() != 0 {
		t.Fatalf("after SIGTERM: %v, want exit 0", st)
	}
}

func TestProcessFailLoad(t *testing.T) {
	t.Parallel()
	p := startSim(t, "m", "--port", "0", "--sim-load-delay", "50ms", "--sim-fail-load")
	if st := p.wait(t, 20*time.Second); !st.Exited() || st.ExitStatus() != 1 {
		t.Fatalf("status %v, want exit 1", st)
	}
	if log := p.log(); !strings.Contains(log, "simulated load failure: CUDA out of memory") || strings.Contains(log, "msg=ready") {
		t.Fatalf("log:\n%s", log)
	}
}

func TestProcessBadFlagExits2(t *testing.T) {
	t.Parallel()
	p := startSim(t, "m", "--no-such-flag")
	if st := p.wait(t, 20*time.Second); !st.Exited() || st.ExitStatus() != 2 {
		t.Fatalf("status %v, want exit 2", st)
	}
	if !strings.Contains(p.log(), "unrecognized arguments: --no-such-flag") {
		t.Fatalf("log:\n%s", p.log())
	}
}

func TestProcessExitAfterReady(t *testing.T) {
	t.Parallel()
	p := startSim(t, "m", "--port", "0", "--sim-exit-after-ready", "100ms")
	p.port(t)
	if st := p.wait(t, 20*time.Second); !st.Exited() || st.ExitStatus() != 1 {
		t.Fatalf("status %v, want exit 1", st)
	}
}

func TestProcessCrashAfterTokens(t *testing.T) {
	t.Parallel()
	p := startSim(t, "m", "--port", "0", "--sim-crash-after-tokens", "3", "--sim-itl", "5ms")
	url := fmt.Sprintf("http://127.0.0.1:%d/v1/chat/completions", p.port(t))
	resp, err := http.Post(url, "application/json", strings.NewReader(
		`{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":50,"stream":true}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	tokens, done := 0, false
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		tokens += strings.Count(sc.Text(), `"delta":{"content":"tok`)
		done = done || sc.Text() == "data: [DONE]"
	}
	if sc.Err() == nil || done || tokens != 3 {
		t.Fatalf("stream: %d tokens, [DONE] %v, read error %v; want 3 tokens then a broken stream", tokens, done, sc.Err())
	}
	if st := p.wait(t, 20*time.Second); !st.Signaled() || st.Signal() != syscall.SIGKILL {
		t.Fatalf("status %v, want killed by SIGKILL", st)
	}
}

func TestProcessSigtermAbortsStreams(t *testing.T) {
	t.Parallel()
	p := startSim(t, "m", "--port", "0", "--sim-itl", "50ms")
	url := fmt.Sprintf("http://127.0.0.1:%d/v1/completions", p.port(t))
	resp, err := http.Post(url, "application/json", strings.NewReader(`{"model":"m","prompt":"x","max_tokens":1000,"stream":true}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	if _, err := br.ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(p.cmd.Process.Pid, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if st := p.wait(t, 5*time.Second); !st.Exited() || st.ExitStatus() != 0 {
		t.Fatalf("status %v, want exit 0", st)
	}
	if b, err := io.ReadAll(br); err == nil || strings.Contains(string(b), "[DONE]") {
		t.Fatalf("stream survived the shutdown: %v", err)
	}
}

func TestProcessIgnoreSigterm(t *testing.T) {
	t.Parallel()
	p := startSim(t, "m", "--port", "0", "--sim-ignore-sigterm")
	url := fmt.Sprintf("http://127.0.0.1:%d/health", p.port(t))
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT} {
		if err := syscall.Kill(p.cmd.Process.Pid, sig); err != nil {
			t.Fatal(err)
		}
		p.waitLog(t, "ignoring signal (--sim-ignore-sigterm)\" component=enginesim signal="+sig.String())
	}
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("health after SIGTERM: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 || p.exited() {
		t.Fatalf("health %d, exited %v", resp.StatusCode, p.exited())
	}
}

func TestProcessNeverReady(t *testing.T) {
	t.Parallel()
	p := startSim(t, "m", "--port", "0", "--sim-never-ready")
	p.waitLog(t, "never becoming ready")
	if strings.Contains(p.log(), "msg=ready") {
		t.Fatal("never-ready simulator became ready")
	}
	if err := syscall.Kill(p.cmd.Process.Pid, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if st := p.wait(t, 10*time.Second); !st.Exited() || st.ExitStatus() != 0 {
		t.Fatalf("status %v, want exit 0", st)
	}
}

// procStat returns the state, parent pid and process group of pid from /proc.
func procStat(pid int) (state byte, ppid, pgrp int, err error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, 0, 0, err
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')') // the command name may contain spaces
	f := strings.Fields(s[i+1:])       // state ppid pgrp ...
	if len(f) < 3 {
		return 0, 0, 0, fmt.Errorf("short /proc/%d/stat: %q", pid, s)
	}
	ppid, _ = strconv.Atoi(f[1])
	pgrp, _ = strconv.Atoi(f[2])
	return f[0][0], ppid, pgrp, nil
}

// alive reports whether pid exists and is not a zombie.
func alive(pid int) bool {
	state, _, _, err := procStat(pid)
	return err == nil && state != 'Z' && state != 'X'
}

// childrenOf lists the live processes whose parent is ppid.
func childrenOf(t *testing.T, ppid int) []int {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var kids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if _, pp, _, err := procStat(pid); err == nil && pp == ppid && alive(pid) {
			kids = append(kids, pid)
		}
	}
	return kids
}

// ignoresSIGTERM reads the SigIgn mask of pid.
func ignoresSIGTERM(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return false
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if hex, ok := strings.CutPrefix(line, "SigIgn:"); ok {
			mask, err := strconv.ParseUint(strings.TrimSpace(hex), 16, 64)
			return err == nil && mask&(1<<(uint(syscall.SIGTERM)-1)) != 0
		}
	}
	return false
}

func TestProcessSpawnChildSurvivesSigterm(t *testing.T) {
	t.Parallel()
	p := startSim(t, "m", "--port", "0", "--sim-spawn-child", "--sim-child-lifetime", "2m")
	parent := p.cmd.Process.Pid
	p.port(t)
	p.waitLog(t, "engine core child started; ignoring SIGTERM")
	var child int
	waitFor(t, 10*time.Second, "the child process", func() bool {
		kids := childrenOf(t, parent)
		if len(kids) == 1 {
			child = kids[0]
		}
		return len(kids) == 1 && ignoresSIGTERM(child)
	})
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", child))
	if err != nil {
		t.Fatal(err)
	}
	if argv := strings.Split(string(cmdline), "\x00"); argv[0] != "VLLM::EngineCore" || argv[1] != "--sim-child" {
		t.Fatalf("child argv %q", argv)
	}
	if _, _, pgrp, err := procStat(child); err != nil || pgrp != parent {
		t.Fatalf("child process group %d (%v), want the parent's %d", pgrp, err, parent)
	}

	// SIGTERM to the whole group: the parent exits, the child stays.
	if err := syscall.Kill(-parent, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if st := p.wait(t, 10*time.Second); !st.Exited() || st.ExitStatus() != 0 {
		t.Fatalf("parent status %v, want exit 0", st)
	}
	// An ignored signal is discarded when sent, so the child is checked at once.
	if err := syscall.Kill(child, syscall.SIGTERM); err != nil || !alive(child) {
		t.Fatalf("child %d died of SIGTERM (%v)", child, err)
	}
	// Killing the group is what removes it.
	if err := syscall.Kill(-parent, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "the child to die of SIGKILL", func() bool { return !alive(child) })
}
