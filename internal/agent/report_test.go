package agent

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/sluice-dataplane/sluice/internal/healthcheck"
	"github.com/sluice-dataplane/sluice/internal/lbmap"
)

func TestSkippedDiffOncePerChange(t *testing.T) {
	var s skipped
	t0 := time.Unix(100, 0)
	a := skip{Object: "Service default/a", Value: "198.19.200.1:80/TCP", Reason: skipConflict, Message: "held by default/old"}
	b := skip{Object: "Node 198.18.0.12", Reason: skipNeighbour, Message: "no route", Retry: true}
	d := s.update([]skip{a, b}, t0)
	if len(d.added) != 2 || len(d.cleared) != 0 {
		t.Fatalf("first sync: %+v, want both added", d)
	}
	if d := s.update([]skip{b, a}, t0.Add(time.Second)); len(d.added)+len(d.cleared) != 0 {
		t.Fatalf("same skips again: %+v, want no change (reported once)", d)
	}
	a2 := a
	a2.Message = "held by default/older"
	d = s.update([]skip{a2}, t0.Add(2*time.Second))
	if len(d.added) != 1 || d.added[0].Message != a2.Message || len(d.cleared) != 1 || d.cleared[0].Object != b.Object {
		t.Fatalf("changed message, b gone: %+v", d)
	}
	if l := s.list(); len(l) != 1 || !l[0].Since.Equal(t0) {
		t.Errorf("list %+v, want a since %v (first seen)", l, t0)
	}
	if s.retryable() {
		t.Errorf("retryable with only a conflict left")
	}
}

func TestFullMapsSummary(t *testing.T) {
	full := &lbmap.MapFullError{Map: lbmap.ServicesMapName, MaxEntries: 24}
	web, api := types.NamespacedName{Namespace: "d", Name: "web"}, types.NamespacedName{Namespace: "d", Name: "api"}
	ps := fullMaps([]skip{
		{Service: web, Value: "a", Full: full, Need: 3},
		{Service: web, Value: "b", Full: full, Need: 2},
		{Service: api, Value: "c", Full: full, Need: 4},
		{Service: api, Value: "d", Reason: skipConflict},
	})
	if len(ps) != 1 || ps[0].values != 3 || len(ps[0].services) != 2 || ps[0].need != 9 || ps[0].full.MaxEntries != 24 {
		t.Fatalf("fullMaps = %+v, want lb_services: 3 values of 2 Services, 9 entries needed", ps)
	}
}

// A full map is summarised once when it fills and once per retry, never
// per value or per sync in between.
func TestReportMapFullOncePerRetry(t *testing.T) {
	var buf bytes.Buffer
	a := newAgent(&Config{NodeName: "node1", SyncPeriod: time.Minute}, slog.New(slog.NewTextHandler(&buf, nil)), nil, nil, nopPipeline{}, nil)
	full := &lbmap.MapFullError{Map: lbmap.ServicesMapName, MaxEntries: 24}
	var skips []skip
	for i := range 500 {
		skips = append(skips, skip{Object: "Service d/s", Service: types.NamespacedName{Namespace: "d", Name: "s"}, Value: string(rune('a'+i%26)) + strings.Repeat("x", i/26),
			Reason: skipMapFull, Full: full, Need: 3, Retry: true})
	}
	count := func() int { return strings.Count(buf.String(), "BPF map full") }
	a.report(skips, false)
	a.report(skips, false) // a change's sync in between
	a.report(skips[:400], false)
	if n := count(); n != 1 {
		t.Fatalf("%d summaries after the map filled and two syncs, want 1:\n%s", n, buf.String())
	}
	a.report(skips, true)
	if n := count(); n != 2 {
		t.Fatalf("%d summaries after a retry, want 2", n)
	}
	if strings.Count(buf.String(), "level=WARN msg=skipped") != 0 {
		t.Errorf("full-map skips logged one by one:\n%s", buf.String())
	}
	st, _ := a.warnings.byKey["map-full/"+lbmap.ServicesMapName]
	if !strings.Contains(st.Message, "lb_services is full (24 entries): 500 values of 1 Services not programmed, about 1500 more entries needed") {
		t.Errorf("warning %+v", st)
	}
	a.report(nil, true)
	if _, ok := a.warnings.byKey["map-full/"+lbmap.ServicesMapName]; ok || !strings.Contains(buf.String(), "room again") {
		t.Errorf("map-full warning not cleared once everything fits:\n%s", buf.String())
	}
}

// stubPipeline returns what it is told from every Sync.
type stubPipeline struct {
	nopPipeline
	sum summary
	err error
}

func (p *stubPipeline) Sync(bool) (summary, error) { return p.sum, p.err }

// Health means "programs what it can and is current": a sync that skips an
// object keeps the agent healthy past the timeout; one that fails as a
// whole turns it unhealthy once a queued change waits longer than that.
func TestSyncHealthSkipVersusFailure(t *testing.T) {
	now := time.Unix(1000, 0)
	const timeout = 10 * time.Second
	pl := &stubPipeline{}
	a := newAgent(&Config{NodeName: "node1", SyncPeriod: time.Minute}, slog.New(slog.DiscardHandler), nil, nil, pl, nil)
	a.proxyHealth = healthcheck.NewProxierHealth(timeout, func() time.Time { return now })

	pl.sum.Skipped = []skip{{Object: "Service d/young", Value: "198.19.200.1:80/TCP", Reason: skipConflict, Message: "held"}}
	for range 5 {
		a.proxyHealth.QueuedUpdate()
		if out := a.syncOnce(false, false); out.failed || out.retry {
			t.Fatalf("sync with a conflict: %+v, want neither failed nor to retry", out)
		}
		now = now.Add(timeout - time.Second) // five of these: far past one timeout
		if !a.proxyHealth.IsHealthy() {
			t.Fatalf("unhealthy with only a skipped object")
		}
	}
	if sk := a.skips.list(); a.sync.Error != "" || a.sync.Skipped != 1 || len(sk) != 1 {
		t.Errorf("sync %+v skipped %+v, want OK with one skipped", a.sync, sk)
	}

	pl.err = errors.New("lb_node_ips: operation not permitted")
	a.proxyHealth.QueuedUpdate()
	if out := a.syncOnce(false, false); !out.failed {
		t.Fatalf("sync that failed as a whole: %+v, want failed", out)
	}
	now = now.Add(timeout)
	if a.proxyHealth.IsHealthy() {
		t.Errorf("healthy with a change waiting %v behind failing syncs", timeout)
	}
}

func TestBackoffDoublesToCapAndResets(t *testing.T) {
	b := backoff{base: time.Second, max: 5 * time.Second}
	var got []time.Duration
	for range 5 {
		got = append(got, b.next())
	}
	want := []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 5 * time.Second, 5 * time.Second}
	if !slices.Equal(got, want) {
		t.Errorf("steps %v, want %v", got, want)
	}
	b.reset()
	if d := b.next(); d != time.Second {
		t.Errorf("after reset: %v, want the base again", d)
	}
}

func TestSplitObjectErrors(t *testing.T) {
	node := &objectError{skip{Object: "Node 198.18.0.12", Reason: skipNeighbour, Message: "no route"}}
	pod := &objectError{skip{Object: "Backend 198.18.1.5", Reason: skipPodDevice, Message: "no veth"}}
	systemic := errors.New("write north-south config: operation not permitted")
	err := errors.Join(
		fmt.Errorf("local pod devices: %w", errors.Join(pod, errors.New("list routes: EBUSY"))),
		fmt.Errorf("neighbours for XDP: %w", node),
		systemic,
	)
	skips, rest := splitObjectErrors(err)
	if len(skips) != 2 || skips[0].Object != pod.skip.Object || skips[1].Object != node.skip.Object {
		t.Errorf("skips %+v, want the pod's and the node's", skips)
	}
	if rest == nil || !errors.Is(rest, systemic) || !strings.Contains(rest.Error(), "list routes: EBUSY") ||
		strings.Contains(rest.Error(), "no veth") {
		t.Errorf("rest %v, want the config write and the route listing only", rest)
	}
	if skips, rest := splitObjectErrors(nil); skips != nil || rest != nil {
		t.Errorf("nil: %v %v", skips, rest)
	}
}
