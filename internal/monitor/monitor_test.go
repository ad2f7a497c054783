package monitor

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"

	"github.com/sluice-dataplane/sluice/internal/datapath"
)

// objects are the compiled BPF objects that write events.
func objects(t *testing.T) map[string]*ebpf.CollectionSpec {
	t.Helper()
	tc, xdp, err := datapath.LoadNorthSouthSpecs()
	if err != nil {
		t.Fatal(err)
	}
	sock, err := datapath.LoadSpec()
	if err != nil {
		t.Fatal(err)
	}
	return map[string]*ebpf.CollectionSpec{"tclb": tc, "xdplb": xdp, "socklb": sock}
}

// TestReasonsMatchBPF: the Go names of the drop reasons and event types
// stand for the C enumerators of the same value, in every object.
func TestReasonsMatchBPF(t *testing.T) {
	for name, spec := range objects(t) {
		var reasons *btf.Enum
		if err := spec.Types.TypeByName("sl_drop_reason", &reasons); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		var got []string
		for _, v := range reasons.Values {
			if v.Name == "SL_DROP_MAX" {
				if int(v.Value) != len(DropReasons) {
					t.Errorf("%s: SL_DROP_MAX = %d, Go knows %d reasons", name, v.Value, len(DropReasons))
				}
				continue
			}
			if int(v.Value) >= len(DropReasons) || DropReasons[v.Value].C != v.Name {
				got = append(got, fmt.Sprintf("%s=%d", v.Name, v.Value))
			}
		}
		if len(got) > 0 {
			t.Errorf("%s: C drop reasons without their Go name at that index: %s", name, strings.Join(got, ", "))
		}
		var types *btf.Enum
		if err := spec.Types.TypeByName("sl_event_type", &types); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		for _, v := range types.Values {
			want := "SL_EV_" + strings.ToUpper(strings.ReplaceAll(Types[v.Value-1], "-", "_"))
			if v.Value == 0 || int(v.Value) > len(Types) || v.Name != want {
				t.Errorf("%s: event type %s=%d, Go has %v", name, v.Name, v.Value, Types)
			}
		}
	}
}

// TestRawLayout: Decode reads each field where struct sl_event has it.
func TestRawLayout(t *testing.T) {
	offsets := map[string]int{
		"ts": 0, "type": 8, "reason": 9, "hook": 10, "mode": 11, "proto": 12, "tcp_flags": 13,
		"rev_nat_id": 14, "ifindex": 16, "backend_id": 20, "len": 24, "saddr": 28, "daddr": 44,
		"baddr": 60, "sport": 76, "dport": 78, "bport": 80, "pad": 82, "cgroup": 88, "netns": 96,
	}
	for name, spec := range objects(t) {
		var ev *btf.Struct
		if err := spec.Types.TypeByName("sl_event", &ev); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if ev.Size != RawSize {
			t.Errorf("%s: struct sl_event is %d bytes, Decode reads %d", name, ev.Size, RawSize)
		}
		for _, m := range ev.Members {
			want, ok := offsets[m.Name]
			if !ok {
				t.Errorf("%s: sl_event.%s: Decode does not read it", name, m.Name)
				continue
			}
			if got := int(m.Offset.Bytes()); got != want {
				t.Errorf("%s: sl_event.%s at byte %d, Decode reads it at %d", name, m.Name, got, want)
			}
		}
	}
}

func rawEvent(typ, reason, hook, mode uint8) []byte {
	b := make([]byte, RawSize)
	binary.LittleEndian.PutUint64(b[0:], uint64(2*time.Second))
	b[8], b[9], b[10], b[11], b[12], b[13] = typ, reason, hook, mode, 6, 0x02
	binary.LittleEndian.PutUint16(b[14:], 7)
	binary.LittleEndian.PutUint32(b[20:], 42)
	binary.LittleEndian.PutUint32(b[24:], 60)
	copy(b[28:], []byte{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 192, 0, 2, 1})
	copy(b[44:], []byte{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 96, 0, 10})
	copy(b[60:], []byte{0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 5})
	binary.BigEndian.PutUint16(b[76:], 40000)
	binary.BigEndian.PutUint16(b[78:], 80)
	binary.BigEndian.PutUint16(b[80:], 8080)
	return b
}

func TestDecode(t *testing.T) {
	boot := time.Date(2026, 11, 26, 0, 0, 0, 0, time.UTC)
	r, err := Decode(rawEvent(1, 3, 3, 0))
	if err != nil {
		t.Fatal(err)
	}
	e := FromRaw(r, boot)
	want := Event{
		Time: boot.Add(2 * time.Second), Type: TypeDrop, Reason: "src-range", Hook: "xdp", Proto: "TCP",
		Source: "192.0.2.1:40000", Frontend: "10.96.0.10:80", Backend: "[2001:db8::5]:8080",
		FrontendID: 7, BackendID: 42, Bytes: 60, TCPFlags: "SYN",
	}
	if e != want {
		t.Errorf("FromRaw = %+v\nwant %+v", e, want)
	}
	if s := e.String(); !strings.Contains(s, "DROP src-range [xdp] TCP 192.0.2.1:40000 -> 10.96.0.10:80") {
		t.Errorf("String() = %q", s)
	}
	if _, err := Decode(make([]byte, 10)); err == nil {
		t.Error("Decode of 10 bytes: no error")
	}
	if _, err := Decode(rawEvent(9, 0, 0, 0)); err == nil {
		t.Error("Decode of type 9: no error")
	}
}

func TestFilter(t *testing.T) {
	e := Event{Type: TypeDrop, Reason: "no-backend", Service: "default/web:http", Frontend: "10.96.0.10:80",
		Backend: "10.244.1.5:8080", Node: "node1", Time: time.Unix(100, 0)}
	for _, c := range []struct {
		f    Filter
		want bool
	}{
		{Filter{}, true},
		{Filter{Types: []string{TypeDrop}}, true},
		{Filter{Types: []string{TypeService}}, false},
		{Filter{Reasons: []string{"no-backend"}}, true},
		{Filter{Reasons: []string{"src-range"}}, false},
		{Filter{Service: "default/web"}, true},
		{Filter{Service: "default/web:http"}, true},
		{Filter{Service: "default/we"}, false},
		{Filter{Frontend: "10.96.0.10"}, true},
		{Filter{Frontend: "10.96.0.10:81"}, false},
		{Filter{Backend: "10.244.1.5:8080"}, true},
		{Filter{Node: "node2"}, false},
		{Filter{Since: time.Unix(101, 0)}, false},
		{Filter{Since: time.Unix(100, 0)}, true},
	} {
		if got := c.f.Match(e); got != c.want {
			t.Errorf("%+v.Match = %v, want %v", c.f, got, c.want)
		}
	}
	if err := (Filter{Types: []string{"drops"}}).Check(); !errors.Is(err, ErrBadFilter) || !strings.Contains(err.Error(), `"drops"`) {
		t.Errorf("Check of type drops: %v", err)
	}
	if err := (Filter{Reasons: []string{"nope"}}).Check(); err == nil || !strings.Contains(err.Error(), "src-range") {
		t.Errorf("Check of reason nope: %v, want the list of reasons", err)
	}
	if w := (Filter{Types: []string{TypeService, TypeDrop}}).Wants(); w != FlagService|FlagDrop {
		t.Errorf("Wants = %#x", w)
	}
}

func TestHub(t *testing.T) {
	var wants []uint32
	h := NewHub(3, func(w uint32) { wants = append(wants, w) })
	s := h.Subscribe(Filter{Types: []string{TypeDrop}})
	for i := range 5 {
		h.Publish(Event{Type: TypeDrop, Bytes: uint32(i)})
		h.Publish(Event{Type: TypeService, Bytes: uint32(i)})
	}
	for i := range 5 {
		e := <-s.C
		if e.Type != TypeDrop || e.Bytes != uint32(i) {
			t.Fatalf("event %d = %+v", i, e)
		}
	}
	hist := h.History(Filter{})
	if len(hist) != 3 || hist[0].Bytes != 3 || hist[2].Bytes != 4 {
		t.Errorf("History = %+v, want the last 3 events", hist)
	}
	h.Unsubscribe(s)
	if len(wants) != 2 || wants[0] != FlagDrop || wants[1] != 0 {
		t.Errorf("wants = %v, want [drop, none]", wants)
	}
	slow := h.Subscribe(Filter{})
	for range 1100 {
		h.Publish(Event{Type: TypeDrop})
	}
	if slow.Lost() != 1100-1024 {
		t.Errorf("Lost = %d, want %d", slow.Lost(), 1100-1024)
	}
}
