package reconciler

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/types"

	"github.com/sluice-dataplane/sluice/internal/lbmap"
	lb "github.com/sluice-dataplane/sluice/internal/loadbalancer"
	"github.com/sluice-dataplane/sluice/internal/maglev"
)

// Address plan: as in reconciler_test.go. Maglev tables here have 251
// entries, the smallest size allowed, to keep failure output short.
const testTableSize = 251

// maglevRecorder adds Maglev tables to recorder. After every write that can
// break a lookup it checks what tc and XDP rely on: a master with
// SVC_F_MAGLEV has a table, and every table entry names an installed
// backend.
type maglevRecorder struct {
	*recorder
	tables *lbmap.MaglevMemory
}

func newMaglevRecorder(t *testing.T) *maglevRecorder {
	return &maglevRecorder{recorder: newRecorder(t), tables: lbmap.NewMaglevMemory(testTableSize)}
}

func (m *maglevRecorder) checked(err error) error {
	if err == nil {
		m.checkMaglev()
	}
	return err
}

func (m *maglevRecorder) UpdateService(k lbmap.ServiceKey, v lbmap.ServiceValue) error {
	return m.checked(m.recorder.UpdateService(k, v))
}

func (m *maglevRecorder) DeleteService(k lbmap.ServiceKey) error {
	return m.checked(m.recorder.DeleteService(k))
}

func (m *maglevRecorder) DeleteBackend(id uint32) error {
	return m.checked(m.recorder.DeleteBackend(id))
}

func (m *maglevRecorder) UpdateMaglev(rn uint16, table []uint32) error {
	return m.checked(m.record(m.tables.UpdateMaglev(rn, table), "mg+ %d %s", rn, spread(table)))
}

func (m *maglevRecorder) DeleteMaglev(rn uint16) error {
	return m.checked(m.record(m.tables.DeleteMaglev(rn), "mg- %d", rn))
}

func (m *maglevRecorder) Maglevs() (map[uint16][]uint32, error) { return m.tables.Maglevs() }

// spread renders a table as its sorted backend IDs, "[1 2 3]".
func spread(table []uint32) string {
	ids := slices.Clone(table)
	slices.Sort(ids)
	return fmt.Sprint(slices.Compact(ids))
}

func (m *maglevRecorder) checkMaglev() {
	m.t.Helper()
	last := m.log[len(m.log)-1]
	for k, v := range m.Svcs {
		if k.Slot == 0 && v.Flags&lbmap.SvcFlagMaglev != 0 {
			if _, ok := m.tables.Tables[v.RevNatID]; !ok {
				m.t.Errorf("after %q: master %s has MAGLEV but rev nat %d has no table", last, fmtKey(k), v.RevNatID)
			}
		}
	}
	for rn, table := range m.tables.Tables {
		for i, id := range table {
			if _, ok := m.Bes[id]; !ok {
				m.t.Errorf("after %q: maglev table %d entry %d names missing backend %d", last, rn, i, id)
				break
			}
		}
	}
}

func mustNewMaglev(t *testing.T, m lbmap.Maps, nodeName string, cfg maglev.Config) *Reconciler {
	t.Helper()
	b, err := maglev.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	r, err := New(m, nodeName, WithMaglev(b))
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return r
}

func withMaglev(s lb.LBService) lb.LBService {
	s.Algorithm = lb.AlgorithmMaglev
	return s
}

func nb(i int) lb.Backend { return be(fmt.Sprintf("198.18.2.%d:8080", i), "node-2") }

// wantTable is the table for the backends as the maglev package builds it,
// with the IDs the maps give their addresses.
func wantTable(t *testing.T, m *lbmap.Memory, cfg maglev.Config, frontend string, bes ...lb.Backend) []uint32 {
	t.Helper()
	// The IDs the frontend's slots name: a backend has one per Service.
	idOf := map[string]uint32{}
	for k, v := range m.Svcs {
		if k.Slot == 0 || k.Scope != lbmap.ScopeExternal || k != svcKey(frontend, k.Scope, k.Slot) {
			continue
		}
		be := m.Bes[v.BackendID]
		idOf[netip.AddrPortFrom(be.Addr.NetIP(), be.Port.Host()).String()] = v.BackendID
	}
	in := make([]maglev.Backend, len(bes))
	for i, b := range bes {
		in[i] = maglev.Backend{Name: b.AddrPort().String() + "/TCP"}
	}
	mg, _ := maglev.New(cfg)
	idx, err := mg.Build(in)
	if err != nil {
		t.Fatal(err)
	}
	out := make([]uint32, len(idx))
	for i, bi := range idx {
		out[i] = idOf[bes[bi].AddrPort().String()]
	}
	return out
}

func TestMaglevOnlyNorthSouth(t *testing.T) {
	cfg := maglev.Config{TableSize: testTableSize, Seed: 7}
	m := newMaglevRecorder(t)
	r := mustNewMaglev(t, m, thisNode, cfg)
	bes := []lb.Backend{nb(1), nb(2), nb(3)}
	st := state(
		withMaglev(svc(web, lb.ClusterIP, "198.19.0.10:80", bes...)),
		withMaglev(svc(web, lb.NodePort, "0.0.0.0:30080", bes...)),
		withMaglev(svc(web, lb.ExternalIP, "198.19.200.8:80", bes...)),
		withMaglev(svc(web, lb.LoadBalancer, "198.19.200.1:80", bes...)),
		svc(api, lb.LoadBalancer, "198.19.200.2:80", bes...), // random
	)
	mustApply(t, r, st, nil)

	for _, tc := range []struct {
		frontend string
		want     bool
	}{
		{"198.19.0.10:80", false},
		{"0.0.0.0:30080", true},
		{"198.19.200.8:80", true},
		{"198.19.200.1:80", true},
		{"198.19.200.2:80", false},
	} {
		master := m.Svcs[svcKey(tc.frontend, lbmap.ScopeExternal, 0)]
		table, has := m.tables.Tables[master.RevNatID]
		if got := master.Flags&lbmap.SvcFlagMaglev != 0; got != tc.want || has != tc.want {
			t.Errorf("%s: MAGLEV flag %v, table %v; want %v", tc.frontend, got, has, tc.want)
		}
		if has && !slices.Equal(table, wantTable(t, m.Memory, cfg, tc.frontend, bes...)) {
			t.Errorf("%s: table %v, want the maglev package's table for %v", tc.frontend, table, bes)
		}
	}
	if n := len(m.tables.Tables); n != 3 {
		t.Errorf("%d tables, want 3 (NodePort, ExternalIP, LoadBalancer)", n)
	}
}

// Maps without MaglevMaps (an older datapath) keep random selection.
func TestMaglevWithoutMaglevMaps(t *testing.T) {
	m := newRecorder(t)
	r := mustNew(t, m)
	mustApply(t, r, state(withMaglev(svc(web, lb.NodePort, "0.0.0.0:30080", nb(1), nb(2)))), nil)
	if f := m.Svcs[svcKey("0.0.0.0:30080", 0, 0)].Flags; f&lbmap.SvcFlagMaglev != 0 {
		t.Errorf("master flags %#x: MAGLEV set without Maglev maps", f)
	}
}

func TestMaglevWriteOrder(t *testing.T) {
	const fe = "198.19.200.1:80"
	const key = fe + "/6"
	lbSvc := func(bes ...lb.Backend) lb.LBService { return withMaglev(svc(web, lb.LoadBalancer, fe, bes...)) }
	random := func(bes ...lb.Backend) lb.LBService { return svc(web, lb.LoadBalancer, fe, bes...) }
	flags := fmt.Sprintf("%#x", lbmap.SvcFlagLoadBalancer|lbmap.SvcFlagMaglev)
	tests := []struct {
		name          string
		before, after *lb.LBService
		want          []string
	}{
		{
			name:  "new: backends, slots, table, then the master",
			after: ptr(lbSvc(nb(1), nb(2))),
			want: []string{
				"rn+ 1", "be+ 1 198.18.2.1:8080 flags=0x0", "be+ 2 198.18.2.2:8080 flags=0x0",
				"svc+ " + key + " ext#1 be=1 rn=1", "svc+ " + key + " ext#2 be=2 rn=1",
				"mg+ 1 [1 2]",
				"svc+ " + key + " ext#0 count=2 rn=1 flags=" + flags,
			},
		},
		{
			name:   "grow: the new backend before the table that names it",
			before: ptr(lbSvc(nb(1), nb(2))),
			after:  ptr(lbSvc(nb(1), nb(2), nb(3))),
			want: []string{
				"be+ 3 198.18.2.3:8080 flags=0x0", "svc+ " + key + " ext#3 be=3 rn=1",
				"mg+ 1 [1 2 3]",
				"svc+ " + key + " ext#0 count=3 rn=1 flags=" + flags,
			},
		},
		{
			name:   "shrink: the table stops naming the backend before it goes",
			before: ptr(lbSvc(nb(1), nb(2), nb(3))),
			after:  ptr(lbSvc(nb(1), nb(2))),
			want: []string{
				"mg+ 1 [1 2]",
				"svc+ " + key + " ext#0 count=2 rn=1 flags=" + flags,
				"svc- " + key + " ext#3", "be- 3",
			},
		},
		{
			name:   "backend flags change, same set: no table write",
			before: ptr(lbSvc(nb(1), nb(2))),
			after: ptr(func() lb.LBService {
				b2 := nb(2)
				b2.Terminating = true
				return lbSvc(nb(1), b2)
			}()),
			want: []string{"be+ 2 198.18.2.2:8080 flags=0x1"},
		},
		{
			name:   "to random: the master drops the flag, then the table goes",
			before: ptr(lbSvc(nb(1), nb(2))),
			after:  ptr(random(nb(1), nb(2))),
			want: []string{
				fmt.Sprintf("svc+ %s ext#0 count=2 rn=1 flags=%#x", key, lbmap.SvcFlagLoadBalancer),
				"mg- 1",
			},
		},
		{
			name:   "from random: the table, then the flag",
			before: ptr(random(nb(1), nb(2))),
			after:  ptr(lbSvc(nb(1), nb(2))),
			want:   []string{"mg+ 1 [1 2]", "svc+ " + key + " ext#0 count=2 rn=1 flags=" + flags},
		},
		{
			name:   "no backends left: no table, no flag",
			before: ptr(lbSvc(nb(1))),
			after:  ptr(lbSvc()),
			want: []string{
				fmt.Sprintf("svc+ %s ext#0 count=0 rn=1 flags=%#x", key, lbmap.SvcFlagLoadBalancer),
				"mg- 1", "svc- " + key + " ext#1", "be- 1",
			},
		},
		{
			name:   "deleted: master, table, slots, rev nat, backends",
			before: ptr(lbSvc(nb(1))),
			want:   []string{"svc- " + key + " ext#0", "mg- 1", "svc- " + key + " ext#1", "rn- 1", "be- 1"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := newMaglevRecorder(t)
			r := mustNewMaglev(t, m, thisNode, maglev.Config{TableSize: testTableSize})
			st := func(s *lb.LBService) *lb.State {
				if s == nil {
					return state()
				}
				return state(*s)
			}
			if tt.before != nil {
				mustApply(t, r, st(tt.before), nil)
			}
			m.take()
			mustApply(t, r, st(tt.after), map[types.NamespacedName]bool{web: true})
			if got := m.take(); !slices.Equal(got, tt.want) {
				t.Errorf("writes:\n got %q\nwant %q", got, tt.want)
			}
		})
	}
}

func TestMaglevUnchangedWritesNothing(t *testing.T) {
	m := newMaglevRecorder(t)
	r := mustNewMaglev(t, m, thisNode, maglev.Config{TableSize: testTableSize})
	st := state(withMaglev(svc(web, lb.NodePort, "0.0.0.0:30080", nb(1), nb(2), nb(3))))
	mustApply(t, r, st, nil)
	m.take()
	for _, changed := range []map[types.NamespacedName]bool{nil, {web: true}} {
		mustApply(t, r, st, changed)
		if got := m.take(); len(got) != 0 {
			t.Errorf("Apply(unchanged, changed=%v) wrote %q", changed, got)
		}
	}
}

// externalTrafficPolicy Local: the table covers this node's backends only.
func TestMaglevETPLocal(t *testing.T) {
	cfg := maglev.Config{TableSize: testTableSize}
	m := newMaglevRecorder(t)
	r := mustNewMaglev(t, m, thisNode, cfg)
	local1, local2 := be("198.18.1.5:8080", thisNode), be("198.18.1.6:8080", thisNode)
	s := withMaglev(svc(web, lb.LoadBalancer, "198.19.200.1:80", local1, nb(1), local2, nb(2)))
	s.ExternalTrafficLocal = true
	mustApply(t, r, state(s), nil)
	master := m.Svcs[svcKey("198.19.200.1:80", 0, 0)]
	if got, want := m.tables.Tables[master.RevNatID], wantTable(t, m.Memory, cfg, "198.19.200.1:80", local1, local2); !slices.Equal(got, want) {
		t.Errorf("ETP Local table uses backends %s, want the local ones %s", spread(got), spread(want))
	}
}

// Two nodes with the same backends build the same table, whatever the
// order they learnt the backends in and whatever local IDs they gave them:
// a flow reaching either node for the LoadBalancer IP goes to one backend.
func TestMaglevSameOnEveryNode(t *testing.T) {
	cfg := maglev.Config{TableSize: testTableSize, Seed: 99}
	bes := []lb.Backend{nb(1), nb(2), nb(3), be("198.18.1.5:8080", "node-1")}
	node1, node2 := newMaglevRecorder(t), newMaglevRecorder(t)
	r1 := mustNewMaglev(t, node1, "node-1", cfg)
	r2 := mustNewMaglev(t, node2, "node-2", cfg)

	mustApply(t, r1, state(withMaglev(svc(web, lb.LoadBalancer, "198.19.200.1:80", bes...))), nil)
	// node-2 first learnt another Service, so its backend IDs differ, and
	// lists the backends in another order.
	reversed := slices.Clone(bes)
	slices.Reverse(reversed)
	st := state(svc(api, lb.ClusterIP, "198.19.0.20:80", nb(7), nb(8)), withMaglev(svc(web, lb.LoadBalancer, "198.19.200.1:80", reversed...)))
	mustApply(t, r2, st, nil)

	tableOf := func(m *maglevRecorder) []uint32 {
		return m.tables.Tables[m.Svcs[svcKey("198.19.200.1:80", 0, 0)].RevNatID]
	}
	resolve := func(m *maglevRecorder) []string {
		table := tableOf(m)
		out := make([]string, len(table))
		for i, id := range table {
			v := m.Bes[id]
			out[i] = netip.AddrPortFrom(v.Addr.NetIP(), v.Port.Host()).String()
		}
		return out
	}
	t1, t2 := resolve(node1), resolve(node2)
	if len(t1) != testTableSize || !slices.Equal(t1, t2) {
		t.Errorf("node-1 and node-2 tables differ:\nnode-1 %s\nnode-2 %s", strings.Join(t1[:10], " "), strings.Join(t2[:10], " "))
	}
	if ids1, ids2 := spread(tableOf(node1)), spread(tableOf(node2)); ids1 == ids2 {
		t.Errorf("both nodes use backend IDs %s: the test does not exercise differing local IDs", ids1)
	}
}

func TestMaglevRestore(t *testing.T) {
	cfg := maglev.Config{TableSize: testTableSize, Seed: 1}
	m := newMaglevRecorder(t)
	r := mustNewMaglev(t, m, thisNode, cfg)
	st := state(
		withMaglev(svc(web, lb.LoadBalancer, "198.19.200.1:80", nb(1), nb(2))),
		withMaglev(svc(api, lb.NodePort, "0.0.0.0:30443", nb(3))),
	)
	mustApply(t, r, st, nil)
	m.take()

	t.Run("unchanged: no writes", func(t *testing.T) {
		r2 := mustNewMaglev(t, m, thisNode, cfg)
		mustApply(t, r2, st, map[types.NamespacedName]bool{})
		if got := m.take(); len(got) != 0 {
			t.Errorf("restore then Apply(unchanged) wrote %q", got)
		}
	})
	// api (rev nat 1) has one backend: its table is the same for any seed.
	t.Run("another seed: tables that differ are rewritten, masters untouched", func(t *testing.T) {
		r2 := mustNewMaglev(t, m, thisNode, maglev.Config{TableSize: testTableSize, Seed: 2})
		mustApply(t, r2, st, nil)
		if got, want := m.take(), []string{"mg+ 2 [2 3]"}; !slices.Equal(got, want) {
			t.Errorf("restore with a new seed wrote %q, want %q", got, want)
		}
	})
	t.Run("table without a frontend: removed", func(t *testing.T) {
		m.tables.Tables[500] = make([]uint32, testTableSize)
		r2 := mustNewMaglev(t, m, thisNode, maglev.Config{TableSize: testTableSize, Seed: 2})
		mustApply(t, r2, st, nil)
		if got, want := m.take(), []string{"mg- 500"}; !slices.Equal(got, want) {
			t.Errorf("restore with a stale table wrote %q, want %q", got, want)
		}
	})
}

func TestMaglevUpdateFailureKeepsMaster(t *testing.T) {
	m := newMaglevRecorder(t)
	r := mustNewMaglev(t, m, thisNode, maglev.Config{TableSize: testTableSize})
	mustApply(t, r, state(withMaglev(svc(web, lb.LoadBalancer, "198.19.200.1:80", nb(1)))), nil)
	m.tables.Size = testTableSize + 1 // every update now fails
	err := r.Apply(state(withMaglev(svc(web, lb.LoadBalancer, "198.19.200.1:80", nb(1), nb(2)))), nil, false)
	if err == nil || !strings.Contains(err.Error(), "maglev table 1") {
		t.Fatalf("Apply with failing table writes: %v, want an error naming maglev table 1", err)
	}
	if c := m.Svcs[svcKey("198.19.200.1:80", 0, 0)].Count; c != 1 {
		t.Errorf("master count %d after a failed table write, want the old 1", c)
	}
	m.tables.Size = testTableSize
	if f := r.Failed(); !f[web] {
		t.Fatalf("Failed() = %v, want %s to retry", f, web)
	}
	mustApply(t, r, state(withMaglev(svc(web, lb.LoadBalancer, "198.19.200.1:80", nb(1), nb(2)))), r.Failed())
	if c := m.Svcs[svcKey("198.19.200.1:80", 0, 0)].Count; c != 2 {
		t.Errorf("master count %d after the retry, want 2", c)
	}
}
