// Command bareproxy is the benchmark's reference hop: fleetd's forwarding
// (httputil.ReverseProxy on proxy.Transport with pooled copy buffers) and
// nothing else, no body parsing, routing, metrics or logs. Workload 1f puts
// it in fleetd's place to show what any such hop adds in front of poold on
// the machine at hand.
//
// Usage: bareproxy LISTEN-ADDR UPSTREAM-URL
package main

import (
	"fmt"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"

	"github.com/poold/poold/internal/upstream"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "bareproxy:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	if len(args) != 2 {
		return fmt.Errorf("usage: bareproxy LISTEN-ADDR UPSTREAM-URL")
	}
	up, err := url.Parse(args[1])
	if err != nil {
		return fmt.Errorf("upstream: %w", err)
	}
	rp := &httputil.ReverseProxy{
		Rewrite:    func(pr *httputil.ProxyRequest) { pr.SetURL(up) },
		Transport:  &upstream.Transport{},
		BufferPool: &upstream.BufferPool{},
	}
	return http.ListenAndServe(args[0], rp)
}
