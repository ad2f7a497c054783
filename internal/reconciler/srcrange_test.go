package reconciler

import (
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/types"

	"github.com/sluice-dataplane/sluice/internal/lbmap"
	lb "github.com/sluice-dataplane/sluice/internal/loadbalancer"
)

// srcRangeRecorder adds source ranges to recorder. After every write it
// checks what tc and XDP rely on: a master with SVC_F_SRC_RANGES has at
// least one prefix (an empty set would drop every client).
type srcRangeRecorder struct {
	*recorder
	ranges *lbmap.SourceRangesMemory
}

func newSrcRangeRecorder(t *testing.T) *srcRangeRecorder {
	return &srcRangeRecorder{recorder: newRecorder(t), ranges: lbmap.NewSourceRangesMemory()}
}

func (m *srcRangeRecorder) checked(err error) error {
	if err == nil {
		m.checkSrcRanges()
	}
	return err
}

func (m *srcRangeRecorder) UpdateService(k lbmap.ServiceKey, v lbmap.ServiceValue) error {
	return m.checked(m.recorder.UpdateService(k, v))
}

func (m *srcRangeRecorder) DeleteService(k lbmap.ServiceKey) error {
	return m.checked(m.recorder.DeleteService(k))
}

func (m *srcRangeRecorder) UpdateSourceRange(rn uint16, p netip.Prefix) error {
	return m.checked(m.record(m.ranges.UpdateSourceRange(rn, p), "sr+ %d %s", rn, p))
}

func (m *srcRangeRecorder) DeleteSourceRange(rn uint16, p netip.Prefix) error {
	return m.checked(m.record(m.ranges.DeleteSourceRange(rn, p), "sr- %d %s", rn, p))
}

func (m *srcRangeRecorder) SourceRanges() (map[uint16][]netip.Prefix, error) {
	return m.ranges.SourceRanges()
}

func (m *srcRangeRecorder) checkSrcRanges() {
	m.t.Helper()
	last := m.log[len(m.log)-1]
	for k, v := range m.Svcs {
		if k.Slot == 0 && v.Flags&lbmap.SvcFlagSourceRanges != 0 && len(m.ranges.Ranges[v.RevNatID]) == 0 {
			m.t.Errorf("after %q: master %s has SRC_RANGES but rev nat %d has no prefix", last, fmtKey(k), v.RevNatID)
		}
	}
}

func withRanges(s lb.LBService, prefixes ...string) lb.LBService {
	s.SourceRanges = nil
	for _, p := range prefixes {
		s.SourceRanges = append(s.SourceRanges, netip.MustParsePrefix(p))
	}
	return s
}

// masterOrRange keeps the log lines about masters and source ranges.
func masterOrRange(log []string) []string {
	var out []string
	for _, l := range log {
		if strings.HasPrefix(l, "sr") || (strings.HasPrefix(l, "svc") && strings.Contains(l, "#0")) {
			out = append(out, l)
		}
	}
	return out
}

// The LoadBalancer IP 198.19.200.1:80 of web (rev nat 1) and its NodePort
// *:30080 (rev nat 2), filtered through a sequence of changes.
func TestSourceRangesWriteOrder(t *testing.T) {
	m := newSrcRangeRecorder(t)
	r := mustNew(t, lbmap.MapsWithSourceRanges{Maps: m, SourceRangeMaps: m})
	backend := be("198.18.2.5:8080", "node-2")
	lbIP := svc(web, lb.LoadBalancer, "198.19.200.1:80", backend)
	// The model keeps ranges on LoadBalancer frontends only; a NodePort
	// that carries them anyway must not be filtered.
	nodePort := svc(web, lb.NodePort, "0.0.0.0:30080", backend)
	const (
		lbFlags = "0x4"   // LOADBALANCER
		lbSR    = "0x204" // LOADBALANCER|SRC_RANGES
		npFlags = "0x81"  // NODEPORT|WILDCARD
	)
	changed := map[types.NamespacedName]bool{web: true}
	for i, step := range []struct {
		name  string
		state *lb.State // nil: web is deleted
		want  []string
	}{
		{"ranges added: prefixes before the flag",
			state(withRanges(lbIP, "198.18.0.0/24", "fd00:198:18::/64"), withRanges(nodePort, "198.18.0.0/24")),
			[]string{
				"sr+ 1 198.18.0.0/24", "sr+ 1 fd00:198:18::/64",
				"svc+ 198.19.200.1:80/6 ext#0 count=1 rn=1 flags=" + lbSR,
				"svc+ 0.0.0.0:30080/6 ext#0 count=1 rn=2 flags=" + npFlags,
			}},
		{"unchanged: no writes",
			state(withRanges(lbIP, "198.18.0.0/24", "fd00:198:18::/64"), withRanges(nodePort, "198.18.0.0/24")),
			nil},
		{"one prefix replaced: new one first, old one after, master untouched",
			state(withRanges(lbIP, "198.18.0.0/24", "198.18.5.7/32"), nodePort),
			[]string{"sr+ 1 198.18.5.7/32", "sr- 1 fd00:198:18::/64"}},
		{"ranges removed: flag cleared before the prefixes go",
			state(lbIP, nodePort),
			[]string{
				"svc+ 198.19.200.1:80/6 ext#0 count=1 rn=1 flags=" + lbFlags,
				"sr- 1 198.18.0.0/24", "sr- 1 198.18.5.7/32",
			}},
		{"ranges back", state(withRanges(lbIP, "198.18.0.0/16"), nodePort),
			[]string{"sr+ 1 198.18.0.0/16", "svc+ 198.19.200.1:80/6 ext#0 count=1 rn=1 flags=" + lbSR}},
		{"service deleted: master before prefixes", state(),
			[]string{"svc- 198.19.200.1:80/6 ext#0", "sr- 1 198.18.0.0/16", "svc- 0.0.0.0:30080/6 ext#0"}},
	} {
		m.take()
		mustApply(t, r, step.state, changed)
		got := masterOrRange(m.take())
		// Frontends are synced in key order; compare per frontend.
		if !sameLines(got, step.want) {
			t.Errorf("step %d %q: master and range writes\n got %q\nwant %q", i, step.name, got, step.want)
		}
	}
	if len(m.ranges.Ranges) != 0 {
		t.Errorf("after delete: ranges left %v", m.ranges.Ranges)
	}
}

// sameLines compares logs, the order of lines about different frontends
// aside: lines are grouped by frontend (rev nat / address) in order.
func sameLines(got, want []string) bool {
	group := func(lines []string) map[string][]string {
		g := map[string][]string{}
		for _, l := range lines {
			k := "rn=1"
			if strings.Contains(l, "30080") || strings.HasPrefix(l, "sr") && strings.Fields(l)[1] == "2" {
				k = "rn=2"
			}
			g[k] = append(g[k], l)
		}
		return g
	}
	return len(got) == len(want) && reflect.DeepEqual(group(got), group(want))
}

func TestSourceRangesRestore(t *testing.T) {
	m := newSrcRangeRecorder(t)
	maps := lbmap.MapsWithSourceRanges{Maps: m, SourceRangeMaps: m}
	r := mustNew(t, maps)
	st := state(withRanges(svc(web, lb.LoadBalancer, "198.19.200.1:80", be("198.18.2.5:8080", "node-2")), "198.18.0.0/24"))
	mustApply(t, r, st, nil)
	// A leftover of a frontend that no longer exists (rev nat 9).
	if err := m.ranges.UpdateSourceRange(9, netip.MustParsePrefix("10.0.0.0/8")); err != nil {
		t.Fatal(err)
	}
	m.take()

	r2 := mustNew(t, maps)
	mustApply(t, r2, st, map[types.NamespacedName]bool{})
	want := []string{"sr- 9 10.0.0.0/8"}
	if got := m.take(); !slices.Equal(got, want) {
		t.Errorf("restore then Apply(unchanged): writes %q, want %q", got, want)
	}
	got, _ := m.ranges.SourceRanges()
	if w := map[uint16][]netip.Prefix{1: {netip.MustParsePrefix("198.18.0.0/24")}}; !reflect.DeepEqual(got, w) {
		t.Errorf("ranges after restore: %v, want %v", got, w)
	}
}

// Without SourceRangeMaps (a node without tc/XDP) ranges are ignored: the
// master carries no flag the datapath could not honour.
func TestSourceRangesWithoutMaps(t *testing.T) {
	m := newRecorder(t)
	r := mustNew(t, m)
	mustApply(t, r, state(withRanges(svc(web, lb.LoadBalancer, "198.19.200.1:80", be("198.18.2.5:8080", "node-2")), "198.18.0.0/24")), nil)
	if f := m.Svcs[svcKey("198.19.200.1:80", 0, 0)].Flags; f&lbmap.SvcFlagSourceRanges != 0 {
		t.Errorf("master flags %#x with SRC_RANGES, but the maps have no source ranges", f)
	}
}
