package engine

import (
	"net/netip"
	"slices"
	"testing"
)

func TestInspectSockets(t *testing.T) {
	l := func(addr string, inode uint64) Listener { return Listener{netip.MustParseAddrPort(addr), inode} }
	own := map[uint64]bool{1: true, 2: true, 3: true}
	ap := func(s ...string) []netip.AddrPort {
		var out []netip.AddrPort
		for _, a := range s {
			out = append(out, netip.MustParseAddrPort(a))
		}
		return out
	}
	cases := []struct {
		name string
		ls   []Listener
		want SocketReport
	}{
		{"loopback only", []Listener{l("127.0.0.1:8000", 1), l("10.0.0.1:8000", 9), l("127.0.0.1:9000", 9)}, SocketReport{Served: true}},
		{"shared port", []Listener{l("127.0.0.1:8000", 1), l("127.0.0.1:8000", 9), l("[::]:8000", 8)},
			SocketReport{Served: true, Foreign: ap("127.0.0.1:8000", "[::]:8000")}},
		{"only another", []Listener{l("0.0.0.0:8000", 9)}, SocketReport{Foreign: ap("0.0.0.0:8000")}},
		{"wildcard", []Listener{l("0.0.0.0:8000", 1), l("[::]:8000", 2)},
			SocketReport{Served: true, ExposedPort: ap("0.0.0.0:8000", "[::]:8000")}},
		{"other port exposed", []Listener{l("127.0.0.1:8000", 1), l("0.0.0.0:29500", 2), l("[::1]:29501", 3)},
			SocketReport{Served: true, ExposedOther: ap("0.0.0.0:29500")}},
		{"another address of the host", []Listener{l("10.0.0.1:8000", 1)}, SocketReport{ExposedPort: ap("10.0.0.1:8000")}},
	}
	for _, c := range cases {
		got := InspectSockets(c.ls, own, 8000)
		if got.Served != c.want.Served || !slices.Equal(got.Foreign, c.want.Foreign) ||
			!slices.Equal(got.ExposedPort, c.want.ExposedPort) || !slices.Equal(got.ExposedOther, c.want.ExposedOther) {
			t.Errorf("%s: %+v, want %+v", c.name, got, c.want)
		}
	}
}
