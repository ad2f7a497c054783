package lab

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// A kubelet lab's nodes reach each other's pods by routes on the fabric
// (CNIRoutes: each node routes every other node's pod subnets via that
// node's fabric address, as flannel's host-gw or a cloud's VPC routes do),
// or through a real overlay CNI (CNIFlannel: flanneld in every node, its
// VXLAN backend, the kube subnet manager reading the Nodes' podCIDRs). The
// pods themselves are wired by the ptp plugin either way (writeCNIConfig);
// flanneld makes the flannel.1 and flannel-v6.1 devices, their neighbour
// and FDB entries, and the routes to the other nodes' pod subnets through
// them.
const (
	CNIRoutes  = "routes"
	CNIFlannel = "flannel"
)

// flannelEnv overrides where the flanneld binary is taken from.
const flannelEnv = "SLUICE_FLANNEL_BIN"

// Flannel's VXLAN devices and their UDP port (its defaults: VNI 1, the
// kernel's 8472).
const (
	FlannelDevice    = "flannel.1"
	FlannelDevice6   = "flannel-v6.1"
	FlannelVXLANPort = 8472
)

// FlannelBinary is the flanneld scripts/flannel-build.sh left in the cache,
// or $SLUICE_FLANNEL_BIN.
func FlannelBinary() (string, error) {
	return cachedBinary("flannel", "flanneld", flannelEnv)
}

// flannelNetConf is flanneld's net-conf.json for the lab's address plan:
// one network per family holding every node's pod subnet.
func flannelNetConf() ([]byte, error) {
	v4 := netip.PrefixFrom(PodCIDRv4(1).Addr(), 16).Masked()
	v6 := netip.PrefixFrom(PodCIDRv6(1).Addr(), 48).Masked()
	return json.MarshalIndent(map[string]any{
		"Network":       v4.String(),
		"SubnetLen":     PodCIDRv4(1).Bits(),
		"EnableIPv6":    true,
		"IPv6Network":   v6.String(),
		"IPv6SubnetLen": PodCIDRv6(1).Bits(),
		"Backend":       map[string]any{"Type": "vxlan", "VNI": 1, "Port": FlannelVXLANPort},
	}, "", "  ")
}

// startFlannel runs flanneld on every kubelet node (once the Nodes have
// their podCIDRs: setPodCIDRs) and waits until each node routes every
// other node's pod subnets through the overlay.
func (l *Lab) startFlannel(ctx context.Context) error {
	bin, err := FlannelBinary()
	if err != nil {
		return fmt.Errorf("--cni %s: %w", l.CNI, err)
	}
	conf, err := flannelNetConf()
	if err != nil {
		return err
	}
	for i := range l.Nodes {
		n := &l.Nodes[i]
		dir := filepath.Join(l.RunDir, n.Name)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		confFile := filepath.Join(dir, "flannel-net-conf.json")
		if err := os.WriteFile(confFile, conf, 0o644); err != nil {
			return err
		}
		d := &NodeDaemon{Name: CNIFlannel, Log: filepath.Join(dir, "flanneld.log"),
			Env: []string{"NODE_NAME=" + n.Name, "XTABLES_LOCKFILE=" + filepath.Join(dir, "xtables.lock")},
			Args: []string{bin,
				"--kube-subnet-mgr",
				"--kubeconfig-file=" + l.APIServer.Kubeconfig,
				"--net-config-path=" + confFile,
				"--subnet-file=" + filepath.Join(dir, "flannel-subnet.env"),
				"--iface=" + uplinkName,
				"--ip-masq=false", // the dataplane's to do (kube-proxy's MASQUERADE, sluice's SNAT)
				"--healthz-port=0",
			}}
		pid, err := l.startDaemonNS(n.Name, d.Log, n.Kubelet.nsenterArgs(), d.Env, d.Args...)
		if err != nil {
			return fmt.Errorf("start flanneld on %s: %w", n.Name, err)
		}
		d.PID = pid
		n.Overlay = d
		if err := l.save(); err != nil {
			return err
		}
	}
	for _, n := range l.Nodes {
		if err := l.waitOverlay(ctx, n, 2*time.Minute); err != nil {
			return err
		}
		l.step("overlay %s on %s routes the other nodes' pod subnets through %s and %s (pid %d)",
			l.CNI, n.Name, FlannelDevice, FlannelDevice6, n.Overlay.PID)
	}
	return nil
}

// overlayRoutesMissing lists the other nodes' pod subnets node n does not
// yet route through flanneld's devices.
func (l *Lab) overlayRoutesMissing(ctx context.Context, n Node) []string {
	var missing []string
	for _, m := range l.Nodes {
		if m.Index == n.Index {
			continue
		}
		for _, want := range []struct {
			p   netip.Prefix
			dev string
		}{{PodCIDRv4(m.Index), FlannelDevice}, {PodCIDRv6(m.Index), FlannelDevice6}} {
			fam := "-4"
			if want.p.Addr().Is6() {
				fam = "-6"
			}
			out, err := l.Command(ctx, n.Name, "ip", fam, "route", "show", "exact", want.p.String()).CombinedOutput()
			if err != nil || !strings.Contains(string(out), "dev "+want.dev+" ") {
				missing = append(missing, want.p.String()+" dev "+want.dev)
			}
		}
	}
	return missing
}

// waitOverlay waits until node n routes every other node's pod subnets
// through the overlay.
func (l *Lab) waitOverlay(ctx context.Context, n Node, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		missing := l.overlayRoutesMissing(ctx, n)
		if len(missing) == 0 {
			return nil
		}
		if !ProcessAlive(n.Overlay.PID) {
			return fmt.Errorf("flanneld on %s exited; log %s:\n%s", n.Name, n.Overlay.Log, logTail(n.Overlay.Log, 30))
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("flanneld on %s: no route for %s after %s; log %s:\n%s", n.Name,
				strings.Join(missing, ", "), timeout, n.Overlay.Log, logTail(n.Overlay.Log, 30))
		}
		if err := sleepCtx(ctx, 500*time.Millisecond); err != nil {
			return err
		}
	}
}
