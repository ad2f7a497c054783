package monitor

import (
	"sync"
)

// Hub fans events out to subscribers and keeps the last ones for --since.
// A subscriber that reads too slowly loses events (counted), never blocks
// the reader of the ring.
type Hub struct {
	mu      sync.Mutex
	history []Event // a ring of the last len(history) events
	next    int
	full    bool
	subs    map[*Subscription]struct{}
	// onWants, when set, gets the union of the subscribers' wanted
	// flags each time it changes.
	onWants func(uint32)
	wants   uint32
}

// Subscription is one reader's.
type Subscription struct {
	C      <-chan Event
	c      chan Event
	filter Filter
	mu     sync.Mutex
	lost   uint64
}

// Lost is how many events this subscriber missed by reading too slowly.
func (s *Subscription) Lost() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lost
}

// NewHub keeps the last history events; onWants (may be nil) is told
// which datapath events the subscribers need.
func NewHub(history int, onWants func(uint32)) *Hub {
	return &Hub{history: make([]Event, max(history, 1)), subs: map[*Subscription]struct{}{}, onWants: onWants}
}

// Publish records e and hands it to every subscriber whose filter it
// passes.
func (h *Hub) Publish(e Event) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.history[h.next] = e
	h.next++
	if h.next == len(h.history) {
		h.next, h.full = 0, true
	}
	for s := range h.subs {
		if !s.filter.Match(e) {
			continue
		}
		select {
		case s.c <- e:
		default:
			s.mu.Lock()
			s.lost++
			s.mu.Unlock()
		}
	}
}

// History returns the recorded events that pass f, oldest first.
func (h *Hub) History(f Filter) []Event {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []Event
	add := func(es []Event) {
		for _, e := range es {
			if f.Match(e) {
				out = append(out, e)
			}
		}
	}
	if h.full {
		add(h.history[h.next:])
	}
	add(h.history[:h.next])
	return out
}

// Subscribe starts a subscription to the events that pass f from now on.
func (h *Hub) Subscribe(f Filter) *Subscription {
	c := make(chan Event, 1024)
	s := &Subscription{C: c, c: c, filter: f}
	h.mu.Lock()
	h.subs[s] = struct{}{}
	h.updateWants()
	h.mu.Unlock()
	return s
}

// Unsubscribe ends s.
func (h *Hub) Unsubscribe(s *Subscription) {
	h.mu.Lock()
	delete(h.subs, s)
	h.updateWants()
	h.mu.Unlock()
}

// Subscribers is the number of subscriptions.
func (h *Hub) Subscribers() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.subs)
}

func (h *Hub) updateWants() {
	var w uint32
	for s := range h.subs {
		w |= s.filter.Wants()
	}
	if w != h.wants {
		h.wants = w
		if h.onWants != nil {
			h.onWants(w)
		}
	}
}
