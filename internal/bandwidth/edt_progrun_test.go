package bandwidth

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/sluice-dataplane/sluice/internal/bpftest"
	"github.com/sluice-dataplane/sluice/internal/probe"
	"github.com/sluice-dataplane/sluice/internal/probe/probetest"
)

// BPF_PROG_RUN tests of tc_edt.c against the Go model (edt.go). Rates are
// low (1 and 2 Mbit/s: a full frame holds the wire for ~12 ms), so the
// microseconds between two runs never catch up with a packet's departure:
// each departure is exactly the one before plus the packet's delay.

// skBuff mirrors struct __sk_buff, the context of a tc BPF_PROG_RUN; only
// the fields BPF_PROG_RUN takes in may be set.
type skBuff struct {
	Len, PktType, Mark, QueueMapping, Protocol, VlanPresent, VlanTCI, VlanProto uint32
	Priority, IngressIfindex, Ifindex, TCIndex                                  uint32
	CB                                                                          [5]uint32
	Hash, TCClassid, Data, DataEnd, NapiID                                      uint32
	Family, RemoteIP4, LocalIP4                                                 uint32
	RemoteIP6, LocalIP6                                                         [4]uint32
	RemotePort, LocalPort, DataMeta                                             uint32
	FlowKeys                                                                    uint64
	Tstamp                                                                      uint64
	WireLen, GSOSegs                                                            uint32
	Sk                                                                          uint64
	GSOSize                                                                     uint32
	TstampType                                                                  uint8
	_                                                                           [3]byte
	Hwtstamp                                                                    uint64
}

func TestSkBuffSize(t *testing.T) {
	if n := binary.Size(skBuff{}); n != 192 {
		t.Fatalf("skBuff is %d bytes, struct __sk_buff 192", n)
	}
}

// tcObjects loads tc_edt.c in mode with private maps.
func tcObjects(t *testing.T, mode Mode) *tcedtObjects {
	t.Helper()
	probetest.SkipUnless(t, probe.BTF, probe.TC, probe.ProgRun)
	spec, err := loadTcedt()
	if err != nil {
		t.Fatal(err)
	}
	if err := spec.Variables["bw_mode"].Set(uint32(mode)); err != nil {
		t.Fatal(err)
	}
	for _, m := range spec.Maps {
		m.Pinning = ebpf.PinNone
	}
	var objs tcedtObjects
	if err := spec.LoadAndAssign(&objs, nil); err != nil {
		t.Fatalf("load tc_edt.c: %v", err)
	}
	t.Cleanup(func() { objs.Close() })
	return &objs
}

// setAggregate writes what the agent writes for aggregate id on veth
// ifindex: the veth, a limit and a zeroed clock per direction given.
func setAggregate(t *testing.T, objs *tcedtObjects, id uint32, ifindex int, egress, ingress Limit) {
	t.Helper()
	if err := objs.BwIfindex.Put(uint32(ifindex), id); err != nil {
		t.Fatal(err)
	}
	for dir, l := range map[uint32]Limit{dirEgress: egress, dirIngress: ingress} {
		if l.BytesPerSecond == 0 {
			continue
		}
		key := bwKey{ID: id, Dir: dir}
		if err := objs.BwLimits.Put(key, limitValue(l)); err != nil {
			t.Fatal(err)
		}
		if err := objs.BwState.Put(key, bwState{}); err != nil {
			t.Fatal(err)
		}
	}
}

func state(t *testing.T, objs *tcedtObjects, id, dir uint32) bwState {
	t.Helper()
	var st bwState
	if err := objs.BwState.Lookup(bwKey{ID: id, Dir: dir}, &st); err != nil {
		t.Fatal(err)
	}
	return st
}

// monotonic is bpf_ktime_get_ns's clock.
func monotonic(t *testing.T) uint64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		t.Fatal(err)
	}
	return uint64(ts.Nano())
}

// frame is a TCP frame of total length n bytes (IPv4 unless v6) with the
// ECN codepoint ecn (0 Not-ECT, 2 ECT(0), 3 CE).
func frame(t *testing.T, n int, v6 bool, ecn uint8) []byte {
	t.Helper()
	src, dst := netip.MustParseAddrPort("198.18.1.10:40000"), netip.MustParseAddrPort("198.18.0.12:5201")
	hdr := 14 + 20 + 20
	if v6 {
		src, dst = netip.MustParseAddrPort("[fd00:198:18:1::10]:40000"), netip.MustParseAddrPort("[fd00:198:18::12]:5201")
		hdr = 14 + 40 + 20
	}
	b := bpftest.Packet{Src: src, Dst: dst, Proto: bpftest.TCP, Flags: bpftest.ACK, Payload: make([]byte, n-hdr)}.MustBytes()
	if len(b) != n {
		t.Fatalf("frame of %d bytes, want %d", len(b), n)
	}
	setECN(b, ecn)
	return b
}

// setECN writes the ECN codepoint into an IPv4 or IPv6 frame (with a
// correct IPv4 header checksum), and ecnOf reads it.
func setECN(b []byte, ecn uint8) {
	if b[12] == 0x08 { // IPv4
		b[15] = b[15]&^3 | ecn
		b[24], b[25] = 0, 0
		var sum uint32
		for i := 14; i < 34; i += 2 {
			sum += uint32(b[i])<<8 | uint32(b[i+1])
		}
		for sum > 0xffff {
			sum = sum&0xffff + sum>>16
		}
		binary.BigEndian.PutUint16(b[24:], ^uint16(sum))
		return
	}
	b[15] = b[15]&^0x30 | ecn<<4
}

func ecnOf(b []byte) uint8 {
	if b[12] == 0x08 {
		return b[15] & 3
	}
	return b[15] >> 4 & 3
}

// run is one BPF_PROG_RUN of prog on b with context in; it returns the
// verdict, the frame and the context after the program.
func runTC(t *testing.T, prog *ebpf.Program, b []byte, in skBuff) (int32, []byte, skBuff) {
	t.Helper()
	var out skBuff
	opts := &ebpf.RunOptions{Data: b, DataOut: make([]byte, len(b)+256), Context: in, ContextOut: &out}
	ret, err := prog.Run(opts)
	if err != nil {
		t.Fatalf("run %s: %v", prog, err)
	}
	return int32(ret), opts.DataOut, out
}

const verdictNext, verdictDrop = -1, 2

// TestPrivilegedEDTStamp: on a device, each packet of a limited Pod gets a
// departure time; departures of one aggregate rise by exactly each
// packet's wire length over the rate (the GSO segments' headers counted),
// a departure beyond the horizon is dropped and counted without moving the
// clock, two aggregates keep their own clocks, and another Pod's packets
// pass untouched.
func TestPrivilegedEDTStamp(t *testing.T) {
	objs := tcObjects(t, ModeEDT)
	const podA, podB, other = 7, 8, 9 // host-side veths, as the packets' ingress_ifindex
	// Slow rates: a packet's departure is the Pod's last one plus a
	// second or so, far beyond the time a run takes on a loaded machine
	// (the model predicts from the time before the run; at 1 Mbit/s a
	// run that took 6 ms under -race left at once instead).
	limA := Limit{BytesPerSecond: Rate(10_000).BytesPerSecond(), Horizon: 6 * time.Second}
	limB := Limit{BytesPerSecond: Rate(20_000).BytesPerSecond(), Horizon: DefaultHorizon}
	setAggregate(t, objs, 1, podA, limA, Limit{})
	setAggregate(t, objs, 2, podB, limB, Limit{})

	// {veth, frame length, GSO segments}: A and B interleaved; A's
	// seventh would depart 6.53 s ahead, beyond its 6 s horizon, and a
	// small one after it still fits; a GSO packet of 3 segments counts two
	// more copies of its 54 bytes of headers.
	sends := []struct {
		veth, n, segs int
	}{
		{podA, 1514, 0}, {podB, 1514, 0}, {podA, 600, 0}, {podA, 1514, 0}, {podB, 100, 0}, {podA, 1514, 0},
		{podA, 1514, 0}, {podA, 1514, 0}, {podA, 1514, 0}, {podA, 64, 0}, {podB, 3000, 3}, {other, 1514, 0},
	}
	clocks := map[int]*Clock{}
	lims := map[int]Limit{podA: limA, podB: limB}
	passed := map[int]int{}
	dropped := map[int]int{}
	for i, s := range sends {
		before := monotonic(t)
		wire := uint32(s.n + max(s.segs-1, 0)*54)
		verdict, _, out := runTC(t, objs.TcEdtDevice, frame(t, s.n, false, 0),
			skBuff{IngressIfindex: uint32(s.veth), WireLen: wire, GSOSegs: uint32(s.segs)})
		desc := fmt.Sprintf("packet %d (%d bytes, %d on the wire, veth %d)", i, s.n, wire, s.veth)
		if s.veth == other {
			if verdict != verdictNext || out.Tstamp != 0 {
				t.Errorf("%s of an unlimited Pod: verdict %d tstamp %d, want it passed on untouched", desc, verdict, out.Tstamp)
			}
			continue
		}
		c := clocks[s.veth]
		if c == nil {
			// A Pod's first packet departs at once: the model's clock
			// starts from what the program saw as now.
			if verdict != verdictNext || out.Tstamp != 0 {
				t.Fatalf("%s, the Pod's first: verdict %d tstamp %d, want it to leave at once", desc, verdict, out.Tstamp)
			}
			c = &Clock{Last: state(t, objs, uint32(map[int]int{podA: 1, podB: 2}[s.veth]), dirEgress).TLast}
			if c.Last < before || c.Last > monotonic(t) {
				t.Fatalf("%s: clock %d outside the run's [%d, now]", desc, c.Last, before)
			}
			clocks[s.veth] = c
			passed[s.veth]++
			continue
		}
		want, ok := c.Stamp(lims[s.veth], Flows{}, 0, uint64(wire), before, 0)
		switch {
		case !ok && verdict != verdictDrop:
			t.Errorf("%s: verdict %d tstamp %d, want a drop beyond the %v horizon", desc, verdict, out.Tstamp, lims[s.veth].Horizon)
		case ok && (verdict != verdictNext || out.Tstamp != want):
			t.Errorf("%s: verdict %d departs %d, want %d (the Pod's last departure + %v)", desc, verdict, out.Tstamp, want,
				Delay(uint64(wire), lims[s.veth].BytesPerSecond))
		}
		if ok {
			passed[s.veth]++
		} else {
			dropped[s.veth]++
		}
	}
	if dropped[podA] != 1 || dropped[podB] != 0 {
		t.Fatalf("model dropped %v, the test expects one of A's packets", dropped)
	}
	for veth, id := range map[int]uint32{podA: 1, podB: 2} {
		st := state(t, objs, id, dirEgress)
		if st.Packets != uint64(passed[veth]) || st.Drops != uint64(dropped[veth]) || st.TLast != clocks[veth].Last {
			t.Errorf("aggregate %d: packets %d drops %d clock %d, want %d, %d, %d",
				id, st.Packets, st.Drops, st.TLast, passed[veth], dropped[veth], clocks[veth].Last)
		}
	}
}

// TestPrivilegedEDTStampSmall: behind its Pod's bulk transfer, a small
// packet of another flow is charged to the clock but departs at once while
// the clock is within four bursts ahead, four bursts before the clock when
// it is further; a small packet of the bulk flow itself keeps its flow's
// order (fq would send it before the flow's queued frames otherwise).
func TestPrivilegedEDTStampSmall(t *testing.T) {
	objs := tcObjects(t, ModeEDT)
	const pod = 7
	// 100 kbit/s: a full frame holds the wire 121 ms, a small packet
	// 10.4 ms; a burst of 50 ms lets small packets lead by 200 ms.
	lim := Limit{BytesPerSecond: Rate(100_000).BytesPerSecond(), Horizon: 6 * time.Second, Burst: 50 * time.Millisecond}
	setAggregate(t, objs, 1, pod, lim, Limit{})
	const bulkPort, reqPort = 40000, 40001
	packet := func(n int, port uint16) []byte {
		src, dst := netip.AddrPortFrom(netip.MustParseAddr("198.18.1.10"), port), netip.MustParseAddrPort("198.18.0.12:5201")
		return bpftest.Packet{Src: src, Dst: dst, Proto: bpftest.TCP, Flags: bpftest.ACK, Payload: make([]byte, n-54)}.MustBytes()
	}
	var c *Clock
	flows := Flows{}
	send := func(desc string, n int, port uint16) (stamp, before uint64) {
		t.Helper()
		before = monotonic(t)
		v, _, out := runTC(t, objs.TcEdtDevice, packet(n, port), skBuff{IngressIfindex: pod})
		if v != verdictNext {
			t.Fatalf("%s: verdict %d", desc, v)
		}
		if c == nil { // the first departs at once and starts the clock
			c = &Clock{Last: state(t, objs, 1, dirEgress).TLast}
			return out.Tstamp, before
		}
		want, _ := c.Stamp(lim, flows, uint32(port), uint64(n), before, 0)
		if want <= before {
			want = 0 // departs at once: not stamped
		}
		if out.Tstamp != want {
			t.Errorf("%s: departs %v ahead, want %v", desc, time.Duration(out.Tstamp-before), time.Duration(want-before))
		}
		return out.Tstamp, before
	}
	send("bulk frame 1", 1514, bulkPort)
	send("bulk frame 2, 121 ms behind", 1514, bulkPort)
	if stamp, _ := send("request, the clock 121 ms ahead", 130, reqPort); stamp != 0 {
		t.Errorf("request within four bursts of the clock stamped %d, want it sent at once", stamp)
	}
	send("bulk frame 3", 1514, bulkPort)
	last, _ := send("bulk frame 4, the clock 373 ms ahead", 1514, bulkPort)
	if stamp, before := send("request, the clock 373 ms ahead", 130, reqPort); stamp+uint64(200*time.Millisecond) != c.Last {
		t.Errorf("request departs %v ahead with the clock %v ahead, want 200 ms before it",
			time.Duration(stamp-before), time.Duration(c.Last-before))
	}
	if stamp, _ := send("small packet of the bulk flow", 130, bulkPort); stamp != last {
		t.Errorf("a small packet of the bulk flow departs at %d, want with the flow's last frame %d", stamp, last)
	}
	if st := state(t, objs, 1, dirEgress); st.TLast != c.Last || st.Packets != 7 {
		t.Errorf("clock %d packets %d, want %d and 7 (small packets charged as any)", st.TLast, st.Packets, c.Last)
	}
}

// checkMarks checks a frame a program passed: its ECN codepoint, its
// checksums, and the marks aggregate 1's egress counted so far.
func checkMarks(t *testing.T, objs *tcedtObjects, desc string, out []byte, wantECN uint8, marks uint64) {
	t.Helper()
	if got := ecnOf(out); got != wantECN {
		t.Errorf("%s: ECN %d, want %d", desc, got, wantECN)
	}
	if err := bpftest.CheckChecksums(out); err != nil {
		t.Errorf("%s: %v", desc, err)
	}
	if st := state(t, objs, 1, dirEgress); st.Marks != marks {
		t.Errorf("%s: %d marks counted, want %d", desc, st.Marks, marks)
	}
}

// TestPrivilegedEDTStampECN: on a device, a stamped ECN-capable packet is
// marked CE when the Pod's clock departs the ECN threshold after now or
// later (IPv4 with its checksum fixed, IPv6), a Not-ECT one never; a small
// packet sent ahead of the clock is marked as the clock says, since the
// mark tells the Pod's queue.
func TestPrivilegedEDTStampECN(t *testing.T) {
	for _, v6 := range []bool{false, true} {
		t.Run(map[bool]string{false: "IPv4", true: "IPv6"}[v6], func(t *testing.T) {
			objs := tcObjects(t, ModeEDT)
			const pod = 7
			// 100 kbit/s: 1514-byte frames depart 0, 121, 242, 363 ms
			// ahead; a burst of 50 ms lets small packets lead by 200 ms.
			lim := Limit{BytesPerSecond: Rate(100_000).BytesPerSecond(), Horizon: 6 * time.Second,
				Burst: 50 * time.Millisecond, ECN: 200 * time.Millisecond}
			setAggregate(t, objs, 1, pod, lim, Limit{})
			cases := []struct {
				n            int
				ecn, wantECN uint8
				desc         string
				countedMarks uint64
			}{
				{1514, 2, 2, "departs at once: unmarked", 0},
				{1514, 2, 2, "121 ms ahead, under the 200 ms threshold: unmarked", 0},
				{1514, 0, 0, "242 ms ahead but Not-ECT: unmarked", 0},
				{1514, 2, 3, "363 ms ahead, ECT(0): marked CE", 1},
				{130, 2, 3, "small, sent 200 ms before the clock 374 ms ahead: marked CE", 2},
			}
			for i, c := range cases {
				in := frame(t, c.n, v6, c.ecn)
				verdict, out, _ := runTC(t, objs.TcEdtDevice, in, skBuff{IngressIfindex: pod})
				if verdict != verdictNext {
					t.Fatalf("packet %d, %s: verdict %d", i, c.desc, verdict)
				}
				checkMarks(t, objs, fmt.Sprintf("packet %d, %s", i, c.desc), out[:len(in)], c.wantECN, c.countedMarks)
			}
		})
	}
}

// TestPrivilegedEDTPolice: without fq, a Pod's veth polices on the same
// clock: packets starting within the burst pass, those departing beyond
// the ECN threshold are marked CE when ECN-capable (IPv4 with its checksum
// fixed, IPv6), others are not touched, and one starting beyond the burst
// is dropped.
func TestPrivilegedEDTPolice(t *testing.T) {
	for _, v6 := range []bool{false, true} {
		t.Run(map[bool]string{false: "IPv4", true: "IPv6"}[v6], func(t *testing.T) {
			objs := tcObjects(t, ModePolice)
			lim := Limit{BytesPerSecond: Rate(100_000).BytesPerSecond(), Burst: 300 * time.Millisecond, ECN: 200 * time.Millisecond}
			setAggregate(t, objs, 1, 1, lim, Limit{}) // the Pod's veth: lo, which BPF_PROG_RUN resolves
			// 1514-byte frames hold a 100 kbit/s wire for 121 ms: they
			// depart 0, 121, 242, 363, 484 ms ahead, starting 121 ms
			// before that. (A slow rate, so that the time the test
			// itself takes, some ms on a loaded machine, moves no
			// packet across the burst or the threshold.)
			cases := []struct {
				ecn          uint8
				verdict      int32
				wantECN      uint8
				desc         string
				countedMarks uint64
			}{
				{2, verdictNext, 2, "departs at once: unmarked", 0},
				{2, verdictNext, 2, "121 ms ahead, under the 200 ms threshold: unmarked", 0},
				{0, verdictNext, 0, "242 ms ahead but Not-ECT: unmarked", 0},
				{2, verdictNext, 3, "363 ms ahead, ECT(0): marked CE", 1},
				{2, verdictDrop, 2, "starting 363 ms ahead, beyond the 300 ms burst: dropped", 1},
			}
			for i, c := range cases {
				in := frame(t, 1514, v6, c.ecn)
				verdict, out, _ := runTC(t, objs.TcEdtFromPod, in, skBuff{Ifindex: 1})
				if verdict != c.verdict {
					t.Fatalf("packet %d, %s: verdict %d, want %d", i, c.desc, verdict, c.verdict)
				}
				if verdict == verdictDrop {
					continue
				}
				checkMarks(t, objs, fmt.Sprintf("packet %d, %s", i, c.desc), out[:len(in)], c.wantECN, c.countedMarks)
			}
			if st := state(t, objs, 1, dirEgress); st.Packets != 4 || st.Drops != 1 || st.Bytes != 4*1514 {
				t.Errorf("counters: packets %d bytes %d drops %d, want 4, %d, 1", st.Packets, st.Bytes, st.Drops, 4*1514)
			}
		})
	}
}

// TestPrivilegedEDTPoliceBurstPerSocket: a Pod's egress burst under the
// policer is two full frames for each socket sock_edt counted sending in
// this window or the last, when that is longer than the limit's, up to
// BW_BURST_MAX (4) times it; counts from an older window are stale (from
// the next one are current: another CPU's clock read later). At
// 1 Mbit/s a 1,100-byte frame holds the wire 8.8 ms: back to back, frame
// k (from 2) starts (k-2) × 8.8 ms ahead, and those starting beyond the
// burst are dropped.
func TestPrivilegedEDTPoliceBurstPerSocket(t *testing.T) {
	const frameLen = 1100
	lim := Limit{BytesPerSecond: Rate(1_000_000).BytesPerSecond(), Burst: 30 * time.Millisecond}
	window := func() uint64 { return monotonic(t) >> 27 } // BW_WINDOW_SHIFT
	for _, c := range []struct {
		desc     string
		epoch    func() uint64
		cur      uint32
		passed   uint64 // of 20 frames
		burst    time.Duration
		burstDes string
	}{
		{"one socket", window, 1, 5, 30 * time.Millisecond, "30 ms"},                      // starts 0, 0, 8.8, 17.6, 26.4
		{"3 sockets", window, 3, 10, 72672 * time.Microsecond, "3 × 2 × 1514 B: 72.7 ms"}, // up to 70.4
		{"3 sockets in the last window", func() uint64 { return window() - 1 }, 3, 10, 72672 * time.Microsecond, "72.7 ms"},
		// Rolled by a socket on a CPU whose clock read later.
		{"3 sockets in the next window", func() uint64 { return window() + 1 }, 3, 10, 72672 * time.Microsecond, "72.7 ms"},
		{"8 sockets", window, 8, 15, 120 * time.Millisecond, "4 × 30 ms, the most"}, // up to 114.4
		{"8 sockets two windows ago: stale", func() uint64 { return window() - 2 }, 8, 5, 30 * time.Millisecond, "30 ms"},
	} {
		t.Run(c.desc, func(t *testing.T) {
			// The counts are set relative to the sockets' window (about
			// 134 ms): a run the window rolled over under means
			// another case, so it is run again (at most 3 times).
			for attempt := 1; ; attempt++ {
				objs := tcObjects(t, ModePolice)
				setAggregate(t, objs, 1, 1, lim, Limit{})
				w := window()
				if err := objs.BwState.Put(bwKey{ID: 1, Dir: dirEgress}, bwState{ActEpoch: c.epoch(), ActCur: c.cur}); err != nil {
					t.Fatal(err)
				}
				start := monotonic(t)
				for range 20 {
					runTC(t, objs.TcEdtFromPod, frame(t, frameLen, false, 0), skBuff{Ifindex: 1})
				}
				elapsed := monotonic(t) - start
				if window() != w && attempt < 3 {
					continue
				}
				// The clock moves on while the frames are sent: a
				// slow run (a loaded machine, -race) lets those through
				// that start within the burst and the time it took,
				// never fewer than those within the burst.
				frameTime := Delay(frameLen, lim.BytesPerSecond)
				within := func(b time.Duration) (n uint64) {
					for k := range 20 {
						if time.Duration(max(k-1, 0))*frameTime <= b {
							n++
						}
					}
					return n
				}
				if within(c.burst) != c.passed {
					t.Fatalf("the case's burst %v lets %d frames through, not %d", c.burst, within(c.burst), c.passed)
				}
				most := within(c.burst + time.Duration(elapsed))
				if st := state(t, objs, 1, dirEgress); st.Packets < c.passed || st.Packets > most || st.Packets+st.Drops != 20 {
					t.Errorf("%d sockets counted: %d of 20 back-to-back frames passed, %d dropped; want %d passed (burst %s; %d at most in the %v the run took)",
						c.cur, st.Packets, st.Drops, c.passed, c.burstDes, most, time.Duration(elapsed))
				}
				return
			}
		})
	}
}

// TestPrivilegedEDTIngressGSO: at the veth's ingress (the Pod's egress
// under the policer) the stack has not counted a GSO packet's segments:
// the program adds each extra segment's headers itself.
func TestPrivilegedEDTIngressGSO(t *testing.T) {
	objs := tcObjects(t, ModePolice)
	lim := Limit{BytesPerSecond: Rate(1_000_000).BytesPerSecond(), Burst: time.Second}
	setAggregate(t, objs, 1, 1, lim, Limit{})
	if v, _, _ := runTC(t, objs.TcEdtFromPod, frame(t, 100, false, 0), skBuff{Ifindex: 1}); v != verdictNext {
		t.Fatalf("first packet: verdict %d", v)
	}
	start := state(t, objs, 1, dirEgress).TLast
	// 3 segments of a 3054-byte GSO packet (14+20+20 of headers each;
	// BPF_PROG_RUN takes at most a page).
	if v, _, _ := runTC(t, objs.TcEdtFromPod, frame(t, 3054, false, 0), skBuff{Ifindex: 1, GSOSegs: 3, GSOSize: 1000}); v != verdictNext {
		t.Fatalf("GSO packet: verdict %d", v)
	}
	want := start + uint64(Delay(3054+2*54, lim.BytesPerSecond))
	if got := state(t, objs, 1, dirEgress).TLast; got != want {
		t.Errorf("a 3-segment GSO packet of 3054 bytes moved the clock by %v, want %v (3162 wire bytes)",
			time.Duration(got-start), time.Duration(want-start))
	}
}

// TestPrivilegedEDTToPod: towards a Pod, its ingress is stamped under EDT
// (fq on the veth waits) on the ingress clock, beyond the ingress horizon
// dropped, and counted without fq (TBF on the veth holds it, nothing is
// dropped here); under EDT, traffic from a limited Pod on the same node
// (which never reaches a device) is policed on that Pod's egress clock,
// the one the devices stamp with.
func TestPrivilegedEDTToPod(t *testing.T) {
	objs := tcObjects(t, ModeEDT)
	const sender = 7
	// 100 kbit/s: a 1514-byte frame holds the wire 121 ms, far longer
	// than the test itself takes on a loaded machine.
	egress := Limit{BytesPerSecond: Rate(100_000).BytesPerSecond(), Horizon: DefaultHorizon, Burst: 300 * time.Millisecond}
	lim := Limit{BytesPerSecond: Rate(100_000).BytesPerSecond(), Horizon: 300 * time.Millisecond, Burst: 300 * time.Millisecond}
	setAggregate(t, objs, 1, sender, egress, Limit{})
	setAggregate(t, objs, 2, 1, Limit{}, lim) // the receiving Pod behind lo

	// The sender's device traffic stamps its clock 363 ms ahead...
	for range 4 {
		if v, _, _ := runTC(t, objs.TcEdtDevice, frame(t, 1514, false, 0), skBuff{IngressIfindex: sender}); v != verdictNext {
			t.Fatalf("device: verdict %d", v)
		}
	}
	// ...so its next packet to a Pod on this node, starting 363 ms ahead,
	// is beyond the 300 ms burst of the hook that cannot wait...
	if v, _, _ := runTC(t, objs.TcEdtToPod, frame(t, 1514, false, 0), skBuff{Ifindex: 1, IngressIfindex: sender}); v != verdictDrop {
		t.Errorf("same-node packet of a Pod 363 ms into its rate: verdict %d, want a drop", v)
	}
	if st := state(t, objs, 1, dirEgress); st.Drops != 1 || st.Packets != 4 {
		t.Errorf("sender: packets %d drops %d, want 4 and 1", st.Packets, st.Drops)
	}
	// ...while another sender's packets meet only the receiver's ingress
	// clock: stamped 0, 121 and 242 ms ahead (1514 wire bytes at
	// 100 kbit/s), the fourth, 363 ms ahead, beyond the 300 ms horizon,
	// dropped.
	var verdicts []int32
	var stamps []uint64
	for range 4 {
		v, _, out := runTC(t, objs.TcEdtToPod, frame(t, 1514, false, 0), skBuff{Ifindex: 1, IngressIfindex: 3})
		verdicts = append(verdicts, v)
		if v == verdictNext {
			stamps = append(stamps, out.Tstamp)
		}
	}
	if want := []int32{verdictNext, verdictNext, verdictNext, verdictDrop}; fmt.Sprint(verdicts) != fmt.Sprint(want) {
		t.Errorf("to a Pod limited to 100 kbit/s with a 300 ms horizon: verdicts %v, want %v", verdicts, want)
	}
	if st := state(t, objs, 2, dirIngress); st.Drops != 1 || st.Packets != 3 {
		t.Errorf("receiver: packets %d drops %d, want 3 and 1", st.Packets, st.Drops)
	}
	// The first departs now (stamped now, or not at all); then each
	// one frame's time after the last.
	if frameTime := uint64(Delay(1514, lim.BytesPerSecond)); len(stamps) != 3 || stamps[2]-stamps[1] != frameTime {
		t.Errorf("stamps %v, want the last two %v apart", stamps, time.Duration(frameTime))
	}

	// Without fq: counted, never dropped or stamped here.
	police := tcObjects(t, ModePolice)
	setAggregate(t, police, 2, 1, Limit{}, lim)
	for i := range 5 {
		if v, _, out := runTC(t, police.TcEdtToPod, frame(t, 1514, false, 0), skBuff{Ifindex: 1, IngressIfindex: 3}); v != verdictNext || out.Tstamp != 0 {
			t.Errorf("police mode, packet %d to the Pod: verdict %d tstamp %d, want passed unstamped (TBF on the veth holds it)", i, v, out.Tstamp)
		}
	}
	if st := state(t, police, 2, dirIngress); st.Packets != 5 || st.Drops != 0 {
		t.Errorf("police mode receiver: packets %d drops %d, want 5 and 0", st.Packets, st.Drops)
	}
}
