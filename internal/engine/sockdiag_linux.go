package engine

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"syscall"
	"time"
)

// Netlink's socket diagnostics (linux/sock_diag.h, linux/inet_diag.h).
const (
	sockDiagByFamily = 20      // SOCK_DIAG_BY_FAMILY
	tcpListen        = 10      // TCP_LISTEN
	inetDiagReqLen   = 56      // struct inet_diag_req_v2
	inetDiagMsgLen   = 72      // struct inet_diag_msg
	nlmsgHdrLen      = 16      // struct nlmsghdr
	sockDiagBufLen   = 1 << 16 // one read of dump messages
)

// sockDiagTimeout bounds each read of the dump's answer.
const sockDiagTimeout = 2 * time.Second

// diagListeners asks the kernel, through NETLINK_SOCK_DIAG, for the
// listening TCP sockets of each family. Unlike /proc/net/tcp, which lists
// every socket of the namespace (thousands in TIME_WAIT on a busy host,
// tens of milliseconds to read), the dump walks the listening sockets only.
func diagListeners() ([]Listener, error) {
	fd, err := syscall.Socket(syscall.AF_NETLINK, syscall.SOCK_DGRAM|syscall.SOCK_CLOEXEC, syscall.NETLINK_INET_DIAG)
	if err != nil {
		return nil, fmt.Errorf("netlink socket: %w", err)
	}
	defer syscall.Close(fd)
	// A kernel that never ends the dump fails the read instead of hanging it.
	tv := syscall.NsecToTimeval(int64(sockDiagTimeout))
	if err := syscall.SetsockoptTimeval(fd, syscall.SOL_SOCKET, syscall.SO_RCVTIMEO, &tv); err != nil {
		return nil, fmt.Errorf("netlink socket: %w", err)
	}
	var all []Listener
	for seq, family := range []uint8{syscall.AF_INET, syscall.AF_INET6} {
		ls, err := diagDump(fd, uint32(seq+1), family)
		if err != nil {
			return nil, err
		}
		all = append(all, ls...)
	}
	return all, nil
}

// diagDump sends one dump request for family's listening TCP sockets on fd
// and reads the answer to its end.
func diagDump(fd int, seq uint32, family uint8) ([]Listener, error) {
	req := make([]byte, nlmsgHdrLen+inetDiagReqLen)
	ne := binary.NativeEndian
	ne.PutUint32(req[0:], uint32(len(req)))
	ne.PutUint16(req[4:], sockDiagByFamily)
	ne.PutUint16(req[6:], syscall.NLM_F_REQUEST|syscall.NLM_F_DUMP)
	ne.PutUint32(req[8:], seq)
	req[16], req[17] = family, syscall.IPPROTO_TCP
	ne.PutUint32(req[20:], 1<<tcpListen) // idiag_states
	if err := syscall.Sendto(fd, req, 0, &syscall.SockaddrNetlink{Family: syscall.AF_NETLINK}); err != nil {
		return nil, fmt.Errorf("netlink sock_diag request: %w", err)
	}
	var ls []Listener
	buf := make([]byte, sockDiagBufLen)
	for {
		n, _, err := syscall.Recvfrom(fd, buf, 0)
		if err != nil {
			return nil, fmt.Errorf("netlink sock_diag answer: %w", err)
		}
		msgs, err := syscall.ParseNetlinkMessage(buf[:n])
		if err != nil {
			return nil, fmt.Errorf("netlink sock_diag answer: %w", err)
		}
		for _, m := range msgs {
			switch {
			case m.Header.Seq != seq:
				continue
			case m.Header.Type == syscall.NLMSG_DONE:
				return ls, nil
			case m.Header.Type == syscall.NLMSG_ERROR:
				if len(m.Data) >= 4 {
					if errno := int32(ne.Uint32(m.Data)); errno != 0 {
						return nil, fmt.Errorf("netlink sock_diag: %w", syscall.Errno(-errno))
					}
				}
				return nil, errors.New("netlink sock_diag: an error message")
			}
			if l, ok := parseDiagMsg(m.Data); ok {
				ls = append(ls, l)
			}
		}
	}
}

// parseDiagMsg reads the listener in one struct inet_diag_msg: its family,
// its source address and port (network order) and its inode.
func parseDiagMsg(b []byte) (Listener, bool) {
	if len(b) < inetDiagMsgLen {
		return Listener{}, false
	}
	port := binary.BigEndian.Uint16(b[4:6])
	var addr netip.Addr
	switch b[0] {
	case syscall.AF_INET:
		addr = netip.AddrFrom4([4]byte(b[8:12]))
	case syscall.AF_INET6:
		addr = netip.AddrFrom16([16]byte(b[8:24]))
	default:
		return Listener{}, false
	}
	return Listener{Addr: netip.AddrPortFrom(addr, port), Inode: uint64(binary.NativeEndian.Uint32(b[68:72]))}, true
}
