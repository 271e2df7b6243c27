package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// clockTicks is the unit of utime and stime in /proc/PID/stat (USER_HZ, 100
// on every Linux this runs on).
const clockTicks = 100

// proc is one process the harness started: poold or a direct engine.
type proc struct {
	name   string
	cmd    *exec.Cmd
	base   string // http://127.0.0.1:PORT
	exited chan struct{}
}

// start runs bin args with stdout and stderr in dir/name.log.
func start(dir, name, bin string, args ...string) (*proc, error) {
	return startEnv(dir, name, bin, nil, args...)
}

// startEnv is start with the environment env (the harness's own when nil).
func startEnv(dir, name, bin string, env []string, args ...string) (*proc, error) {
	logf, err := os.Create(filepath.Join(dir, name+".log"))
	if err != nil {
		return nil, fmt.Errorf("creating %s's log: %w", name, err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = env
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = procAttr()
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, exited: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		logf.Close()
		close(p.exited)
	}()
	return p, nil
}

// startEngine runs the simulator directly on a free port, serving model.
func startEngine(dir, bin, model string, flags ...string) (*proc, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	args := append([]string{"engine-sim", "/models/" + model, "--port", strconv.Itoa(port), "--served-model-name", model}, flags...)
	p, err := start(dir, "engine-"+model, bin, args...)
	if err != nil {
		return nil, err
	}
	p.base = "http://127.0.0.1:" + strconv.Itoa(port)
	return p, nil
}

// startPoold runs poold on profiles on a free port, with its own state
// directory and any further flags.
func startPoold(dir, name, bin string, profiles []byte, flags ...string) (*proc, error) {
	path, err := writeConfig(dir, name+"-profiles.json", profiles)
	if err != nil {
		return nil, err
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	addr := "127.0.0.1:" + strconv.Itoa(port)
	// Engines stop with their poold unless a workload keeps them (5r).
	args := append([]string{"serve", "--listen", addr, "--profiles", path, "--log-level", "warn",
		"--state-dir", filepath.Join(dir, name+"-state"), "--keep-engines-on-restart=false"}, flags...)
	p, err := start(dir, name, bin, args...)
	if err != nil {
		return nil, err
	}
	p.base = "http://" + addr
	return p, nil
}

// startBare runs bareproxy (bin) on a free port in front of upstream.
func startBare(dir, bin, upstream string) (*proc, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	addr := "127.0.0.1:" + strconv.Itoa(port)
	p, err := start(dir, "bareproxy", bin, addr, upstream)
	if err != nil {
		return nil, err
	}
	p.base = "http://" + addr
	return p, nil
}

// startFleetd runs fleetd on a free port in front of one poold host.
func startFleetd(dir, bin, pooldBase string) (*proc, error) {
	return startFleet(dir, "fleetd", bin, map[string]string{"poold": pooldBase})
}

// startFleet runs fleetd (bin) as name on a free port in front of hosts
// (name → poold's base URL), with flags.
func startFleet(dir, name, bin string, hosts map[string]string, flags ...string) (*proc, error) {
	var list []map[string]string
	for _, h := range slices.Sorted(maps.Keys(hosts)) {
		list = append(list, map[string]string{"name": h, "url": hosts[h]})
	}
	file, err := json.Marshal(map[string]any{"hosts": list})
	if err != nil {
		return nil, fmt.Errorf("rendering the hosts file: %w", err)
	}
	path, err := writeConfig(dir, name+"-hosts.json", file)
	if err != nil {
		return nil, err
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	addr := "127.0.0.1:" + strconv.Itoa(port)
	p, err := start(dir, name, bin, append([]string{"--listen", addr, "--hosts", path, "--log-level", "warn"}, flags...)...)
	if err != nil {
		return nil, err
	}
	p.base = "http://" + addr
	return p, nil
}

// writeConfig writes a watched file into dir/config, away from the logs in
// dir: poold and fleetd watch their file's directory, and a log line written
// next to it would wake their watchers on every request.
func writeConfig(dir, name string, data []byte) (string, error) {
	cdir := filepath.Join(dir, "config")
	if err := os.MkdirAll(cdir, 0o755); err != nil {
		return "", fmt.Errorf("creating the config directory: %w", err)
	}
	path := filepath.Join(cdir, name)
	if err := os.WriteFile(path, data, 0o644); err != nil {
		return "", fmt.Errorf("writing %s: %w", name, err)
	}
	return path, nil
}

// stop sends SIGTERM to p's process group and waits (SIGKILL after 20 s).
func (p *proc) stop() { p.stopWithin(20 * time.Second) }

// stopWithin sends SIGTERM to p's process group and waits for p to exit,
// sending the group SIGKILL after d.
func (p *proc) stopWithin(d time.Duration) {
	select {
	case <-p.exited:
		return
	default:
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(d):
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.exited
	}
}

func (p *proc) pid() int { return p.cmd.Process.Pid }

func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("finding a free port: %w", err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// waitModels polls base/v1/models every millisecond until it lists every one
// of models, p exits, or ctx ends.
func waitModels(ctx context.Context, p *proc, models ...string) error {
	c := &http.Client{Timeout: time.Second}
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for {
		if listsAll(c, p.base, models) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s to serve %v: %w", p.name, models, ctx.Err())
		case <-p.exited:
			return fmt.Errorf("%s exited before serving %v (see its log)", p.name, models)
		case <-tick.C:
		}
	}
}

func listsAll(c *http.Client, base string, models []string) bool {
	resp, err := c.Get(base + "/v1/models")
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	var list struct {
		Data []struct {
			ID    string `json:"id"`
			State string `json:"state"`
		} `json:"data"`
	}
	if resp.StatusCode != http.StatusOK || json.NewDecoder(resp.Body).Decode(&list) != nil {
		return false
	}
	for _, m := range models {
		found := false
		for _, d := range list.Data {
			found = found || d.ID == m
		}
		if !found {
			return false
		}
	}
	return true
}

// waitPoolsReady polls poold's /status until every pool is ready.
func waitPoolsReady(ctx context.Context, p *proc) error {
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		st, err := status(p.base)
		if err == nil && len(st.Pools) > 0 {
			ready := true
			for _, pl := range st.Pools {
				ready = ready && pl.State == "ready"
			}
			if ready {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for poold's pools to be ready: %w", ctx.Err())
		case <-p.exited:
			return fmt.Errorf("poold exited (see %s.log)", p.name)
		case <-tick.C:
		}
	}
}

type poolStatus struct {
	Name   string        `json:"name"`
	State  string        `json:"state"`
	Engine *engineStatus `json:"engine"`
}

// engineStatus is what poold's /status says of a pool's engine.
type engineStatus struct {
	Profile string `json:"profile"`
	PID     int    `json:"pid"`
	Port    int    `json:"port"`
}

func status(base string) (struct{ Pools []poolStatus }, error) {
	var st struct{ Pools []poolStatus }
	resp, err := http.Get(base + "/status")
	if err != nil {
		return st, err
	}
	defer resp.Body.Close()
	return st, json.NewDecoder(resp.Body).Decode(&st)
}

// enginePID is the pid of the engine poold runs on pool.
func enginePID(base, pool string) (int, error) {
	e, err := poolEngine(base, pool)
	if err != nil {
		return 0, err
	}
	return e.PID, nil
}

// poolEngine is the engine poold runs on pool.
func poolEngine(base, pool string) (*engineStatus, error) {
	st, err := status(base)
	if err != nil {
		return nil, fmt.Errorf("reading poold's status: %w", err)
	}
	for _, p := range st.Pools {
		if p.Name == pool && p.Engine != nil {
			return p.Engine, nil
		}
	}
	return nil, fmt.Errorf("pool %q has no engine", pool)
}

// cpuTime is the user+system CPU time pid has used.
func cpuTime(pid int) (time.Duration, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	i := bytes.LastIndexByte(b, ')')
	f := strings.Fields(string(b[i+1:]))
	// After the command: state is field 3, utime 14, stime 15.
	if len(f) < 13 {
		return 0, errors.New("short /proc stat line")
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, fmt.Errorf("parsing /proc stat: %w", err)
	}
	return time.Duration(ut+st) * time.Second / clockTicks, nil
}

// rss is pid's resident set size in bytes.
func rss(pid int) (int64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0, err
	}
	for line := range strings.Lines(string(b)) {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("parsing VmRSS: %w", err)
			}
			return kb << 10, nil
		}
	}
	return 0, errors.New("no VmRSS in /proc status")
}

// scrape reads poold's /metrics and returns the value of every sample whose
// name and labels start with prefix, keyed by the rest of the line's series.
func scrape(base, prefix string) (map[string]float64, error) {
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		return nil, fmt.Errorf("scraping metrics: %w", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("scraping metrics: %w", err)
	}
	out := make(map[string]float64)
	for line := range strings.Lines(string(b)) {
		if !strings.HasPrefix(line, prefix) {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(strings.TrimSpace(line[i+1:]), 64)
		if err != nil {
			continue
		}
		out[line[:i]] = v
	}
	return out, nil
}

// sumMatching adds the values of every series holding all of parts.
func sumMatching(m map[string]float64, parts ...string) float64 {
	var sum float64
	for k, v := range m {
		all := true
		for _, p := range parts {
			all = all && strings.Contains(k, p)
		}
		if all {
			sum += v
		}
	}
	return sum
}
