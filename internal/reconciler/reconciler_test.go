package reconciler

// Address plan (the lab's, BRIEF section 3):
//   node IPs           198.18.0.11 (node-1, this node), 198.18.0.12 (node-2)
//   pods of node N     198.18.N.0/24
//   ClusterIPs         198.19.0.0/17
//   External/LB IPs    198.19.200.0/24

import (
	"errors"
	"fmt"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/sluice-dataplane/sluice/internal/lbmap"
	lb "github.com/sluice-dataplane/sluice/internal/loadbalancer"
)

const thisNode = "node-1"

var (
	web   = types.NamespacedName{Namespace: "default", Name: "web"}
	api   = types.NamespacedName{Namespace: "default", Name: "api"}
	other = types.NamespacedName{Namespace: "default", Name: "other"}
)

func be(addrPort, node string) lb.Backend {
	ap := netip.MustParseAddrPort(addrPort)
	return lb.Backend{Addr: ap.Addr(), Port: ap.Port(), Proto: lb.TCP, Names: &lb.Names{NodeName: node, PodName: "pod-" + ap.Addr().String()}}
}

// svc returns an LBService of Service name for a TCP frontend.
func svc(name types.NamespacedName, t lb.FrontendType, frontend string, backends ...lb.Backend) lb.LBService {
	ap := netip.MustParseAddrPort(frontend)
	return lb.LBService{
		Name:     lb.ServiceName{NamespacedName: name, Port: "http"},
		Type:     t,
		Frontend: lb.Frontend{Addr: ap.Addr(), Port: ap.Port(), Proto: lb.TCP},
		Backends: backends,
	}
}

// state builds a State of svcs. A frontend under a Local policy without
// LocalBackends gets those of its Backends on thisNode, as Translate gives
// them when every backend is ready.
func state(svcs ...lb.LBService) *lb.State {
	st := &lb.State{Services: map[types.NamespacedName][]lb.LBService{}, NodeIPs: map[netip.Addr]bool{}}
	for _, s := range svcs {
		if (s.InternalTrafficLocal || (s.ExternalTrafficLocal && s.Type != lb.ClusterIP)) && s.LocalBackends == nil {
			s.LocalBackends = []lb.Backend{}
			for _, b := range s.Backends {
				if b.Node() == thisNode {
					s.LocalBackends = append(s.LocalBackends, b)
				}
			}
		}
		st.Services[s.Name.NamespacedName] = append(st.Services[s.Name.NamespacedName], s)
	}
	return st
}

func svcKey(frontend string, scope uint8, slot uint16) lbmap.ServiceKey {
	ap := netip.MustParseAddrPort(frontend)
	return lbmap.ServiceKey{Addr: lbmap.AddrFrom(ap.Addr()), Port: lbmap.PortFrom(ap.Port()), Proto: 6, Scope: scope, Slot: slot}
}

func beVal(addrPort string, flags uint8) lbmap.BackendValue {
	ap := netip.MustParseAddrPort(addrPort)
	return lbmap.BackendValue{Addr: lbmap.AddrFrom(ap.Addr()), Port: lbmap.PortFrom(ap.Port()), Proto: 6, Flags: flags}
}

func revNat(frontend string) lbmap.RevNatValue {
	ap := netip.MustParseAddrPort(frontend)
	return lbmap.RevNatValue{Addr: lbmap.AddrFrom(ap.Addr()), Port: lbmap.PortFrom(ap.Port())}
}

// recorder wraps Memory: it logs every successful write and, after each one,
// checks what an in-flight lookup relies on: every slot below a master's
// count exists and names an existing backend, rev nat entries exist, and a
// TWO_SCOPES master has an INT master.
type recorder struct {
	*lbmap.Memory
	t   *testing.T
	log []string
}

func newRecorder(t *testing.T) *recorder { return &recorder{Memory: lbmap.NewMemory(), t: t} }

func fmtKey(k lbmap.ServiceKey) string {
	scope := "ext"
	if k.Scope == lbmap.ScopeInternal {
		scope = "int"
	}
	return fmt.Sprintf("%s/%d %s#%d", netip.AddrPortFrom(k.Addr.NetIP(), k.Port.Host()), k.Proto, scope, k.Slot)
}

func (r *recorder) record(err error, format string, args ...any) error {
	if err == nil {
		r.log = append(r.log, fmt.Sprintf(format, args...))
		r.check()
	}
	return err
}

func (r *recorder) UpdateService(k lbmap.ServiceKey, v lbmap.ServiceValue) error {
	if k.Slot == 0 {
		return r.record(r.Memory.UpdateService(k, v), "svc+ %s count=%d rn=%d flags=%#x", fmtKey(k), v.Count, v.RevNatID, v.Flags)
	}
	return r.record(r.Memory.UpdateService(k, v), "svc+ %s be=%d rn=%d", fmtKey(k), v.BackendID, v.RevNatID)
}

func (r *recorder) DeleteService(k lbmap.ServiceKey) error {
	return r.record(r.Memory.DeleteService(k), "svc- %s", fmtKey(k))
}

func (r *recorder) UpdateBackend(id uint32, v lbmap.BackendValue) error {
	return r.record(r.Memory.UpdateBackend(id, v), "be+ %d %s flags=%#x", id, netip.AddrPortFrom(v.Addr.NetIP(), v.Port.Host()), v.Flags)
}

func (r *recorder) DeleteBackend(id uint32) error {
	return r.record(r.Memory.DeleteBackend(id), "be- %d", id)
}

func (r *recorder) UpdateRevNat(id uint16, v lbmap.RevNatValue) error {
	return r.record(r.Memory.UpdateRevNat(id, v), "rn+ %d", id)
}

func (r *recorder) DeleteRevNat(id uint16) error {
	return r.record(r.Memory.DeleteRevNat(id), "rn- %d", id)
}

func (r *recorder) UpdateNodeIP(a lbmap.Addr, n lbmap.NodeIP) error {
	return r.record(r.Memory.UpdateNodeIP(a, n), "node+ %s local=%v no-nodeport=%v", a.NetIP(), n.Local, n.NoNodePort)
}

func (r *recorder) DeleteNodeIP(a lbmap.Addr) error {
	return r.record(r.Memory.DeleteNodeIP(a), "node- %s", a.NetIP())
}

func (r *recorder) check() {
	r.t.Helper()
	for k, v := range r.Svcs {
		if k.Slot != 0 {
			continue
		}
		if _, ok := r.Revs[v.RevNatID]; !ok {
			r.t.Errorf("after %q: master %s names missing rev nat %d", r.log[len(r.log)-1], fmtKey(k), v.RevNatID)
		}
		if k.Scope == lbmap.ScopeExternal && v.Flags&lbmap.SvcFlagTwoScopes != 0 {
			ik := k
			ik.Scope = lbmap.ScopeInternal
			if _, ok := r.Svcs[ik]; !ok {
				r.t.Errorf("after %q: %s has TWO_SCOPES but no INT master", r.log[len(r.log)-1], fmtKey(k))
			}
		}
		for slot := uint16(1); slot <= v.Count; slot++ {
			sk := k
			sk.Slot = slot
			sv, ok := r.Svcs[sk]
			if !ok {
				r.t.Errorf("after %q: %s count %d but slot %d missing", r.log[len(r.log)-1], fmtKey(k), v.Count, slot)
				continue
			}
			if _, ok := r.Bes[sv.BackendID]; !ok {
				r.t.Errorf("after %q: %s names missing backend %d", r.log[len(r.log)-1], fmtKey(sk), sv.BackendID)
			}
		}
	}
}

// take returns the writes logged since the last call.
func (r *recorder) take() []string {
	out := r.log
	r.log = nil
	return out
}

func mustNew(t *testing.T, m lbmap.Maps) *Reconciler {
	t.Helper()
	r, err := New(m, thisNode)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return r
}

func mustApply(t *testing.T, r *Reconciler, st *lb.State, changed map[types.NamespacedName]bool) {
	t.Helper()
	if err := r.Apply(st, changed, true); err != nil {
		t.Fatalf("Apply: %v", err)
	}
}

func TestGoldenMapContents(t *testing.T) {
	m := newRecorder(t)
	r := mustNew(t, m)
	aff := svc(web, lb.ClusterIP, "198.19.0.10:80", be("198.18.1.5:8080", "node-1"), be("198.18.2.5:8080", "node-2"))
	aff.Affinity, aff.AffinityTimeout = true, 60*time.Second
	np := svc(web, lb.NodePort, "0.0.0.0:30080", be("198.18.1.5:8080", "node-1"), be("198.18.2.5:8080", "node-2"))
	np.Affinity, np.AffinityTimeout = true, 60*time.Second
	term := be("198.18.2.6:8080", "node-2")
	term.Terminating = true
	st := state(aff, np, svc(api, lb.ExternalIP, "198.19.200.1:443", term))
	st.NodeIPs = map[netip.Addr]bool{netip.MustParseAddr("198.18.0.11"): true, netip.MustParseAddr("198.18.0.12"): false}
	mustApply(t, r, st, nil)

	aflags := lbmap.SvcFlagAffinity
	npflags := lbmap.SvcFlagAffinity | lbmap.SvcFlagNodePort | lbmap.SvcFlagWildcard
	// Services are applied by name (api, then web), frontends in order.
	wantSvcs := map[lbmap.ServiceKey]lbmap.ServiceValue{
		svcKey("198.19.200.1:443", 0, 0): {Count: 1, RevNatID: 1, Flags: lbmap.SvcFlagExternalIP},
		svcKey("198.19.200.1:443", 0, 1): {BackendID: 1, RevNatID: 1},
		svcKey("198.19.0.10:80", 0, 0):   {Count: 2, RevNatID: 2, Flags: aflags, AffinityTimeout: 60},
		svcKey("198.19.0.10:80", 0, 1):   {BackendID: 2, RevNatID: 2},
		svcKey("198.19.0.10:80", 0, 2):   {BackendID: 3, RevNatID: 2},
		svcKey("0.0.0.0:30080", 0, 0):    {Count: 2, RevNatID: 3, Flags: npflags, AffinityTimeout: 60},
		svcKey("0.0.0.0:30080", 0, 1):    {BackendID: 2, RevNatID: 3},
		svcKey("0.0.0.0:30080", 0, 2):    {BackendID: 3, RevNatID: 3},
	}
	wantBes := map[uint32]lbmap.BackendValue{
		1: beVal("198.18.2.6:8080", lbmap.BackendFlagTerminating),
		2: beVal("198.18.1.5:8080", lbmap.BackendFlagLocal),
		3: beVal("198.18.2.5:8080", 0),
	}
	wantRevs := map[uint16]lbmap.RevNatValue{
		1: revNat("198.19.200.1:443"), 2: revNat("198.19.0.10:80"), 3: revNat("0.0.0.0:30080"),
	}
	// This node's address flagged so (north-south serves NodePorts on it
	// alone), another node's not.
	wantNodes := map[lbmap.Addr]lbmap.NodeIP{
		lbmap.AddrFrom(netip.MustParseAddr("198.18.0.11")): {Local: true},
		lbmap.AddrFrom(netip.MustParseAddr("198.18.0.12")): {},
	}
	if !reflect.DeepEqual(m.Svcs, wantSvcs) {
		t.Errorf("service map:\n got %v\nwant %v", m.Svcs, wantSvcs)
	}
	if !reflect.DeepEqual(m.Bes, wantBes) {
		t.Errorf("backend map:\n got %v\nwant %v", m.Bes, wantBes)
	}
	if !reflect.DeepEqual(m.Revs, wantRevs) {
		t.Errorf("rev nat map:\n got %v\nwant %v", m.Revs, wantRevs)
	}
	if !reflect.DeepEqual(m.Nodes, wantNodes) {
		t.Errorf("node IPs:\n got %v\nwant %v", m.Nodes, wantNodes)
	}
	// The v4 wildcard is keyed by ::ffff:0.0.0.0, so that a dual-stack
	// NodePort's IPv6 entry (::) is a different key.
	if k := svcKey("0.0.0.0:30080", 0, 0); k.Addr == (lbmap.Addr{}) {
		t.Errorf("v4 wildcard key is ::")
	}

	got := r.Installed()
	want := []InstalledService{
		{
			Name: aff.Name, Type: lb.ClusterIP, Frontend: aff.Frontend, Flags: aflags, RevNatID: 2, AffinityTimeout: 60,
			Backends: []InstalledBackend{
				{ID: 2, Addr: netip.MustParseAddr("198.18.1.5"), Port: 8080, Proto: lb.TCP, NodeName: "node-1", PodName: "pod-198.18.1.5", Local: true},
				{ID: 3, Addr: netip.MustParseAddr("198.18.2.5"), Port: 8080, Proto: lb.TCP, NodeName: "node-2", PodName: "pod-198.18.2.5"},
			},
		},
		{
			Name: np.Name, Type: lb.NodePort, Frontend: np.Frontend, Flags: npflags, RevNatID: 3, AffinityTimeout: 60,
			Backends: []InstalledBackend{
				{ID: 2, Addr: netip.MustParseAddr("198.18.1.5"), Port: 8080, Proto: lb.TCP, NodeName: "node-1", PodName: "pod-198.18.1.5", Local: true},
				{ID: 3, Addr: netip.MustParseAddr("198.18.2.5"), Port: 8080, Proto: lb.TCP, NodeName: "node-2", PodName: "pod-198.18.2.5"},
			},
		},
		{
			Name: lb.ServiceName{NamespacedName: api, Port: "http"}, Type: lb.ExternalIP,
			Frontend: lb.Frontend{Addr: netip.MustParseAddr("198.19.200.1"), Port: 443, Proto: lb.TCP},
			Flags:    lbmap.SvcFlagExternalIP, RevNatID: 1,
			Backends: []InstalledBackend{
				{ID: 1, Addr: netip.MustParseAddr("198.18.2.6"), Port: 8080, Proto: lb.TCP, NodeName: "node-2", PodName: "pod-198.18.2.6", Terminating: true},
			},
		},
	}
	// Installed sorts by name, then frontend.
	want = []InstalledService{want[2], want[1], want[0]}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Installed:\n got %+v\nwant %+v", got, want)
	}
}

func TestScopes(t *testing.T) {
	local := be("198.18.1.5:8080", "node-1")
	remote := be("198.18.2.5:8080", "node-2")
	ext := func(l lb.LBService) lb.LBService { l.ExternalTrafficLocal = true; return l }
	itp := func(l lb.LBService) lb.LBService { l.InternalTrafficLocal = true; return l }
	tests := []struct {
		name      string
		svc       lb.LBService
		wantFlags uint16
		wantExt   []uint32 // backend IDs by slot: 1 = local, 2 = remote
		wantInt   []uint32 // nil: no INT scope
	}{
		{
			name:    "cluster policies: one scope",
			svc:     svc(web, lb.NodePort, "0.0.0.0:30080", local, remote),
			wantExt: []uint32{1, 2}, wantFlags: lbmap.SvcFlagNodePort | lbmap.SvcFlagWildcard,
		},
		{
			name:      "ITP Local on ClusterIP: INT scope only local",
			svc:       itp(svc(web, lb.ClusterIP, "198.19.0.10:80", local, remote)),
			wantFlags: lbmap.SvcFlagITPLocal | lbmap.SvcFlagTwoScopes,
			wantExt:   []uint32{1, 2}, wantInt: []uint32{1},
		},
		{
			name:      "ETP Local on NodePort: EXT scope only local, pods use all",
			svc:       ext(svc(web, lb.NodePort, "0.0.0.0:30080", local, remote)),
			wantFlags: lbmap.SvcFlagNodePort | lbmap.SvcFlagWildcard | lbmap.SvcFlagETPLocal | lbmap.SvcFlagTwoScopes,
			wantExt:   []uint32{1}, wantInt: []uint32{1, 2},
		},
		{
			name:      "ETP Local on LoadBalancer without local backends: EXT empty",
			svc:       ext(svc(web, lb.LoadBalancer, "198.19.200.1:80", remote)),
			wantFlags: lbmap.SvcFlagLoadBalancer | lbmap.SvcFlagETPLocal | lbmap.SvcFlagTwoScopes,
			wantExt:   []uint32{}, wantInt: []uint32{1},
		},
		{
			name:    "ETP Local ignored on a ClusterIP frontend",
			svc:     ext(svc(web, lb.ClusterIP, "198.19.0.10:80", local, remote)),
			wantExt: []uint32{1, 2},
		},
		{
			name:      "ITP Local with only local backends: sets equal, one scope",
			svc:       itp(svc(web, lb.ClusterIP, "198.19.0.10:80", local)),
			wantFlags: lbmap.SvcFlagITPLocal,
			wantExt:   []uint32{1},
		},
		{
			name:      "ETP and ITP Local: both scopes local, one scope",
			svc:       itp(ext(svc(web, lb.ExternalIP, "198.19.200.1:80", local, remote))),
			wantFlags: lbmap.SvcFlagExternalIP | lbmap.SvcFlagETPLocal | lbmap.SvcFlagITPLocal,
			wantExt:   []uint32{1},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := newRecorder(t)
			r := mustNew(t, m)
			mustApply(t, r, state(tt.svc), nil)
			fe := tt.svc.Frontend.String()
			fe = fe[:strings.LastIndex(fe, "/")]
			slotsOf := func(scope uint8) ([]uint32, uint16, bool) {
				master, ok := m.Svcs[svcKey(fe, scope, 0)]
				if !ok {
					return nil, 0, false
				}
				ids := []uint32{}
				for i := uint16(1); i <= master.Count; i++ {
					ids = append(ids, m.Svcs[svcKey(fe, scope, i)].BackendID)
				}
				return ids, master.Flags, true
			}
			gotExt, flags, _ := slotsOf(lbmap.ScopeExternal)
			if flags != tt.wantFlags || !reflect.DeepEqual(gotExt, tt.wantExt) {
				t.Errorf("%+v: EXT flags %#x slots %v, want %#x %v", tt.svc, flags, gotExt, tt.wantFlags, tt.wantExt)
			}
			gotInt, intFlags, hasInt := slotsOf(lbmap.ScopeInternal)
			if !reflect.DeepEqual(gotInt, tt.wantInt) {
				t.Errorf("%+v: INT slots %v (present %v), want %v", tt.svc, gotInt, hasInt, tt.wantInt)
			}
			if hasInt && intFlags != tt.wantFlags&^lbmap.SvcFlagTwoScopes {
				t.Errorf("%+v: INT flags %#x, want %#x", tt.svc, intFlags, tt.wantFlags&^lbmap.SvcFlagTwoScopes)
			}
			// Back to cluster policies: the INT scope goes, EXT master first.
			plain := tt.svc
			plain.ExternalTrafficLocal, plain.InternalTrafficLocal = false, false
			m.take()
			mustApply(t, r, state(plain), nil)
			if _, _, hasInt := slotsOf(lbmap.ScopeInternal); hasInt {
				t.Errorf("%+v: INT scope left after going back to cluster policies: %q", tt.svc, m.take())
			}
		})
	}
}

func TestWriteOrder(t *testing.T) {
	b := func(i int) lb.Backend { return be(fmt.Sprintf("198.18.1.%d:8080", i), "node-2") }
	fe := "198.19.0.10:80"
	const key = "198.19.0.10:80/6"
	tests := []struct {
		name   string
		before lb.LBService
		after  lb.LBService
		want   []string
	}{
		{
			name:   "new frontend: rev nat, backends, slots, master",
			before: svc(other, lb.ClusterIP, "198.19.0.99:80"),
			after:  svc(web, lb.ClusterIP, fe, b(1), b(2)),
			want: []string{
				// other's frontend goes first, freeing room
				"svc- 198.19.0.99:80/6 ext#0", "rn- 1",
				"rn+ 2", "be+ 1 198.18.1.1:8080 flags=0x0", "be+ 2 198.18.1.2:8080 flags=0x0",
				"svc+ " + key + " ext#1 be=1 rn=2", "svc+ " + key + " ext#2 be=2 rn=2",
				"svc+ " + key + " ext#0 count=2 rn=2 flags=0x0",
			},
		},
		{
			name:   "grow: backend, slot, then master",
			before: svc(web, lb.ClusterIP, fe, b(1), b(2)),
			after:  svc(web, lb.ClusterIP, fe, b(1), b(2), b(3)),
			want: []string{
				"be+ 3 198.18.1.3:8080 flags=0x0",
				"svc+ " + key + " ext#3 be=3 rn=1",
				"svc+ " + key + " ext#0 count=3 rn=1 flags=0x0",
			},
		},
		{
			name:   "shrink from the end: master, slot, backend",
			before: svc(web, lb.ClusterIP, fe, b(1), b(2), b(3)),
			after:  svc(web, lb.ClusterIP, fe, b(1), b(2)),
			want: []string{
				"svc+ " + key + " ext#0 count=2 rn=1 flags=0x0",
				"svc- " + key + " ext#3",
				"be- 3",
			},
		},
		{
			name:   "shrink from the front: the last slot moves into the hole, then master, slots, backends",
			before: svc(web, lb.ClusterIP, fe, b(1), b(2), b(3), b(4)),
			after:  svc(web, lb.ClusterIP, fe, b(3), b(4)),
			want: []string{
				"svc+ " + key + " ext#1 be=4 rn=1",
				"svc+ " + key + " ext#2 be=3 rn=1",
				"svc+ " + key + " ext#0 count=2 rn=1 flags=0x0",
				"svc- " + key + " ext#4", "svc- " + key + " ext#3",
				"be- 1", "be- 2",
			},
		},
		{
			name:   "replace one backend: the new one takes the old one's slot",
			before: svc(web, lb.ClusterIP, fe, b(1), b(2), b(3)),
			after:  svc(web, lb.ClusterIP, fe, b(1), b(3), b(4)),
			want: []string{
				"be+ 4 198.18.1.4:8080 flags=0x0",
				"svc+ " + key + " ext#2 be=4 rn=1",
				"be- 2",
			},
		},
		{
			name:   "backend turns terminating: only the backend entry",
			before: svc(web, lb.ClusterIP, fe, b(1)),
			after:  svc(web, lb.ClusterIP, fe, func() lb.Backend { x := b(1); x.Terminating = true; return x }()),
			want:   []string{"be+ 1 198.18.1.1:8080 flags=0x1"},
		},
		{
			name: "second scope appears: INT slots and master before the EXT master announces it",
			before: svc(web, lb.ClusterIP, fe, be("198.18.1.1:8080", "node-1"),
				be("198.18.2.1:8080", "node-2")),
			after: func() lb.LBService {
				s := svc(web, lb.ClusterIP, fe, be("198.18.1.1:8080", "node-1"), be("198.18.2.1:8080", "node-2"))
				s.InternalTrafficLocal = true
				return s
			}(),
			want: []string{
				"svc+ " + key + " int#1 be=1 rn=1",
				"svc+ " + key + " int#0 count=1 rn=1 flags=0x40",
				"svc+ " + key + " ext#0 count=2 rn=1 flags=0x50",
			},
		},
		{
			name:   "deleted: master, slots, rev nat, backends",
			before: svc(web, lb.ClusterIP, fe, b(1), b(2)),
			after:  svc(other, lb.ClusterIP, "198.19.0.99:80"),
			want: []string{
				"svc- " + key + " ext#0", "svc- " + key + " ext#2", "svc- " + key + " ext#1",
				"rn- 1", "be- 1", "be- 2",
				"rn+ 2", "svc+ 198.19.0.99:80/6 ext#0 count=0 rn=2 flags=0x0",
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := newRecorder(t)
			r := mustNew(t, m)
			mustApply(t, r, state(tt.before), nil)
			m.take()
			changed := map[types.NamespacedName]bool{tt.before.Name.NamespacedName: true, tt.after.Name.NamespacedName: true}
			mustApply(t, r, state(tt.after), changed)
			if got := m.take(); !reflect.DeepEqual(got, tt.want) {
				t.Errorf("%v -> %v writes:\n got %q\nwant %q", tt.before.Backends, tt.after.Backends, got, tt.want)
			}
		})
	}
}

func TestSecondScopeGoesAway(t *testing.T) {
	m := newRecorder(t)
	r := mustNew(t, m)
	s := svc(web, lb.ClusterIP, "198.19.0.10:80", be("198.18.1.1:8080", "node-1"), be("198.18.2.1:8080", "node-2"))
	s.InternalTrafficLocal = true
	mustApply(t, r, state(s), nil)
	m.take()
	s.InternalTrafficLocal = false
	mustApply(t, r, state(s), map[types.NamespacedName]bool{web: true})
	want := []string{
		"svc+ 198.19.0.10:80/6 ext#0 count=2 rn=1 flags=0x0",
		"svc- 198.19.0.10:80/6 int#0",
		"svc- 198.19.0.10:80/6 int#1",
	}
	if got := m.take(); !reflect.DeepEqual(got, want) {
		t.Errorf("writes:\n got %q\nwant %q", got, want)
	}
}

func TestUnchangedWritesNothing(t *testing.T) {
	m := lbmap.NewMemory()
	r := mustNew(t, m)
	a := svc(web, lb.ClusterIP, "198.19.0.10:80", be("198.18.1.5:8080", "node-1"), be("198.18.2.5:8080", "node-2"))
	a.InternalTrafficLocal = true
	st := state(a, svc(api, lb.NodePort, "0.0.0.0:30443", be("198.18.1.5:8080", "node-1")))
	st.NodeIPs[netip.MustParseAddr("198.18.0.11")] = true
	mustApply(t, r, st, nil)
	writes := m.Writes
	for _, changed := range []map[types.NamespacedName]bool{nil, {web: true, api: true}, {}} {
		mustApply(t, r, st, changed)
		if m.Writes != writes {
			t.Errorf("Apply(unchanged, changed=%v) wrote %d entries", changed, m.Writes-writes)
		}
	}
}

func TestRestore(t *testing.T) {
	m := lbmap.NewMemory()
	r := mustNew(t, m)
	a := svc(web, lb.ClusterIP, "198.19.0.10:80", be("198.18.1.5:8080", "node-1"), be("198.18.2.5:8080", "node-2"))
	a.InternalTrafficLocal = true
	a.Affinity, a.AffinityTimeout = true, time.Hour
	b := svc(api, lb.NodePort, "0.0.0.0:30443", be("198.18.1.5:8080", "node-1"), be("198.18.1.6:8080", "node-1"))
	st := state(a, b)
	st.NodeIPs[netip.MustParseAddr("198.18.0.11")] = true
	mustApply(t, r, st, nil)
	before := r.Installed()

	// An agent restart: a new Reconciler over the same maps.
	r2 := mustNew(t, m)
	writes := m.Writes
	mustApply(t, r2, st, map[types.NamespacedName]bool{}) // the first Apply is full regardless
	if m.Writes != writes {
		t.Errorf("restore then Apply(unchanged) wrote %d entries", m.Writes-writes)
	}
	if after := r2.Installed(); !reflect.DeepEqual(after, before) {
		t.Errorf("Installed after restore:\n got %+v\nwant %+v", after, before)
	}

	// New IDs do not collide with restored ones (1-4: 198.18.1.5 has
	// one in web and one in api).
	c := svc(other, lb.ClusterIP, "198.19.0.30:80", be("198.18.2.9:8080", "node-2"))
	st.Services[other] = []lb.LBService{c}
	mustApply(t, r2, st, map[types.NamespacedName]bool{other: true})
	master := m.Svcs[svcKey("198.19.0.30:80", 0, 0)]
	slot := m.Svcs[svcKey("198.19.0.30:80", 0, 1)]
	if master.RevNatID != 3 || slot.BackendID != 5 || m.Bes[5] != beVal("198.18.2.9:8080", 0) {
		t.Errorf("new service after restore: master %+v slot %+v backends %v; want rev nat 3, backend 5", master, slot, m.Bes)
	}
}

func TestRestoreRemovesLeftovers(t *testing.T) {
	m := lbmap.NewMemory()
	r := mustNew(t, m)
	keep := svc(web, lb.ClusterIP, "198.19.0.10:80", be("198.18.1.5:8080", "node-1"))
	gone := svc(api, lb.ClusterIP, "198.19.0.20:80", be("198.18.1.6:8080", "node-1"))
	mustApply(t, r, state(keep, gone), nil)
	// Leftovers of a crash: an orphan slot beyond the count, an unused
	// backend, an unused rev nat.
	m.Svcs[svcKey("198.19.0.10:80", 0, 5)] = lbmap.ServiceValue{BackendID: 1, RevNatID: 1}
	m.Bes[77] = beVal("198.18.1.77:80", 0)
	m.Revs[99] = revNat("198.19.0.99:80")

	r2 := mustNew(t, m)
	mustApply(t, r2, state(keep), nil)
	// api (applied first, by name) had rev nat 1 and backend 1.
	wantSvcs := map[lbmap.ServiceKey]lbmap.ServiceValue{
		svcKey("198.19.0.10:80", 0, 0): {Count: 1, RevNatID: 2},
		svcKey("198.19.0.10:80", 0, 1): {BackendID: 2, RevNatID: 2},
	}
	if !reflect.DeepEqual(m.Svcs, wantSvcs) {
		t.Errorf("services after restore and sync:\n got %v\nwant %v", m.Svcs, wantSvcs)
	}
	if len(m.Bes) != 1 || len(m.Revs) != 1 {
		t.Errorf("backends %v rev nats %v, want only those of %s", m.Bes, m.Revs, web)
	}
}

func TestMapFullKeepsOthers(t *testing.T) {
	m := newRecorder(t)
	r := mustNew(t, m)
	a := svc(api, lb.ClusterIP, "198.19.0.20:80", be("198.18.1.5:8080", "node-1"))
	mustApply(t, r, state(a), nil)
	m.Capacity = len(m.Svcs) + 3 // room for other's two entries and one of web's

	bigger := svc(web, lb.ClusterIP, "198.19.0.10:80", be("198.18.1.6:8080", "node-1"), be("198.18.1.7:8080", "node-1"))
	c := svc(other, lb.ClusterIP, "198.19.0.30:80", be("198.18.1.8:8080", "node-1"))
	st := state(a, bigger, c)
	changed := map[types.NamespacedName]bool{web: true, other: true}
	err := r.Apply(st, changed, false)
	var ae *ApplyError
	if !errors.As(err, &ae) || ae.Err != nil || len(ae.Frontends) != 1 || Systemic(err) {
		t.Fatalf("Apply with a full map: error %v, want one frontend error and nothing systemic", err)
	}
	fe := ae.Frontends[0]
	full, isFull := fe.MapFull()
	if fe.Service != web || fe.Frontend.String() != "198.19.0.10:80/TCP" || !isFull ||
		full.Map != lbmap.ServicesMapName || full.MaxEntries != m.Capacity || !fe.Retry || fe.Need != 2 {
		t.Fatalf("frontend error %+v (full %+v), want default/web 198.19.0.10:80/TCP, %s full at %d, retry, 2 more entries needed",
			fe, full, lbmap.ServicesMapName, m.Capacity)
	}
	if !strings.Contains(err.Error(), "service default/web:http frontend 198.19.0.10:80/TCP") {
		t.Errorf("error text %q does not name the frontend", err)
	}
	if f := r.Failed(); len(f) != 1 || !f[web] {
		t.Errorf("Failed() = %v, want only %s", f, web)
	}
	if _, ok := m.Svcs[svcKey("198.19.0.30:80", 0, 0)]; !ok {
		t.Errorf("other Service not installed next to the failing one")
	}
	if _, ok := m.Svcs[svcKey("198.19.0.20:80", 0, 1)]; !ok {
		t.Errorf("existing Service lost entries")
	}
	if _, ok := m.Svcs[svcKey("198.19.0.10:80", 0, 0)]; ok {
		t.Errorf("failing Service has a master without its slots")
	}

	// An Apply of nothing does not retry on its own: the caller decides
	// when (with backoff), by naming the failed Services.
	m.Capacity = 0
	mustApply(t, r, st, map[types.NamespacedName]bool{})
	if _, ok := m.Svcs[svcKey("198.19.0.10:80", 0, 0)]; ok {
		t.Fatalf("web installed by an Apply that did not name it")
	}
	if err := r.Apply(st, r.Failed(), false); err != nil {
		t.Fatalf("retry after making room: %v", err)
	}
	if f := r.Failed(); len(f) != 0 {
		t.Errorf("Failed() after a successful retry = %v", f)
	}
	if v := m.Svcs[svcKey("198.19.0.10:80", 0, 0)]; v.Count != 2 {
		t.Errorf("web master after retry: %+v, want count 2", v)
	}
	writes := m.Writes
	mustApply(t, r, st, map[types.NamespacedName]bool{})
	if m.Writes != writes {
		t.Errorf("Apply after a successful retry wrote %d entries", m.Writes-writes)
	}
}

func TestSharedBackendsAndHandover(t *testing.T) {
	m := newRecorder(t)
	r := mustNew(t, m)
	shared := be("198.18.1.5:8080", "node-1")
	a := svc(web, lb.ExternalIP, "198.19.200.1:80", shared)
	b := svc(api, lb.ClusterIP, "198.19.0.20:80", shared)
	mustApply(t, r, state(a, b), nil)
	idOf := func(frontend string) uint32 { return m.Svcs[svcKey(frontend, 0, 1)].BackendID }
	// One ID per Service: leaving one never touches the other's.
	if len(m.Bes) != 2 || idOf("198.19.200.1:80") == idOf("198.19.0.20:80") {
		t.Fatalf("backend of two Services: IDs %d and %d, backends %v; want one ID in each",
			idOf("198.19.200.1:80"), idOf("198.19.0.20:80"), m.Bes)
	}
	// web gives its ExternalIP to other in one sync: the frontend stays,
	// its backend gets other's ID, web's goes.
	c := svc(other, lb.ExternalIP, "198.19.200.1:80", shared)
	webID := idOf("198.19.200.1:80")
	mustApply(t, r, state(b, c), map[types.NamespacedName]bool{web: true, other: true})
	if inst := r.Installed(); len(inst) != 2 || inst[1].Name.NamespacedName != other {
		t.Errorf("Installed after handover: %+v", inst)
	}
	if id := idOf("198.19.200.1:80"); id == webID || m.Bes[id] != beVal("198.18.1.5:8080", lbmap.BackendFlagLocal) {
		t.Errorf("after handover the frontend names backend %d (web's was %d): %v", id, webID, m.Bes)
	}
	if _, ok := m.Bes[webID]; ok || len(m.Bes) != 2 {
		t.Errorf("after handover: backends %v, want web's ID %d gone, api's and other's kept", m.Bes, webID)
	}
	// Deleting one user keeps the other's; deleting both removes it.
	mustApply(t, r, state(c), map[types.NamespacedName]bool{api: true})
	if len(m.Bes) != 1 {
		t.Errorf("backend removed while still used: %v", m.Bes)
	}
	mustApply(t, r, state(), map[types.NamespacedName]bool{other: true})
	if len(m.Svcs)+len(m.Bes)+len(m.Revs) != 0 {
		t.Errorf("entries left after deleting every Service: %v %v %v", m.Svcs, m.Bes, m.Revs)
	}
}

func TestFrontendConflict(t *testing.T) {
	m := newRecorder(t)
	r := mustNew(t, m)
	a := svc(web, lb.ExternalIP, "198.19.200.1:80", be("198.18.1.5:8080", "node-1"))
	b := svc(other, lb.ExternalIP, "198.19.200.1:80", be("198.18.1.6:8080", "node-1"))
	// Services apply in name order: other claims it first.
	err := r.Apply(state(a, b), nil, false)
	want := "service default/web:http frontend 198.19.200.1:80/TCP: already used by service default/other"
	if err == nil || err.Error() != want || Systemic(err) {
		t.Fatalf("Apply with two Services on one frontend: %v, want %q", err, want)
	}
	if v := m.Svcs[svcKey("198.19.200.1:80", 0, 1)]; m.Bes[v.BackendID] != beVal("198.18.1.6:8080", lbmap.BackendFlagLocal) {
		t.Errorf("frontend taken over by the second Service: %v", m.Bes)
	}
	// The owner leaves: the other one gets it on the retry.
	mustApply(t, r, state(a), map[types.NamespacedName]bool{other: true, web: true})
	if v := m.Svcs[svcKey("198.19.200.1:80", 0, 1)]; m.Bes[v.BackendID] != beVal("198.18.1.5:8080", lbmap.BackendFlagLocal) {
		t.Errorf("frontend not handed to the remaining Service: %v", m.Bes)
	}
}

func TestRevNatExhaustion(t *testing.T) {
	m := lbmap.NewMemory()
	r := mustNew(t, m)
	st := state()
	for i := range 1<<16 - 1 {
		name := types.NamespacedName{Namespace: "ns", Name: fmt.Sprintf("s%05d", i)}
		s := svc(name, lb.ClusterIP, fmt.Sprintf("198.19.%d.%d:80", i/256, i%256))
		st.Services[name] = []lb.LBService{s}
	}
	mustApply(t, r, st, nil)
	name := types.NamespacedName{Namespace: "ns", Name: "one-too-many"}
	st.Services[name] = []lb.LBService{svc(name, lb.ClusterIP, "198.19.255.255:80")}
	err := r.Apply(st, map[types.NamespacedName]bool{name: true}, false)
	if err == nil || !strings.Contains(err.Error(), "rev nat IDs exhausted") {
		t.Errorf("Apply of service 65536: %v, want rev nat exhaustion", err)
	}
	// Freeing one makes room.
	delete(st.Services, types.NamespacedName{Namespace: "ns", Name: "s00007"})
	if err := r.Apply(st, nil, false); err != nil {
		t.Errorf("Apply after freeing one ID: %v", err)
	}
	if _, ok := m.Svcs[svcKey("198.19.255.255:80", 0, 0)]; !ok {
		t.Errorf("service 65536 not installed after an ID was freed")
	}
}

func TestNodeIPs(t *testing.T) {
	m := newRecorder(t)
	r := mustNew(t, m)
	st := state()
	st.NodeIPs = map[netip.Addr]bool{netip.MustParseAddr("198.18.0.11"): true, netip.MustParseAddr("fd00:198:18::11"): true}
	mustApply(t, r, st, nil)
	m.take()
	st.NodeIPs = map[netip.Addr]bool{netip.MustParseAddr("198.18.0.11"): true, netip.MustParseAddr("198.18.0.12"): false}
	if err := r.Apply(st, map[types.NamespacedName]bool{}, false); err != nil || len(m.take()) != 0 {
		t.Errorf("node IPs written without nodesChanged (err %v)", err)
	}
	mustApply(t, r, st, map[types.NamespacedName]bool{})
	want := []string{"node+ 198.18.0.12 local=false no-nodeport=false", "node- fd00:198:18::11"}
	if got := m.take(); !reflect.DeepEqual(got, want) {
		t.Errorf("node IP writes %q, want %q", got, want)
	}
	// A node address that becomes this node's (or stops being) is
	// written again with its new flag.
	st.NodeIPs[netip.MustParseAddr("198.18.0.12")] = true
	mustApply(t, r, st, map[types.NamespacedName]bool{})
	want = []string{"node+ 198.18.0.12 local=true no-nodeport=false"}
	if got := m.take(); !reflect.DeepEqual(got, want) {
		t.Errorf("node IP writes after a flag change %q, want %q", got, want)
	}
	// An InternalIP --nodeport-addresses leaves out: written again with
	// the flag, and back without it.
	st.NoNodePort = map[netip.Addr]bool{netip.MustParseAddr("198.18.0.11"): true}
	mustApply(t, r, st, map[types.NamespacedName]bool{})
	want = []string{"node+ 198.18.0.11 local=true no-nodeport=true"}
	if got := m.take(); !reflect.DeepEqual(got, want) {
		t.Errorf("node IP writes after --nodeport-addresses %q, want %q", got, want)
	}
	st.NoNodePort = nil
	mustApply(t, r, st, map[types.NamespacedName]bool{})
	want = []string{"node+ 198.18.0.11 local=true no-nodeport=false"}
	if got := m.take(); !reflect.DeepEqual(got, want) {
		t.Errorf("node IP writes after the flag went %q, want %q", got, want)
	}
}

func TestLayout(t *testing.T) {
	slots := func(ids ...uint32) []lbmap.ServiceValue {
		var out []lbmap.ServiceValue
		for _, id := range ids {
			out = append(out, lbmap.ServiceValue{BackendID: id})
		}
		return out
	}
	tests := []struct {
		name string
		old  []lbmap.ServiceValue
		want []uint32
		out  []uint32
	}{
		{"empty", nil, nil, []uint32{}},
		{"fresh", nil, []uint32{3, 1, 2}, []uint32{3, 1, 2}},
		{"unchanged order kept", slots(2, 1), []uint32{1, 2}, []uint32{2, 1}},
		{"append", slots(1, 2), []uint32{1, 2, 3}, []uint32{1, 2, 3}},
		{"new fills hole", slots(1, 2, 3), []uint32{1, 3, 4}, []uint32{1, 4, 3}},
		{"tail moves into hole", slots(1, 2, 3, 4), []uint32{1, 3, 4}, []uint32{1, 4, 3}},
		{"all gone", slots(1, 2), nil, []uint32{}},
		{"orphan hole in old", slots(1, 0, 3), []uint32{1, 3}, []uint32{1, 3}},
	}
	for _, tt := range tests {
		got := layout(tt.old, tt.want)
		if len(got) == 0 && len(tt.out) == 0 {
			continue
		}
		if !reflect.DeepEqual(got, tt.out) {
			t.Errorf("%s: layout(%v, %v) = %v, want %v", tt.name, tt.old, tt.want, got, tt.out)
		}
	}
}

// TestInstalledWhileApplying reads the view from another goroutine, as the
// API does, while syncs run; run with -race.
func TestInstalledWhileApplying(t *testing.T) {
	r := mustNew(t, lbmap.NewMemory())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range 100 {
			s := svc(web, lb.ClusterIP, "198.19.0.10:80", be(fmt.Sprintf("198.18.1.%d:8080", 1+i%5), "node-1"))
			if err := r.Apply(state(s), map[types.NamespacedName]bool{web: true}, false); err != nil {
				t.Errorf("Apply %d: %v", i, err)
				return
			}
		}
	}()
	for running := true; running; {
		select {
		case <-done:
			running = false
		default:
			if inst := r.Installed(); len(inst) > 1 {
				t.Fatalf("Installed: %d frontends, want at most 1", len(inst))
			}
		}
	}
}

// Affinities lists the frontends with sessionAffinity, their timeout and
// the backends in their slots (both scopes); a backend that leaves goes.
func TestAffinities(t *testing.T) {
	m := lbmap.NewMemory()
	r := mustNew(t, m)
	a := svc(web, lb.ClusterIP, "198.19.0.10:80", be("198.18.1.5:8080", thisNode), be("198.18.2.5:8080", "node-2"))
	a.Affinity, a.AffinityTimeout = true, 3*time.Hour
	b := svc(api, lb.ClusterIP, "198.19.0.11:80", be("198.18.1.6:8080", thisNode))
	mustApply(t, r, state(a, b), nil)
	got := r.Affinities()
	if len(got) != 1 {
		t.Fatalf("Affinities = %+v, want web's frontend only", got)
	}
	for _, sc := range got {
		if sc.Timeout != 3*3600 || len(sc.Backends) != 2 {
			t.Errorf("web's affinity scope %+v, want timeout 10800 and 2 backends", sc)
		}
	}
	a.Backends = a.Backends[:1]
	mustApply(t, r, state(a, b), map[types.NamespacedName]bool{web: true})
	for _, sc := range r.Affinities() {
		if len(sc.Backends) != 1 {
			t.Errorf("after a backend left: %+v, want 1 backend", sc)
		}
	}
}

// A UDP frontend's lost backends are reported once each, a TCP frontend's
// never; a frontend that goes away loses them all.
func TestTakeRemovedUDP(t *testing.T) {
	r := mustNew(t, lbmap.NewMemory())
	udp := func(b lb.Backend) lb.Backend { b.Proto = lb.UDP; return b }
	dns := svc(web, lb.ClusterIP, "198.19.0.10:53", udp(be("198.18.1.5:53", "node-1")), udp(be("198.18.2.5:53", "node-2")))
	dns.Frontend.Proto = lb.UDP
	tcp := svc(api, lb.ClusterIP, "198.19.0.11:80", be("198.18.1.5:80", "node-1"), be("198.18.2.5:80", "node-2"))
	mustApply(t, r, state(dns, tcp), nil)
	if got := r.TakeRemovedUDP(); len(got) != 0 {
		t.Fatalf("after the first apply: %v", got)
	}
	dns.Backends, tcp.Backends = dns.Backends[:1], tcp.Backends[:1]
	mustApply(t, r, state(dns, tcp), nil)
	want := []RemovedUDP{{netip.MustParseAddrPort("198.19.0.10:53"), netip.MustParseAddrPort("198.18.2.5:53")}}
	if got := r.TakeRemovedUDP(); !slices.Equal(got, want) {
		t.Errorf("one UDP backend gone: %v, want %v", got, want)
	}
	if got := r.TakeRemovedUDP(); len(got) != 0 {
		t.Errorf("taken twice: %v", got)
	}
	mustApply(t, r, state(tcp), nil)
	want = []RemovedUDP{{netip.MustParseAddrPort("198.19.0.10:53"), netip.MustParseAddrPort("198.18.1.5:53")}}
	if got := r.TakeRemovedUDP(); !slices.Equal(got, want) {
		t.Errorf("UDP Service gone: %v, want %v", got, want)
	}
}

// Maps written when a backend had one ID across Services (an agent before
// per-Service IDs): after the restart the first Service to sync adopts the
// ID, so its flows keep their backend, and the other gets its own.
func TestRestoreSharedBackendID(t *testing.T) {
	m := lbmap.NewMemory()
	shared := beVal("198.18.1.5:8080", lbmap.BackendFlagLocal)
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(m.UpdateBackend(1, shared))
	for i, fe := range []string{"198.19.0.20:80", "198.19.200.1:80"} {
		rn := uint16(i + 1)
		ap := netip.MustParseAddrPort(fe)
		must(m.UpdateRevNat(rn, lbmap.RevNatValue{Addr: lbmap.AddrFrom(ap.Addr()), Port: lbmap.PortFrom(ap.Port())}))
		must(m.UpdateService(svcKey(fe, 0, 1), lbmap.ServiceValue{BackendID: 1, RevNatID: rn}))
		must(m.UpdateService(svcKey(fe, 0, 0), lbmap.ServiceValue{Count: 1, RevNatID: rn}))
	}
	r := mustNew(t, m)
	a := svc(api, lb.ClusterIP, "198.19.0.20:80", be("198.18.1.5:8080", "node-1"))
	w := svc(web, lb.ExternalIP, "198.19.200.1:80", be("198.18.1.5:8080", "node-1"))
	mustApply(t, r, state(a, w), nil)
	apiID := m.Svcs[svcKey("198.19.0.20:80", 0, 1)].BackendID
	webID := m.Svcs[svcKey("198.19.200.1:80", 0, 1)].BackendID
	if apiID != 1 || webID == 1 || webID == 0 || m.Bes[1] != shared || m.Bes[webID] != shared || len(m.Bes) != 2 {
		t.Errorf("after restore: api names backend %d, web %d, backends %v; want api to keep 1 (it syncs first), web a new ID for the same pod",
			apiID, webID, m.Bes)
	}
}

// TestIDLookup: FrontendOf names the frontend installed under a rev NAT
// ID, BackendInstalled says whether a slot names a backend ID; both follow
// removals, know nothing of IDs never given, and answer after a restore
// (restored frontends have no name until a sync claims them).
func TestIDLookup(t *testing.T) {
	m := lbmap.NewMemory()
	r := mustNew(t, m)
	a := svc(web, lb.ClusterIP, "198.19.0.10:80", be("198.18.1.5:8080", "node-1"), be("198.18.2.5:8080", "node-2"))
	mustApply(t, r, state(a), nil)
	master := m.Svcs[svcKey("198.19.0.10:80", 0, 0)]
	id1, id2 := m.Svcs[svcKey("198.19.0.10:80", 0, 1)].BackendID, m.Svcs[svcKey("198.19.0.10:80", 0, 2)].BackendID
	if n, ok := r.FrontendOf(master.RevNatID); !ok || n.Name.NamespacedName != web || n.Frontend.String() != "198.19.0.10:80/TCP" {
		t.Errorf("FrontendOf(%d) = %+v, %v; want web's 198.19.0.10:80/TCP", master.RevNatID, n, ok)
	}
	if _, ok := r.FrontendOf(master.RevNatID + 1); ok {
		t.Errorf("FrontendOf(%d), an ID never given: found", master.RevNatID+1)
	}
	if !r.BackendInstalled(id1) || !r.BackendInstalled(id2) || r.BackendInstalled(id2+1) {
		t.Errorf("BackendInstalled(%d, %d, %d) = %v %v %v; want true true false", id1, id2, id2+1,
			r.BackendInstalled(id1), r.BackendInstalled(id2), r.BackendInstalled(id2+1))
	}

	r2 := mustNew(t, m) // a restart
	if n, ok := r2.FrontendOf(master.RevNatID); !ok || n.Name.Name != "" || n.Frontend.String() != "198.19.0.10:80/TCP" {
		t.Errorf("restored: FrontendOf(%d) = %+v, %v; want the frontend, no name yet", master.RevNatID, n, ok)
	}
	if !r2.BackendInstalled(id1) {
		t.Errorf("restored: BackendInstalled(%d) false", id1)
	}

	a.Backends = a.Backends[:1]
	mustApply(t, r2, state(a), nil)
	if !r2.BackendInstalled(id1) || r2.BackendInstalled(id2) {
		t.Errorf("after removing %d: BackendInstalled(%d, %d) = %v %v; want true false", id2, id1, id2,
			r2.BackendInstalled(id1), r2.BackendInstalled(id2))
	}
	mustApply(t, r2, state(), map[types.NamespacedName]bool{web: true})
	if _, ok := r2.FrontendOf(master.RevNatID); ok || r2.BackendInstalled(id1) {
		t.Errorf("after deleting web: its frontend or backend still found")
	}
}
