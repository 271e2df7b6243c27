package fleet

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Resolver looks names up in DNS; *net.Resolver is one.
type Resolver interface {
	LookupIPAddr(ctx context.Context, host string) ([]net.IPAddr, error)
	LookupSRV(ctx context.Context, service, proto, name string) (string, []*net.SRV, error)
}

// resolveTimeout bounds one DNS lookup.
const resolveTimeout = 10 * time.Second

// resolve returns the hosts that d's records name, sorted by name. Each host is
// named host:port, which is also its address.
func resolve(ctx context.Context, r Resolver, d DNSSpec) ([]HostSpec, error) {
	ctx, cancel := context.WithTimeout(ctx, resolveTimeout)
	defer cancel()
	var addrs []string
	switch d.Type {
	case "srv":
		_, srvs, err := r.LookupSRV(ctx, "", "", d.Name)
		if err != nil {
			return nil, fmt.Errorf("resolving SRV %q: %w", d.Name, err)
		}
		for _, s := range srvs {
			addrs = append(addrs, net.JoinHostPort(strings.TrimSuffix(s.Target, "."), strconv.Itoa(int(s.Port))))
		}
	default:
		ips, err := r.LookupIPAddr(ctx, d.Name)
		if err != nil {
			return nil, fmt.Errorf("resolving %q: %w", d.Name, err)
		}
		for _, ip := range ips {
			addrs = append(addrs, net.JoinHostPort(ip.String(), strconv.Itoa(d.Port)))
		}
	}
	slices.Sort(addrs)
	addrs = slices.Compact(addrs)
	hosts := make([]HostSpec, len(addrs))
	for i, a := range addrs {
		hosts[i] = HostSpec{Name: a, URL: d.Scheme + "://" + a, Labels: d.Labels, Weight: d.Weight}
	}
	return hosts, nil
}

// discover resolves d now and every d.Every() until ctx ends, handing each
// answer to set. A failed lookup keeps the last answer: a DNS hiccup must not
// empty the fleet.
func (f *Fleet) discover(ctx context.Context, d DNSSpec, set func([]HostSpec)) {
	log := f.log.With("dns", d.Name)
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		hosts, err := resolve(ctx, f.opts.Resolver, d)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			log.Warn("dns discovery failed; keeping the last answer", "err", err)
		} else {
			log.Debug("dns discovery", "hosts", len(hosts))
			set(hosts)
		}
		t.Reset(d.Every())
	}
}
