package engine

import (
	"bufio"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"strings"
)

// Listeners lists every listening TCP socket of poold's network
// namespace (which its engines share): from the kernel's socket
// diagnostics (diagListeners), or where they cannot be asked, from
// /proc/net/tcp and /proc/net/tcp6 (a host without IPv6 has no tcp6).
func Listeners() ([]Listener, error) {
	if ls, err := diagListeners(); err == nil {
		return ls, nil
	}
	return procListeners()
}

// procListeners reads the listening TCP sockets from /proc/net/tcp and
// /proc/net/tcp6.
func procListeners() ([]Listener, error) {
	var all []Listener
	for _, name := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		ls, err := readListeners(name)
		if err != nil {
			if name == "/proc/net/tcp6" && os.IsNotExist(err) {
				continue
			}
			return nil, err
		}
		all = append(all, ls...)
	}
	return all, nil
}

// readListeners parses one /proc/net/tcp-style table. Each line is
// "sl local_address rem_address st … uid timeout inode …", the address in
// hex as the kernel holds it (32-bit words in host byte order), the state
// 0A for LISTEN.
func readListeners(name string) ([]Listener, error) {
	f, err := os.Open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var ls []Listener
	sc := bufio.NewScanner(f)
	sc.Scan() // the header
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 10 || fields[3] != "0A" {
			continue
		}
		addr, err := parseProcAddr(fields[1])
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		inode, err := strconv.ParseUint(fields[9], 10, 64)
		if err != nil {
			return nil, fmt.Errorf("%s: inode %q: %w", name, fields[9], err)
		}
		ls = append(ls, Listener{Addr: addr, Inode: inode})
	}
	return ls, sc.Err()
}

// parseProcAddr parses "0100007F:1F90" (or the 32-digit IPv6 form).
func parseProcAddr(s string) (netip.AddrPort, error) {
	host, port, ok := strings.Cut(s, ":")
	b, err := hex.DecodeString(host)
	p, perr := strconv.ParseUint(port, 16, 16)
	if !ok || err != nil || perr != nil || (len(b) != 4 && len(b) != 16) {
		return netip.AddrPort{}, fmt.Errorf("bad socket address %q", s)
	}
	// Each 32-bit word was printed as a number: put it back in memory order.
	for i := 0; i < len(b); i += 4 {
		binary.NativeEndian.PutUint32(b[i:], binary.BigEndian.Uint32(b[i:]))
	}
	addr, _ := netip.AddrFromSlice(b)
	return netip.AddrPortFrom(addr, uint16(p)), nil
}

// SocketInodes lists the inodes of the sockets that the processes pids hold
// open, from their /proc/PID/fd links ("socket:[INODE]").
func SocketInodes(pids []int) map[uint64]bool {
	inodes := make(map[uint64]bool)
	for _, pid := range pids {
		dir := "/proc/" + strconv.Itoa(pid) + "/fd/"
		ents, err := os.ReadDir(dir)
		if err != nil {
			continue
		}
		for _, ent := range ents {
			link, err := os.Readlink(dir + ent.Name())
			if err != nil {
				continue
			}
			if rest, ok := strings.CutPrefix(link, "socket:["); ok {
				if n, err := strconv.ParseUint(strings.TrimSuffix(rest, "]"), 10, 64); err == nil {
					inodes[n] = true
				}
			}
		}
	}
	return inodes
}
