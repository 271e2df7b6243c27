package pool

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

// The listeners read from /proc include one this test opens, owned by this
// process's socket inodes.
func TestTCPListenersFindsOwnSocket(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	ls, err := tcpListeners()
	if err != nil {
		t.Fatal(err)
	}
	own := socketInodes([]int{os.Getpid()})
	want := netip.MustParseAddrPort(ln.Addr().String())
	if !slices.ContainsFunc(ls, func(l listener) bool { return l.addr == want && own[l.inode] }) {
		t.Fatalf("no listener %s among this process's sockets in %v", want, ls)
	}
}
