package engine

import (
	"net"
	"net/netip"
	"os"
	"slices"
	"testing"
)

func TestParseProcAddr(t *testing.T) {
	for in, want := range map[string]string{
		"0100007F:1F90":                         "127.0.0.1:8080",
		"00000000:0050":                         "0.0.0.0:80",
		"00000000000000000000000000000000:1F90": "[::]:8080",
		"00000000000000000000000001000000:0016": "[::1]:22",
		"0000000000000000FFFF00000100007F:01BB": "[::ffff:127.0.0.1]:443",
	} {
		got, err := parseProcAddr(in)
		if err != nil || got.String() != want {
			t.Errorf("parseProcAddr(%q) = %v, %v; want %s", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "0100007F", "0100007F:XYZ", "01007F:1F90", "0100007F:10000"} {
		if _, err := parseProcAddr(bad); err == nil {
			t.Errorf("parseProcAddr(%q) succeeded", bad)
		}
	}
}

// The listeners from the kernel's socket diagnostics and from /proc each
// include those this test opens (IPv4 and, where the host has it, IPv6),
// owned by this process's socket inodes, and no socket that only connects.
func TestTCPListenersFindsOwnSocket(t *testing.T) {
	var want []netip.AddrPort
	for _, addr := range []string{"127.0.0.1:0", "[::1]:0"} {
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			t.Logf("%s: %v (no IPv6 here?)", addr, err)
			continue
		}
		defer ln.Close()
		want = append(want, netip.MustParseAddrPort(ln.Addr().String()))
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		want = append(want, netip.MustParseAddrPort(c.LocalAddr().String())) // must not be listed
	}
	own := SocketInodes([]int{os.Getpid()})
	for name, list := range map[string]func() ([]Listener, error){"sock_diag": diagListeners, "/proc": procListeners} {
		ls, err := list()
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		for i, w := range want {
			listening := i%2 == 0
			if found := slices.ContainsFunc(ls, func(l Listener) bool { return l.Addr == w && own[l.Inode] }); found != listening {
				t.Errorf("%s: %s among this process's listeners: %v, want %v (%v)", name, w, found, listening, ls)
			}
		}
	}
}

// BenchmarkTCPListeners lists the listening sockets both ways on a host
// with 6,000 sockets in TIME_WAIT, as after a busy spell:
// go test -run '^$' -bench TCPListeners ./internal/engine/
func BenchmarkTCPListeners(b *testing.B) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	for range 6000 {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			b.Fatal(err)
		}
		c.Close()
	}
	for name, list := range map[string]func() ([]Listener, error){"sock_diag": diagListeners, "proc": procListeners} {
		b.Run(name, func(b *testing.B) {
			for b.Loop() {
				if _, err := list(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
