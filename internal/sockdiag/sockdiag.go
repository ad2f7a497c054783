// Package sockdiag destroys sockets through the kernel's socket
// diagnostics (NETLINK_SOCK_DIAG's SOCK_DESTROY, as `ss -K` does), which
// kernels built with CONFIG_INET_DIAG_DESTROY have for TCP and UDP: what
// the agent uses for connected UDP sockets where bpf_sock_destroy (6.5) is
// missing.
package sockdiag

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// inetDiagReq is struct inet_diag_req_v2 for a SOCK_DESTROY of one socket.
type inetDiagReq struct {
	family uint8
	id     netlink.SocketID
}

func (r *inetDiagReq) Len() int { return 56 }

func (r *inetDiagReq) Serialize() []byte {
	b := make([]byte, r.Len())
	b[0], b[1] = r.family, unix.IPPROTO_UDP
	// b[2] ext, b[3] pad, b[4:8] states: none for a destroy
	binary.BigEndian.PutUint16(b[8:], r.id.SourcePort)
	binary.BigEndian.PutUint16(b[10:], r.id.DestinationPort)
	src, dst := r.id.Source, r.id.Destination
	if r.family == unix.AF_INET {
		src, dst = src.To4(), dst.To4()
	}
	copy(b[12:28], src)
	copy(b[28:44], dst)
	binary.NativeEndian.PutUint32(b[44:], r.id.Interface)
	binary.NativeEndian.PutUint32(b[48:], r.id.Cookie[0])
	binary.NativeEndian.PutUint32(b[52:], r.id.Cookie[1])
	return b
}

// DestroyUDP destroys the UDP socket id (its cookie included) of the
// calling thread's network namespace: the socket's owner sees
// ECONNABORTED (udp_abort), as with bpf_sock_destroy.
func DestroyUDP(family uint8, id netlink.SocketID) error {
	req := nl.NewNetlinkRequest(nl.SOCK_DESTROY, unix.NLM_F_ACK)
	req.AddData(&inetDiagReq{family: family, id: id})
	_, err := req.Execute(unix.NETLINK_INET_DIAG, 0)
	return err
}

// SelfTest destroys a connected loopback UDP socket of its own, in the
// calling thread's network namespace, and checks that its next receive
// fails with ECONNABORTED.
func SelfTest() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if err := unix.Connect(fd, &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}, Port: 9}); err != nil {
		return err
	}
	cookie, err := unix.GetsockoptUint64(fd, unix.SOL_SOCKET, unix.SO_COOKIE)
	if err != nil {
		return fmt.Errorf("SO_COOKIE: %w", err)
	}
	sa, err := unix.Getsockname(fd)
	if err != nil {
		return err
	}
	local := sa.(*unix.SockaddrInet4)
	id := netlink.SocketID{
		SourcePort: uint16(local.Port), DestinationPort: 9,
		Source: local.Addr[:], Destination: []byte{127, 0, 0, 1},
		Cookie: [2]uint32{uint32(cookie), uint32(cookie >> 32)},
	}
	if err := DestroyUDP(unix.AF_INET, id); err != nil {
		if errors.Is(err, unix.EOPNOTSUPP) {
			return fmt.Errorf("%w (the kernel is built without CONFIG_INET_DIAG_DESTROY)", err)
		}
		return err
	}
	if _, _, err := unix.Recvfrom(fd, make([]byte, 1), unix.MSG_DONTWAIT); !errors.Is(err, unix.ECONNABORTED) {
		return fmt.Errorf("the destroyed socket's receive: %v, want ECONNABORTED", err)
	}
	return nil
}
