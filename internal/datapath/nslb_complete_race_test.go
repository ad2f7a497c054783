package datapath

import (
	"fmt"
	"net/netip"
	"runtime"
	"sync/atomic"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/sluice-dataplane/sluice/internal/bpftest"
	"github.com/sluice-dataplane/sluice/internal/lbmap"
)

// A client's handshake ACK and its first data leave it at once from two
// CPUs (the kernel sends the ACK on the CPU the SYN-ACK reached, the
// application its request from its own), so two packets of one half-open
// flow complete it at the same time. Each must leave on the nat port the
// SYN got. Before, both completed the flow, each moving what the other
// read, and one of them started the flow anew on another nat port: the
// backend reset it (bench conns on tc, 15 of 80,000 connections at 2,000 a
// second). Here the two run through BPF_PROG_RUN on two CPUs at once,
// flow after flow.
func TestPrivilegedNorthSouthConcurrentCompletion(t *testing.T) {
	if runtime.NumCPU() < 2 {
		t.Skip("kernel feature missing: a second CPU (two packets processed at once)")
	}
	const flows = 400
	forEachIngress(t, func(t *testing.T, kind attachKind, n *NorthSouth, prog *ebpf.Program) {
		cpus := twoCPUs(t)
		defer pin(t, cpus[0])()
		ns, err := netns.Get()
		must(t, err)
		defer ns.Close()
		// The second CPU's runner: in this namespace, on its own CPU.
		type job struct {
			pkt   []byte
			start *atomic.Int32
			out   chan<- runOut
		}
		jobs := make(chan job)
		defer close(jobs)
		ready := make(chan error, 1)
		go func() {
			runtime.LockOSThread() // dies with the goroutine: its namespace is the test's
			if err := netns.Set(ns); err != nil {
				ready <- err
				return
			}
			var set unix.CPUSet
			set.Set(cpus[1])
			ready <- unix.SchedSetaffinity(0, &set)
			for j := range jobs {
				j.start.Add(1)
				for j.start.Load() < 2 {
				}
				res, err := bpftest.Run(prog, j.pkt)
				j.out <- runOut{res, err}
			}
		}()
		must(t, <-ready)

		run := runner(t, prog)
		wrong := 0
		for i := range flows {
			f := masqueradedFlow{client(uint16(20000 + i)), apLBTCP, apRemote, bpftest.TCP}
			run(bpftest.Packet{Src: f.c, Dst: f.fe, Proto: bpftest.TCP, Flags: bpftest.SYN})
			port := natPort(t, n, f.c, f.be, f.proto)
			run(bpftest.Packet{Src: f.be, Dst: netip.AddrPortFrom(ipNode, port), Proto: bpftest.TCP,
				Flags: bpftest.SYN | bpftest.ACK})
			ack := bpftest.Packet{Src: f.c, Dst: f.fe, Proto: bpftest.TCP, Flags: bpftest.ACK}
			data := bpftest.Packet{Src: f.c, Dst: f.fe, Proto: bpftest.TCP, Flags: bpftest.ACK | bpftest.PSH,
				Payload: []byte("GET")}
			var start atomic.Int32
			other := make(chan runOut, 1)
			jobs <- job{data.MustBytes(), &start, other}
			start.Add(1)
			for start.Load() < 2 {
			}
			ackRes, err := bpftest.Run(prog, ack.MustBytes())
			must(t, err)
			dataOut := <-other
			must(t, dataOut.err)
			for _, r := range []struct {
				what string
				res  bpftest.Result
			}{{"ACK", ackRes}, {"data", dataOut.res}} {
				if kind.verdicts[r.res.Verdict] == vDrop {
					wrong++
					t.Errorf("flow %d: the %s dropped", i, r.what)
					continue
				}
				if got := leftPort(r.res); got != fmt.Sprint(port) {
					wrong++
					t.Errorf("flow %d: the %s left on nat port %s, the SYN on %d", i, r.what, got, port)
				}
			}
			// The flow goes on on its port after both.
			if got := leftPort(run(data)); got != fmt.Sprint(port) {
				wrong++
				t.Errorf("flow %d: data after the handshake left on nat port %s, the SYN on %d", i, got, port)
			}
			if wrong > 10 {
				t.Fatalf("stopping after %d flows", i+1)
			}
		}
	})
}

// While one CPU completes a half-open flow (its ingress entry's
// completing set), a packet of that flow on another CPU goes on to the
// backend translated as the flow's packets are, on its nat port, and
// leaves the completion to that CPU: the flow stays half-open until the
// completing CPU is done (here, never: the next packet finds the mark
// still set and goes on the same way).
func TestPrivilegedNorthSouthCompletionTakenElsewhere(t *testing.T) {
	forEachIngress(t, func(t *testing.T, kind attachKind, n *NorthSouth, prog *ebpf.Program) {
		run := runner(t, prog)
		f := masqueradedFlow{client(46800), apLBTCP, apRemote, bpftest.TCP}
		run(bpftest.Packet{Src: f.c, Dst: f.fe, Proto: bpftest.TCP, Flags: bpftest.SYN})
		port := natPort(t, n, f.c, f.be, f.proto)
		run(bpftest.Packet{Src: f.be, Dst: netip.AddrPortFrom(ipNode, port), Proto: bpftest.TCP,
			Flags: bpftest.SYN | bpftest.ACK})
		svc, in, _, _ := f.keys(port)
		var slot lbmap.CTHalfSlot
		must(t, n.tc.CtHalf.Lookup(n.half.CTIndex(in), &slot))
		if slot.Key != in {
			t.Fatalf("the half-open flow's ingress entry is not in its slot of ct_half: %+v", slot.Key)
		}
		if slot.Entry.Completing != 0 {
			t.Fatalf("the half-open flow's ingress entry is marked completing before its ACK")
		}
		slot.Entry.Completing = 1 // another CPU's, mid-way
		must(t, n.tc.CtHalf.Update(n.half.CTIndex(in), &slot, ebpf.UpdateExist))
		var e lbmap.CTEntry
		for _, p := range []bpftest.Packet{
			{Src: f.c, Dst: f.fe, Proto: bpftest.TCP, Flags: bpftest.ACK},
			{Src: f.c, Dst: f.fe, Proto: bpftest.TCP, Flags: bpftest.ACK | bpftest.PSH, Payload: []byte("GET")},
		} {
			res := run(p)
			if kind.verdicts[res.Verdict] == vDrop {
				t.Fatalf("%s: dropped", bpftest.Describe(p.MustBytes()))
			}
			if got := leftPort(res); got != fmt.Sprint(port) {
				t.Errorf("%s left on nat port %s, the SYN on %d", bpftest.Describe(p.MustBytes()), got, port)
			}
		}
		// Neither completed the flow: no service entry, the ingress
		// entry still half-open in its slot.
		if err := n.tc.CtNew.Lookup(&svc, &e); err == nil {
			t.Errorf("a service entry was made in ct_new: %+v", e)
		}
		if err := n.tc.Ct.Lookup(&svc, &e); err == nil {
			t.Errorf("the flow was completed by a packet while another CPU completes it: %+v", e)
		}
		if e, ok, err := n.half.LookupCT(in); err != nil || !ok || e.Completing == 0 {
			t.Errorf("the half-open ingress entry: %v, found %v, completing %d; want it in ct_half, still marked", err, ok, e.Completing)
		}
	})
}

// runner runs a packet through prog (BPF_PROG_RUN), failing t on an error.
func runner(t *testing.T, prog *ebpf.Program) func(bpftest.Packet) bpftest.Result {
	return func(p bpftest.Packet) bpftest.Result {
		t.Helper()
		res, err := bpftest.Run(prog, p.MustBytes())
		must(t, err)
		return res
	}
}

type runOut struct {
	res bpftest.Result
	err error
}

// leftPort is the TCP source port of res's frame, or why there is none.
func leftPort(res bpftest.Result) string {
	pk := gopacket.NewPacket(res.Frame, layers.LayerTypeEthernet, gopacket.Default)
	tcp, _ := pk.Layer(layers.LayerTypeTCP).(*layers.TCP)
	if tcp == nil {
		return "(no TCP packet out)"
	}
	return fmt.Sprint(uint16(tcp.SrcPort))
}

// twoCPUs is two CPUs this thread may run on.
func twoCPUs(t *testing.T) [2]int {
	t.Helper()
	var set unix.CPUSet
	must(t, unix.SchedGetaffinity(0, &set))
	var out []int
	for cpu := 0; cpu < 1024 && len(out) < 2; cpu++ {
		if set.IsSet(cpu) {
			out = append(out, cpu)
		}
	}
	if len(out) < 2 {
		t.Skip("kernel feature missing: a second CPU this test may run on (two packets processed at once)")
	}
	return [2]int{out[0], out[1]}
}

// pin keeps the calling thread (locked by bpftest.InNewNetNS) on cpu until
// the returned func puts it back.
func pin(t *testing.T, cpu int) func() {
	t.Helper()
	var old, one unix.CPUSet
	must(t, unix.SchedGetaffinity(0, &old))
	one.Set(cpu)
	must(t, unix.SchedSetaffinity(0, &one))
	return func() { must(t, unix.SchedSetaffinity(0, &old)) }
}
