package main

import (
	"context"
	"fmt"
	"os/exec"
	"slices"
	"strconv"
	"time"
)

// haproxyConfig is the harness's haproxy: http mode, one backend, the
// connections to the server kept alive and shared between clients (as
// poold's pool of engine connections is). Its arguments are the port it
// listens on, on loopback, and the server's address.
const haproxyConfig = `global
	maxconn 4096

defaults
	mode http
	option http-keep-alive
	http-reuse always
	timeout connect 5s
	timeout client 5m
	timeout server 5m

frontend bench
	bind 127.0.0.1:%d
	default_backend engine

backend engine
	server engine %s
`

// startHaproxy runs haproxy (bin) in the foreground on a free loopback port
// in front of server (host:port).
func startHaproxy(dir, bin, server string) (*proc, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	path, err := writeConfig(dir, "haproxy.cfg", fmt.Appendf(nil, haproxyConfig, port, server))
	if err != nil {
		return nil, err
	}
	p, err := start(dir, "haproxy", bin, "-db", "-f", path)
	if err != nil {
		return nil, err
	}
	p.base = "http://127.0.0.1:" + strconv.Itoa(port)
	return p, nil
}

// w1v: the latency poold adds to a real engine's plain answer (16 generated
// tokens) at concurrency 1 and 4, against the engine directly and against
// haproxy in front of it, where haproxy is installed. All three paths reach
// the same engine, the one poold runs (its port from /status), in rounds
// whose first side rotates. A few requests per side warm up first (vLLM's
// first answers are slower).
func (b *bench) w1v(ctx context.Context) error {
	v, err := b.vllm(ctx)
	if err != nil {
		return err
	}
	e, err := poolEngine(v.poold.base, vllmPool)
	if err != nil {
		return err
	}
	engine := "127.0.0.1:" + strconv.Itoa(e.Port)
	sides := []side{{"direct", "http://" + engine, newClient(8)}, {"poold", v.poold.base, newClient(8)}}
	if bin, err := exec.LookPath("haproxy"); err != nil {
		b.rep.notes = append(b.rep.notes, "1v: haproxy is not installed (apt-get install haproxy): its rows are left out")
	} else {
		h, err := startHaproxy(b.dir, bin, engine)
		if err != nil {
			return err
		}
		defer h.stop()
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		if err := waitModels(wctx, h, e.Profile); err != nil {
			return err
		}
		sides = append(sides, side{"haproxy", h.base, newClient(8)})
	}
	defer func() {
		for _, s := range sides {
			s.client.CloseIdleConnections()
		}
	}()
	sh := vllmChat(e.Profile, 16)
	for _, s := range sides {
		if r := closedLoop(ctx, s.client, s.base, sh, 4, 0, 16); r.errs > 0 {
			return fmt.Errorf("warming up %s: %d of %d requests failed; first: %w", s.name, r.errs, r.n, r.firstErr)
		}
	}
	w := "1v (vLLM " + e.Profile + ", 16 tokens)"
	for _, conc := range []int{1, 4} {
		rs, err := b.rotate(ctx, sides, func(s side) (result, error) {
			return closedLoop(ctx, s.client, s.base, sh, conc, b.o.dur, 0), nil
		})
		if err != nil {
			return err
		}
		b.checkUsage(rs[0], slices.Concat(rs[1:]...), "1v")
		d, p := rs[0], rs[1]
		m := fmt.Sprintf("p50 latency, concurrency %d", conc)
		b.rep.add(w, m+", through poold", ms2(med(d, q(.5))), ms2(med(p, q(.5))), plus(pairMed(d, p, q(.5), added), ms2), "", nil)
		if len(rs) < 3 {
			continue
		}
		h := rs[2]
		b.rep.add(w, m+", through haproxy", ms2(med(d, q(.5))), ms2(med(h, q(.5))), plus(pairMed(d, h, q(.5), added), ms2), "", nil)
		b.rep.add(w, m+", poold against haproxy (haproxy in the direct column)", ms2(med(h, q(.5))), ms2(med(p, q(.5))),
			plus(pairMed(h, p, q(.5), added), ms2), "", nil)
	}
	return nil
}
