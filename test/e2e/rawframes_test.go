package e2e

import (
	"fmt"
	"net"
	"net/netip"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/sluice-dataplane/sluice/internal/lab"
)

// sendFromClient sends Ethernet frames out of the lab client's eth0 to
// the MAC its neighbour table has for to (so traffic to it must have
// passed first): what no socket sends, a malformed header or a forged
// tunnel. The source and destination MACs of each frame are overwritten.
func sendFromClient(t *testing.T, l *lab.Lab, to netip.Addr, frames ...[]byte) {
	t.Helper()
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends in the client's netns
		ns, err := netns.GetFromPath(filepath.Join("/run/netns", l.Client.Netns))
		if err != nil {
			errc <- err
			return
		}
		defer ns.Close()
		if err := netns.Set(ns); err != nil {
			errc <- err
			return
		}
		errc <- sendFrames(to, frames)
	}()
	if err := <-errc; err != nil {
		t.Fatalf("send raw frames from the client to %s: %v", to, err)
	}
}

func sendFrames(to netip.Addr, frames [][]byte) error {
	link, err := netlink.LinkByName("eth0")
	if err != nil {
		return err
	}
	// The next hop: to itself on the client's link, else its gateway.
	hop := to
	if routes, err := netlink.RouteGet(to.AsSlice()); err == nil && len(routes) > 0 && routes[0].Gw != nil {
		if gw, ok := netip.AddrFromSlice(routes[0].Gw); ok {
			hop = gw.Unmap()
		}
	}
	neighs, err := netlink.NeighList(link.Attrs().Index, netlink.FAMILY_V4)
	if err != nil {
		return err
	}
	var dst net.HardwareAddr
	for _, n := range neighs {
		if a, ok := netip.AddrFromSlice(n.IP); ok && a.Unmap() == hop && len(n.HardwareAddr) == 6 {
			dst = n.HardwareAddr
		}
	}
	if dst == nil {
		return fmt.Errorf("no neighbour entry for %s (the next hop to %s) on eth0: send it traffic first", hop, to)
	}
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	sa := &unix.SockaddrLinklayer{Ifindex: link.Attrs().Index, Halen: 6}
	copy(sa.Addr[:], dst)
	for _, f := range frames {
		f = append([]byte(nil), f...)
		copy(f[0:6], dst)
		copy(f[6:12], link.Attrs().HardwareAddr)
		if err := unix.Sendto(fd, f, 0, sa); err != nil {
			return err
		}
	}
	return nil
}
