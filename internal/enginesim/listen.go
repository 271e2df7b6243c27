package enginesim

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"
)

// ErrPortInUse is returned (wrapped) by Run when the port is taken; its
// message is the line vLLM prints (Config.PortMessage).
var ErrPortInUse = errors.New("address already in use")

// boundSocket is a TCP socket bound to the engine's address but not yet
// listening, as vLLM holds its port while the model loads: a taken port fails
// at once, and connections are refused until the server listens.
type boundSocket struct {
	fd   int
	port int
}

// bindTCP binds a socket to host:port (with SO_REUSEADDR, and SO_REUSEPORT
// when reusePort). A taken port fails with an error wrapping ErrPortInUse
// whose text is what the engine prints: Python's (portMessage "old"), newer
// vLLM's ("new") or a Go engine's ("go").
func bindTCP(host string, port int, reusePort bool, portMessage string) (*boundSocket, error) {
	addr, err := net.ResolveTCPAddr("tcp", net.JoinHostPort(host, strconv.Itoa(port)))
	if err != nil {
		return nil, fmt.Errorf("resolving %s: %w", host, err)
	}
	family, sa := syscall.AF_INET6, syscall.Sockaddr(nil)
	if ip4 := addr.IP.To4(); ip4 != nil || addr.IP == nil {
		family = syscall.AF_INET
		a := &syscall.SockaddrInet4{Port: addr.Port}
		copy(a.Addr[:], ip4)
		sa = a
	} else {
		a := &syscall.SockaddrInet6{Port: addr.Port}
		copy(a.Addr[:], addr.IP.To16())
		sa = a
	}
	// Under ForkLock no child started meanwhile inherits the descriptor
	// before it is marked close-on-exec (SOCK_CLOEXEC is not portable).
	syscall.ForkLock.RLock()
	fd, err := syscall.Socket(family, syscall.SOCK_STREAM, syscall.IPPROTO_TCP)
	if err == nil {
		syscall.CloseOnExec(fd)
	}
	syscall.ForkLock.RUnlock()
	if err != nil {
		return nil, fmt.Errorf("creating the server socket: %w", err)
	}
	opts := []int{syscall.SO_REUSEADDR}
	if reusePort {
		opts = append(opts, unix.SO_REUSEPORT)
	}
	for _, opt := range opts {
		if err := syscall.SetsockoptInt(fd, syscall.SOL_SOCKET, opt, 1); err != nil {
			syscall.Close(fd)
			return nil, fmt.Errorf("setting socket option %d: %w", opt, err)
		}
	}
	if err := syscall.Bind(fd, sa); err != nil {
		syscall.Close(fd)
		if errors.Is(err, syscall.EADDRINUSE) {
			switch portMessage {
			case "new":
				return nil, &vllmError{ErrPortInUse, fmt.Sprintf("Port %d is already in use", port)}
			case "go":
				return nil, &vllmError{ErrPortInUse, fmt.Sprintf("listen tcp %s: bind: address already in use", addr)}
			}
			return nil, &vllmError{ErrPortInUse, "OSError: [Errno 98] Address already in use"}
		}
		return nil, fmt.Errorf("binding %s: %w", addr, err)
	}
	bound, err := syscall.Getsockname(fd)
	if err != nil {
		syscall.Close(fd)
		return nil, fmt.Errorf("reading the bound address: %w", err)
	}
	b := &boundSocket{fd: fd}
	switch a := bound.(type) {
	case *syscall.SockaddrInet4:
		b.port = a.Port
	case *syscall.SockaddrInet6:
		b.port = a.Port
	}
	return b, nil
}

// listen starts listening on the bound socket and returns it as a
// net.Listener, which then owns the socket.
func (b *boundSocket) listen() (net.Listener, error) {
	if err := syscall.Listen(b.fd, syscall.SOMAXCONN); err != nil {
		syscall.Close(b.fd)
		return nil, fmt.Errorf("listening: %w", err)
	}
	f := os.NewFile(uintptr(b.fd), "engine-sim listener")
	ln, err := net.FileListener(f) // a duplicate of the socket
	f.Close()
	if err != nil {
		return nil, fmt.Errorf("listening: %w", err)
	}
	return ln, nil
}

// close releases a socket that never listened.
func (b *boundSocket) close() { syscall.Close(b.fd) }
