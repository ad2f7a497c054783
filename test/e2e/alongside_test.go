package e2e

import (
	"fmt"
	"io"
	"os"
	"slices"
	"sync"
	"testing"
	"time"
)

// Tests that mostly wait (a kubelet lab's control plane and pods, a soak
// paced by the clock, a guest's emulated CPU), and labs whose checks are
// functional with generous timeouts (the contenders, the migration tests,
// host ports: 2 s a request or more), run beside each other once
// every serial test of the package has ended: about half of this package's
// time (docs/testing.md). Only tests whose lab shares nothing with
// another's do: its own prefix names its namespaces, cgroups, pins, run
// directory and mount namespaces, and its addresses live behind its own
// fabric namespace. And only tests whose verdicts hold with less CPU: no
// test that measures a rate against a band or floods at the generator's
// maximum (those stay serial, or take lane alone).
//
// go test would start them in whatever order its goroutines wake, so the
// longest could start last and hold the phase open alone. The scheduler
// here starts them longest first (each says how long it takes here),
// within alongsideSlots at once and one guest at a time; scripts/test.sh
// gives go test a -parallel above their count, so that go's own limit
// never decides the order.

// lane is a kind of test that runs alongside others.
type lane int

const (
	waits lane = iota // a kubelet lab, a soak: bounded by alongsideSlots
	guest             // QEMU under TCG: one at a time (it keeps both cores busy)
	alone             // after the others, with the machine to itself: a rate measured in a guest or against a band
	// noGuest is lane waits never beside a guest: traffic that must all
	// be answered while agents start in a kubelet lab (the migration
	// tests lost requests beside a guest and two kubelet labs starting:
	// 2 s timeouts while the agents loaded, CI-like run of 2026-12-01).
	noGuest
)

// alongsideSlots is how many tests of lanes waits and guest run at once.
const alongsideSlots = 4

// arrivalGrace bounds the wait for every registered test to reach the
// scheduler before the first start: they all arrive together when the
// serial tests end, unless go test's -parallel holds some back.
const arrivalGrace = 5 * time.Second

// alongside lets t run beside the other tests that call it, in a lane of
// its kind, once every test that does not has ended. expect is how long t
// takes on the 2-core VM (its order among the others, longest first).
// A test of lane alone runs when no other test of the package runs, and
// waits (at most 15 minutes) until no other package's test binary runs.
func alongside(t *testing.T, kind lane, expect time.Duration) {
	t.Helper()
	tk := sched.register(t.Name(), kind, expect)
	t.Parallel()
	sched.arrive(tk)
	t.Cleanup(func() { sched.release(tk) })
	if kind == alone {
		waitForOtherTests(t, 15*time.Minute)
	}
}

var sched = &scheduler{slots: alongsideSlots, warn: os.Stderr}

type ticket struct {
	name    string
	kind    lane
	expect  time.Duration
	arrived bool
	grant   chan struct{}
}

// scheduler starts the alongside tests longest first within its slots.
type scheduler struct {
	mu      sync.Mutex
	slots   int
	waiting []*ticket // registered, not started
	running []*ticket
	open    bool // every registered test arrived, or arrivalGrace passed
	timer   *time.Timer
	warn    io.Writer // where to say it started without some (nil: nowhere)
}

func (s *scheduler) register(name string, kind lane, expect time.Duration) *ticket {
	s.mu.Lock()
	defer s.mu.Unlock()
	tk := &ticket{name: name, kind: kind, expect: expect, grant: make(chan struct{})}
	s.waiting = append(s.waiting, tk)
	return tk
}

// arrive blocks until tk may start.
func (s *scheduler) arrive(tk *ticket) {
	s.mu.Lock()
	tk.arrived = true
	if s.timer == nil && !s.open {
		s.timer = time.AfterFunc(arrivalGrace, func() {
			s.mu.Lock()
			defer s.mu.Unlock()
			if !s.open && s.warn != nil {
				held := 0
				for _, tk := range s.waiting {
					if !tk.arrived {
						held++
					}
				}
				fmt.Fprintf(s.warn, "alongside: starting without %d tests go test holds back (its -parallel is below their count: the order is not longest first)\n", held)
			}
			s.open = true
			s.dispatch()
		})
	}
	s.dispatch()
	s.mu.Unlock()
	<-tk.grant
}

func (s *scheduler) release(tk *ticket) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, r := range s.running {
		if r == tk {
			s.running = append(s.running[:i], s.running[i+1:]...)
			break
		}
	}
	s.dispatch()
}

// dispatch starts what may start; s.mu is held.
func (s *scheduler) dispatch() {
	if !s.open {
		for _, tk := range s.waiting {
			if !tk.arrived {
				return
			}
		}
		s.open = true
	}
	for {
		tk := next(s.waiting, s.running, s.slots)
		if tk == nil {
			return
		}
		for i, w := range s.waiting {
			if w == tk {
				s.waiting = append(s.waiting[:i], s.waiting[i+1:]...)
				break
			}
		}
		s.running = append(s.running, tk)
		close(tk.grant)
	}
}

// next is the arrived ticket to start now, or nil: the longest of lanes
// waits, noGuest and guest while a slot is free (a guest only when no
// guest and no test of lane noGuest runs, one of noGuest when no guest
// does);
// one of lane alone only when nothing runs and nothing else waits to. The
// guests run one after another, so a guest counts as long as every guest
// still waiting: the chain they make is what the phase waits for.
func next(waiting, running []*ticket, slots int) *ticket {
	guests, noGuests := 0, 0
	for _, r := range running {
		switch r.kind {
		case alone:
			return nil
		case guest:
			guests++
		case noGuest:
			noGuests++
		}
	}
	var chain time.Duration
	for _, tk := range waiting {
		if tk.kind == guest {
			chain += tk.expect
		}
	}
	length := func(tk *ticket) time.Duration {
		if tk.kind == guest {
			return chain
		}
		return tk.expect
	}
	var best, lone *ticket
	for _, tk := range waiting {
		if !tk.arrived {
			continue
		}
		switch {
		case tk.kind == alone:
			if lone == nil || tk.expect > lone.expect {
				lone = tk
			}
		case tk.kind == guest && (guests > 0 || noGuests > 0):
		case tk.kind == noGuest && guests > 0:
		case best == nil || length(tk) > length(best) || length(tk) == length(best) && tk.expect > best.expect:
			best = tk
		}
	}
	switch {
	case best != nil:
		if len(running) >= slots {
			return nil
		}
		return best
	case len(running) == 0:
		return lone
	}
	return nil
}

// TestAlongsideSchedule: the scheduler's order on the suite's shape: the
// longest first within the slots, one guest at a time, lane alone last and
// by itself, nothing started before every registered test arrived.
func TestAlongsideSchedule(t *testing.T) {
	s := &scheduler{slots: 3}
	m := time.Minute
	tks := []*ticket{
		s.register("soak", waits, 2*m),
		s.register("guest-a", guest, 3*m),
		s.register("guest-b", guest, 4*m),
		s.register("helm", waits, 8*m),
		s.register("band", alone, 2*m),
		s.register("migration", waits, 4*m),
	}
	started := func() []string {
		var out []string
		for _, r := range s.running {
			out = append(out, r.name)
		}
		return out
	}
	s.mu.Lock()
	for _, tk := range tks[:5] {
		tk.arrived = true
		s.dispatch()
	}
	if got := started(); len(got) != 0 {
		t.Fatalf("started %v before every registered test arrived", got)
	}
	tks[5].arrived = true
	s.dispatch()
	want := []string{"helm", "guest-b", "migration"} // the longest three, one guest
	if got := started(); !slices.Equal(got, want) {
		t.Fatalf("first started %v, want %v", got, want)
	}
	s.mu.Unlock()
	s.release(tks[2]) // guest-b ends: the other guest may start
	s.mu.Lock()
	if got := started(); !slices.Equal(got, []string{"helm", "migration", "guest-a"}) {
		t.Fatalf("after guest-b: %v, want helm, migration, guest-a (the longest left)", got)
	}
	s.mu.Unlock()
	// End the tests one by one: lane alone starts only once the others
	// have all ended, and by itself.
	for len(s.running) > 0 && s.running[0].kind != alone {
		s.release(s.running[0])
		for _, r := range s.running {
			if r.kind == alone && (len(s.running) > 1 || len(s.waiting) > 0) {
				t.Fatalf("lane alone started beside %v, %d waiting", started(), len(s.waiting))
			}
		}
	}
	if got := started(); !slices.Equal(got, []string{"band"}) || len(s.waiting) != 0 {
		t.Fatalf("at the end %v running, %d waiting; want band alone", got, len(s.waiting))
	}
}

// TestAlongsideGuestChain: the guests, one at a time, count as long as
// their chain: two of 3 and 4 minutes start before a test of 5.
func TestAlongsideGuestChain(t *testing.T) {
	m := time.Minute
	waiting := []*ticket{{name: "kubelet", kind: waits, expect: 5 * m, arrived: true},
		{name: "guest-a", kind: guest, expect: 3 * m, arrived: true}, {name: "guest-b", kind: guest, expect: 4 * m, arrived: true}}
	if got := next(waiting, nil, 1); got == nil || got.name != "guest-b" {
		t.Fatalf("first of a 5-minute test and guests of 3 and 4 on one slot: %v, want guest-b (the chain of 7, its longest)", got)
	}
}

// TestAlongsideNoGuest: a test of lane noGuest waits for the guest that
// runs, and a guest for it, though slots are free.
func TestAlongsideNoGuest(t *testing.T) {
	m := time.Minute
	g := &ticket{name: "guest", kind: guest, expect: 3 * m, arrived: true}
	mig := &ticket{name: "migration", kind: noGuest, expect: 2 * m, arrived: true}
	soak := &ticket{name: "soak", kind: waits, expect: time.Minute, arrived: true}
	if got := next([]*ticket{mig, soak}, []*ticket{g}, 4); got != soak {
		t.Fatalf("beside a guest: %v, want soak (not the migration)", got)
	}
	if got := next([]*ticket{g, soak}, []*ticket{mig}, 4); got != soak {
		t.Fatalf("beside a migration: %v, want soak (not the guest)", got)
	}
	if got := next([]*ticket{mig}, []*ticket{soak}, 4); got != mig {
		t.Fatalf("no guest running: %v, want the migration", got)
	}
}

// TestAlongsideGrace: a test go test holds back (its -parallel below the
// count) does not keep the others from starting.
func TestAlongsideGrace(t *testing.T) {
	s := &scheduler{slots: 2}
	a := s.register("a", waits, time.Minute)
	s.register("held-back", waits, 2*time.Minute)
	done := make(chan struct{})
	go func() { s.arrive(a); close(done) }()
	select {
	case <-done:
	case <-time.After(arrivalGrace + 10*time.Second):
		t.Fatalf("a not started %s after it arrived", arrivalGrace+10*time.Second)
	}
}
