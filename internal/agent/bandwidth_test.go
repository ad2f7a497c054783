package agent

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluice-dataplane/sluice/internal/api"
	"github.com/sluice-dataplane/sluice/internal/bandwidth"
	"github.com/sluice-dataplane/sluice/internal/lbmap"
)

// bandwidthPod is a Pod of node1 at 198.18.1.(10+i) with annotations.
func bandwidthPod(name string, i int, ann string) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata:
  name: %s
  namespace: default
  annotations: {%s}
spec:
  nodeName: node1
  containers: [{name: c, image: x}]
status:
  phase: Running
  podIPs: [{ip: 198.18.1.%d}]
`, name, ann, 10+i)
}

// TestAgentBandwidthAnnotations runs the agent over a manifest directory
// with the bandwidth manager on an in-memory datapath: Pods' annotations
// reach it and change live; a bad one is a skip (status, metric) that
// leaves the Pod unlimited and the others alone; a Pod whose veth is not
// there yet is retried when a Pod route appears; status has the
// BandwidthManager line and `bpf bandwidth list` the limits.
func TestAgentBandwidthAnnotations(t *testing.T) {
	fakeCgroup(t)
	dir := t.TempDir()
	pods := func(web, bad, late string) string {
		return strings.Join([]string{nodeOne, bandwidthPod("web", 0, web), bandwidthPod("bad", 1, bad), bandwidthPod("late", 2, late)}, "---\n")
	}
	writeFile(t, dir, "pods.yaml", pods(`kubernetes.io/egress-bandwidth: "50M"`, `kubernetes.io/ingress-bandwidth: "fast"`,
		`kubernetes.io/ingress-bandwidth: "10M"`))
	sock := filepath.Join(t.TempDir(), "agent.sock")
	cfg, err := parse(t, "--node-name=node1", "--manifests="+dir, "--cgroup-root=/sys/fs/cgroup/unified/sluice-ag-test",
		"--api-socket="+sock, "--metrics-addr=127.0.0.1:0", "--healthz-bind-address=127.0.0.1:0", "--enable-bandwidth-manager")
	if err != nil {
		t.Fatal(err)
	}
	dp := &memDataplane{maps: lbmap.NewMemory()}
	pl, err := newModelPipeline(dp.maps, cfg)
	if err != nil {
		t.Fatal(err)
	}
	a := newAgent(cfg, discardLog(), NewManifestSource(dir, discardLog()), dp, pl, nil)
	a.bw = newBandwidthSide(cfg.NodeName)
	mem := bandwidth.NewMemory()
	mem.SetVeth(netip.MustParseAddr("198.18.1.10"), 10)
	mem.SetVeth(netip.MustParseAddr("198.18.1.11"), 11)
	// 198.18.1.12 ("late") has no veth yet.
	if a.bw.mgr, err = bandwidth.NewManager(mem, bandwidth.ManagerOptions{Mode: bandwidth.ModePolice}); err != nil {
		t.Fatal(err)
	}
	a.bw.decision, err = bandwidth.Decide(bandwidth.Facts{Release: "6.18.0", FQ: errors.New("no sch_fq")}, bandwidth.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- a.run(ctx) }()
	c := api.NewClient(sock)

	limits := func() map[string]string {
		l, err := c.BPFBandwidth(ctx)
		if err != nil {
			return nil // not up yet
		}
		out := map[string]string{}
		for _, e := range l.Entries {
			out[e.Pod+" "+e.Direction] = e.Rate
		}
		return out
	}
	eventually(t, "web limited", func() bool { return limits()["default/web egress"] == "50M" })
	st, err := c.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	bm := st.BandwidthManager
	if bm == nil || bm.Line != "TCP pacing with a BPF policer, TBF for ingress (kernel lacks sch_fq) [Pod veths]" || bm.Pods != 1 || bm.Invalid != 1 {
		t.Errorf("BandwidthManager status %+v", bm)
	}
	skips := map[string]string{}
	for _, s := range st.Skipped {
		skips[s.Object] = s.Reason + " " + s.Value
	}
	if skips["Pod default/bad"] != "bandwidth-annotation kubernetes.io/ingress-bandwidth=fast" || skips["Pod default/late"] != "bandwidth " {
		t.Errorf("skipped %v, want the bad annotation with its value and the Pod without a veth", skips)
	}
	if _, ok := limits()["default/bad ingress"]; ok {
		t.Error("a Pod with a bad annotation got a limit")
	}
	body := scrape(t, a)
	for _, want := range []string{`sluice_bandwidth_pods{state="limited"} 1`, `sluice_bandwidth_pods{state="bad-annotation"} 1`,
		`sluice_skipped_objects{reason="bandwidth-annotation"} 1`} {
		if !strings.Contains(body, want) {
			t.Errorf("metrics lack %q", want)
		}
	}

	// late's veth appears: a Pod route event retries it at once.
	mem.SetVeth(netip.MustParseAddr("198.18.1.12"), 12)
	a.bandwidthPodsChanged()
	eventually(t, "late limited once its veth is there", func() bool { return limits()["default/late ingress"] == "10M" })

	// Live: web's limit changes, bad is fixed, late's annotation goes.
	writeFile(t, dir, "pods.yaml", pods(`kubernetes.io/egress-bandwidth: "100M"`, `kubernetes.io/ingress-bandwidth: "20M"`, ``))
	eventually(t, "the changes applied", func() bool {
		l := limits()
		_, late := l["default/late ingress"]
		return l["default/web egress"] == "100M" && l["default/bad ingress"] == "20M" && !late
	})
	eventually(t, "the skips cleared", func() bool {
		st, err := c.Status(ctx)
		return err == nil && len(st.Skipped) == 0 && st.BandwidthManager.Invalid == 0 && st.BandwidthManager.Pods == 2
	})
	if got := len(mem.Aggregates()); got != 2 {
		t.Errorf("%d aggregates installed, want 2 (late's removed)", got)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("run: %v", err)
	}
}
