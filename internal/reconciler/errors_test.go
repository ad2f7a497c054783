package reconciler

import (
	"errors"
	"fmt"
	"net/netip"
	"testing"

	"k8s.io/apimachinery/pkg/types"

	"github.com/sluice-dataplane/sluice/internal/lbmap"
	lb "github.com/sluice-dataplane/sluice/internal/loadbalancer"
)

// fullState has n ClusterIP Services s0..s(n-1), each with one backend: two
// service map entries apiece.
func fullState(n int) (*lb.State, []types.NamespacedName) {
	st := state()
	var names []types.NamespacedName
	for i := range n {
		name := types.NamespacedName{Namespace: "ns", Name: fmt.Sprintf("s%d", i)}
		st.Services[name] = []lb.LBService{svc(name, lb.ClusterIP, fmt.Sprintf("198.19.0.%d:80", i+1),
			be(fmt.Sprintf("198.18.1.%d:8080", i+1), thisNode))}
		names = append(names, name)
	}
	return st, names
}

func frontendErrors(t *testing.T, err error) []FrontendError {
	t.Helper()
	var ae *ApplyError
	if !errors.As(err, &ae) {
		t.Fatalf("error %v (%T), want an *ApplyError", err, err)
	}
	if ae.Err != nil || Systemic(err) {
		t.Fatalf("systemic part %v, want none", ae.Err)
	}
	return ae.Frontends
}

// A deletion that frees room retries the Services a full map refused in
// the same Apply, in name order, without waiting for the caller's retry;
// those that still do not fit stay failed, and the retry stops at the
// first of them instead of churning through the rest.
func TestMapFullRetriedWhenDeletionFreesRoom(t *testing.T) {
	m := lbmap.NewMemory()
	m.Capacity = 6 // three Services of five
	r := mustNew(t, m)
	st, names := fullState(5)
	fes := frontendErrors(t, r.Apply(st, nil, false))
	if len(fes) != 2 || fes[0].Service != names[3] || fes[1].Service != names[4] {
		t.Fatalf("failed %+v, want s3 and s4 (name order, the first three fit)", fes)
	}
	for _, fe := range fes {
		if full, ok := fe.MapFull(); !ok || full.Map != lbmap.ServicesMapName || fe.Need != 2 || !fe.Retry {
			t.Errorf("%+v: want %s full, 2 entries needed, retryable", fe, lbmap.ServicesMapName)
		}
	}

	// s0 goes: its two entries fit s3, not s4 as well.
	delete(st.Services, names[0])
	fes = frontendErrors(t, r.Apply(st, map[types.NamespacedName]bool{names[0]: true}, false))
	if len(fes) != 1 || fes[0].Service != names[4] {
		t.Fatalf("after deleting s0: failed %+v, want only s4", fes)
	}
	if _, ok := m.Svcs[svcKey("198.19.0.4:80", 0, 1)]; !ok {
		t.Errorf("s3 not installed in the Apply that freed room")
	}
	if f := r.Failed(); len(f) != 1 || !f[names[4]] {
		t.Errorf("Failed() = %v, want only s4", f)
	}

	// Nothing freed: an unrelated change does not touch s4.
	writes := m.Writes
	if err := r.Apply(st, map[types.NamespacedName]bool{}, false); err != nil {
		t.Fatalf("Apply of nothing: %v", err)
	}
	if m.Writes != writes {
		t.Errorf("Apply of nothing wrote %d entries (retried s4 without room)", m.Writes-writes)
	}
}

// A value that can never be programmed as it is fails alone and is not
// listed for retry.
func TestTooManyBackendsNotRetried(t *testing.T) {
	m := lbmap.NewMemory()
	r := mustNew(t, m)
	st, names := fullState(2)
	var bs []lb.Backend
	for i := range maxSlots + 1 {
		bs = append(bs, lb.Backend{Addr: netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)}), Port: 80, Proto: lb.TCP})
	}
	st.Services[names[0]][0].Backends = bs
	fes := frontendErrors(t, r.Apply(st, nil, false))
	if len(fes) != 1 || fes[0].Service != names[0] || fes[0].Retry {
		t.Fatalf("failed %+v, want s0 alone and not retryable", fes)
	}
	if len(r.Failed()) != 0 {
		t.Errorf("Failed() = %v, want none", r.Failed())
	}
	if _, ok := m.Svcs[svcKey("198.19.0.2:80", 0, 1)]; !ok {
		t.Errorf("s1 not installed next to the refused s0")
	}
}

// failingNodeIPs fails every node address write: a failure that is no
// frontend's.
type failingNodeIPs struct{ *lbmap.Memory }

func (f failingNodeIPs) UpdateNodeIP(lbmap.Addr, lbmap.NodeIP) error { return errors.New("injected") }

func TestSystemicErrorMakesNextApplyFull(t *testing.T) {
	m := failingNodeIPs{lbmap.NewMemory()}
	r := mustNew(t, m)
	st, _ := fullState(1)
	st.NodeIPs[netip.MustParseAddr("198.18.0.11")] = true
	err := r.Apply(st, nil, true)
	if !Systemic(err) {
		t.Fatalf("Apply with a failing node IP write: %v, want a systemic error", err)
	}
	if !r.needFull {
		t.Errorf("next Apply not full after a systemic error")
	}
	if Systemic(nil) {
		t.Errorf("Systemic(nil) = true")
	}
}
