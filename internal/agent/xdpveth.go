package agent

import (
	"fmt"
	"strings"

	"github.com/sluice-dataplane/sluice/internal/api"
)

// Native XDP on a veth loses traffic silently unless the veth's peer runs
// an XDP program and the packets reaching it carry full checksums (see
// internal/datapath/veth.go for why, from drivers/net/veth.c).
// --lb-acceleration=best-effort keeps veths on tc; with native the agent
// warns about what it can see and says what it cannot.

// vethXDP is a device with native XDP that is a veth, and what the agent
// sees of its peer (wire.go fills it in).
type vethXDP struct {
	Device string
	// Peer is the peer's name, "" when PeerErr says why it could not be
	// read; PeerNetnsID is -1 when the peer is in the agent's namespace.
	Peer        string
	PeerNetnsID int
	PeerErr     string
	PeerXDP     bool // an XDP program in driver mode
	// PeerTxChecksumKnown: the peer is in the agent's namespace, where
	// ethtool reads its TX checksum offload (PeerTxChecksum).
	PeerTxChecksumKnown bool
	PeerTxChecksum      bool
}

// vethInspector is a dataplane that can inspect its veth devices.
type vethInspector interface {
	VethXDP() []vethXDP
}

// vethXDPKey is the warning key of a device.
func vethXDPKey(dev string) string { return "xdp/" + dev }

// vethXDPWarning is the warning for v, if anything can lose traffic.
func vethXDPWarning(v vethXDP) (api.Warning, bool) {
	var problems, fixes []string
	peer := v.Peer
	if peer == "" {
		peer = "the peer"
	}
	where := ""
	if v.PeerNetnsID >= 0 {
		where = fmt.Sprintf(" (link-netnsid %d)", v.PeerNetnsID)
	}
	const dropped = "frames XDP sends back out (XDP_TX) are dropped, or with GRO on the peer wait in its queue until other traffic comes"
	switch {
	case v.PeerErr != "":
		problems = append(problems, fmt.Sprintf("its peer could not be read (%s), and without an XDP program there %s", v.PeerErr, dropped))
	case !v.PeerXDP:
		problems = append(problems, fmt.Sprintf("its peer %s%s has no XDP program: %s", peer, where, dropped))
	}
	if len(problems) > 0 {
		fixes = append(fixes, fmt.Sprintf("attach an XDP program (XDP_PASS is enough) in driver mode to %s", peer))
	}
	// Every packet to a veth leaves through its peer, which finishes
	// partial checksums when its own TX checksum offload is off.
	if !v.PeerTxChecksumKnown || v.PeerTxChecksum {
		seen := "the agent cannot see the senders' TX checksum offload (nor the peer's in another namespace)"
		if v.PeerTxChecksumKnown {
			seen = fmt.Sprintf("its peer %s has TX checksum offload on, and the agent cannot see the senders'", peer)
		}
		problems = append(problems, seen+": packets from a sender with it on (the veth default) reach XDP with a partial checksum, "+
			"and once XDP rewrites and sends them on, backends drop them")
		fixes = append(fixes, fmt.Sprintf("turn TX checksum offload off on %s (ethtool -K %s tx off; every packet to %s leaves through it) or on every sender",
			peer, peer, v.Device))
	}
	if len(problems) == 0 {
		return api.Warning{}, false
	}
	return api.Warning{
		Subsystem: "xdp",
		Message:   fmt.Sprintf("%s is a veth with native XDP (--lb-acceleration=native): %s", v.Device, strings.Join(problems, "; ")),
		Fix:       strings.Join(fixes, "; ") + "; or use --lb-acceleration=best-effort, which keeps veths on tc",
	}, true
}

// checkVethXDP warns about each attached device that is a veth with native
// XDP, and clears the warning of one that no longer needs it. It runs at
// attach and after every sync, so a peer fixed later clears its warning.
func (a *Agent) checkVethXDP() {
	vi, ok := a.dp.(vethInspector)
	if !ok {
		return
	}
	a.mu.Lock()
	var devs []string
	if a.ns != nil {
		for _, d := range a.ns.Devices {
			devs = append(devs, d.Name)
		}
	}
	a.mu.Unlock()
	if len(devs) == 0 {
		return
	}
	found := map[string]vethXDP{}
	for _, v := range vi.VethXDP() {
		found[v.Device] = v
	}
	for _, dev := range devs {
		if v, ok := found[dev]; ok {
			if w, ok := vethXDPWarning(v); ok {
				a.warn(vethXDPKey(dev), w)
				continue
			}
		}
		a.unwarn(vethXDPKey(dev))
	}
}
