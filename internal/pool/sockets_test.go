package pool

import (
	"net/netip"
	"slices"
	"testing"
)

func TestInspectSockets(t *testing.T) {
	l := func(addr string, inode uint64) listener { return listener{netip.MustParseAddrPort(addr), inode} }
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
		ls   []listener
		want socketReport
	}{
		{"loopback only", []listener{l("127.0.0.1:8000", 1), l("10.0.0.1:8000", 9), l("127.0.0.1:9000", 9)}, socketReport{served: true}},
		{"shared port", []listener{l("127.0.0.1:8000", 1), l("127.0.0.1:8000", 9), l("[::]:8000", 8)},
			socketReport{served: true, foreign: ap("127.0.0.1:8000", "[::]:8000")}},
		{"only another", []listener{l("0.0.0.0:8000", 9)}, socketReport{foreign: ap("0.0.0.0:8000")}},
		{"wildcard", []listener{l("0.0.0.0:8000", 1), l("[::]:8000", 2)},
			socketReport{served: true, exposedPort: ap("0.0.0.0:8000", "[::]:8000")}},
		{"other port exposed", []listener{l("127.0.0.1:8000", 1), l("0.0.0.0:29500", 2), l("[::1]:29501", 3)},
			socketReport{served: true, exposedOther: ap("0.0.0.0:29500")}},
		{"another address of the host", []listener{l("10.0.0.1:8000", 1)}, socketReport{exposedPort: ap("10.0.0.1:8000")}},
	}
	for _, c := range cases {
		got := inspectSockets(c.ls, own, 8000)
		if got.served != c.want.served || !slices.Equal(got.foreign, c.want.foreign) ||
			!slices.Equal(got.exposedPort, c.want.exposedPort) || !slices.Equal(got.exposedOther, c.want.exposedOther) {
			t.Errorf("%s: %+v, want %+v", c.name, got, c.want)
		}
	}
}

func TestPortInUseMessages(t *testing.T) {
	for line, want := range map[string]bool{
		"OSError: [Errno 98] Address already in use":                               true,
		"ERROR: [Errno 98] error while attempting to bind: address already in use": true,
		"RuntimeError: Port 8000 is already in use":                                true,
		"listen tcp 127.0.0.1:8000: bind: ADDRESS ALREADY IN USE":                  true,
		"CUDA device is already in use by another process":                         false,
		"loading weights": false,
	} {
		if got := portInUse.MatchString(line); got != want {
			t.Errorf("%q: %v, want %v", line, got, want)
		}
	}
}
