package agent

import (
	"io"
	"log/slog"
	"strings"
	"testing"

	"github.com/sluice-dataplane/sluice/internal/api"
)

func TestVethXDPWarning(t *testing.T) {
	for _, tt := range []struct {
		name string
		v    vethXDP
		// want: substrings of the message and of the fix; none: no warning.
		want, wantFix []string
		none          bool
	}{
		{"peer in another namespace without XDP",
			vethXDP{Device: "eth0", Peer: "n1", PeerNetnsID: 0},
			[]string{"eth0 is a veth with native XDP", "peer n1 (link-netnsid 0) has no XDP program", "XDP_TX", "cannot see the senders' TX checksum offload"},
			[]string{"XDP_PASS is enough", "to n1", "ethtool -K n1 tx off", "best-effort"}, false},
		{"peer in another namespace with XDP: checksums still unseen",
			vethXDP{Device: "eth0", Peer: "n1", PeerNetnsID: 0, PeerXDP: true},
			[]string{"cannot see the senders' TX checksum offload", "partial checksum"},
			[]string{"ethtool -K n1 tx off"}, false},
		{"peer here with XDP and TX checksum offload off: nothing to warn",
			vethXDP{Device: "eth0", Peer: "veth0", PeerNetnsID: -1, PeerXDP: true, PeerTxChecksumKnown: true},
			nil, nil, true},
		{"peer here with XDP and TX checksum offload on",
			vethXDP{Device: "eth0", Peer: "veth0", PeerNetnsID: -1, PeerXDP: true, PeerTxChecksumKnown: true, PeerTxChecksum: true},
			[]string{"its peer veth0 has TX checksum offload on"}, []string{"ethtool -K veth0 tx off"}, false},
		{"peer here without XDP, checksums fine",
			vethXDP{Device: "eth1", Peer: "veth1", PeerNetnsID: -1, PeerTxChecksumKnown: true},
			[]string{"eth1 is a veth", "peer veth1 has no XDP program"}, []string{"to veth1"}, false},
		{"peer unreadable",
			vethXDP{Device: "eth0", PeerNetnsID: 3, PeerErr: "operation not permitted"},
			[]string{"peer could not be read (operation not permitted)", "XDP_TX"}, []string{"to the peer"}, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			w, ok := vethXDPWarning(tt.v)
			if ok == tt.none {
				t.Fatalf("vethXDPWarning(%+v) = %+v, %t; want a warning: %t", tt.v, w, ok, !tt.none)
			}
			if tt.none {
				return
			}
			if w.Subsystem != "xdp" {
				t.Errorf("subsystem %q, want xdp", w.Subsystem)
			}
			for _, s := range tt.want {
				if !strings.Contains(w.Message, s) {
					t.Errorf("vethXDPWarning(%+v): message %q lacks %q", tt.v, w.Message, s)
				}
			}
			for _, s := range tt.wantFix {
				if !strings.Contains(w.Fix, s) {
					t.Errorf("vethXDPWarning(%+v): fix %q lacks %q", tt.v, w.Fix, s)
				}
			}
			if tt.v.PeerXDP && strings.Contains(w.Message, "no XDP program") {
				t.Errorf("peer with XDP reported without: %q", w.Message)
			}
		})
	}
}

// vethDataplane is a dataplane whose devices are veths as described.
type vethDataplane struct {
	memDataplane
	veths []vethXDP
}

func (d *vethDataplane) VethXDP() []vethXDP { return d.veths }

// checkVethXDP warns per device, clears the warning once the peer is
// fixed, and leaves devices that are no veth alone.
func TestCheckVethXDPWarnsAndClears(t *testing.T) {
	dp := &vethDataplane{veths: []vethXDP{{Device: "eth0", Peer: "n1", PeerNetnsID: 0}}}
	a := &Agent{log: slog.New(slog.NewTextHandler(io.Discard, nil)), dp: dp,
		ns: &api.NorthSouth{Devices: []api.Device{{Name: "eth0", XDP: "native"}, {Name: "eth1", XDP: "native"}}}}
	a.checkVethXDP()
	ws := a.warnings.list()
	if len(ws) != 1 || !strings.Contains(ws[0].Message, "peer n1") {
		t.Fatalf("warnings %+v, want one about eth0's peer n1", ws)
	}
	dp.veths = []vethXDP{{Device: "eth0", Peer: "veth0", PeerNetnsID: -1, PeerXDP: true, PeerTxChecksumKnown: true}}
	a.checkVethXDP()
	if ws := a.warnings.list(); len(ws) != 0 {
		t.Fatalf("warnings %+v after the peer got XDP and TX checksum offload off, want none", ws)
	}
}
