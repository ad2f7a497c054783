package vmtest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
)

// The guest's network cards (Config.NICs) are virtio-net devices, with
// Config.NICQueues queue pairs each, as a cloud VM's. Their QEMU backends
// are multi-queue taps on one bridge inside a network namespace made for
// the run, in which QEMU runs: the cards reach each other and nothing else.
// The host's own interfaces and namespaces are never touched; the namespace
// (and with it the taps and the bridge) goes when the run ends, and one
// left by a run that died goes at the next run's start.

// GuestEnv is set in the environment of a guest's command (to the guest's
// kernel release).
const GuestEnv = "SLUICE_VM_GUEST"

// nicNetnsPrefix names the runs' namespaces: the prefix, the PID of the
// process that made it, a counter.
const nicNetnsPrefix = "sluice-vmnet-"

// MaxNICs bounds Config.NICs, MaxNICQueues Config.NICQueues.
const (
	MaxNICs      = 8
	MaxNICQueues = 8
)

var nicNetnsSeq atomic.Int64

// nicNet is one run's namespace and its taps, one a card.
type nicNet struct {
	netns string
	taps  []string
}

// setupNICs makes the namespace, the bridge and n taps of queues queues.
func setupNICs(ctx context.Context, n, queues int) (*nicNet, error) {
	sweepNICNetns()
	nn := &nicNet{netns: fmt.Sprintf("%s%d-%d", nicNetnsPrefix, os.Getpid(), nicNetnsSeq.Add(1))}
	if out, err := exec.CommandContext(ctx, "ip", "netns", "add", nn.netns).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("guest NICs: ip netns add %s: %w: %s", nn.netns, err, strings.TrimSpace(string(out)))
	}
	cmds := []string{"link set lo up",
		// No STP and no multicast snooping: ports forward at once and
		// IPv6 neighbour discovery needs no querier.
		"link add br0 type bridge stp_state 0 mcast_snooping 0", "link set br0 up"}
	mq := ""
	if queues > 1 {
		mq = " multi_queue"
	}
	for i := range n {
		tap := "tap" + strconv.Itoa(i)
		nn.taps = append(nn.taps, tap)
		cmds = append(cmds, "tuntap add dev "+tap+" mode tap"+mq, "link set "+tap+" master br0 up")
	}
	cmd := exec.CommandContext(ctx, "ip", "-n", nn.netns, "-batch", "-")
	cmd.Stdin = strings.NewReader(strings.Join(cmds, "\n") + "\n")
	if out, err := cmd.CombinedOutput(); err != nil {
		nn.close()
		return nil, fmt.Errorf("guest NICs: taps in %s: %w: %s", nn.netns, err, strings.TrimSpace(string(out)))
	}
	return nn, nil
}

// close deletes the namespace: the taps and the bridge go with it.
func (nn *nicNet) close() {
	if nn != nil {
		_ = exec.Command("ip", "netns", "delete", nn.netns).Run()
	}
}

// wrap runs QEMU's command line inside the namespace (nsenter execs it:
// QEMU keeps the PID, the process group and the parent-death signal).
func (nn *nicNet) wrap(args []string) (string, []string) {
	if nn == nil {
		return QEMU, args
	}
	return "nsenter", append([]string{"--net=/run/netns/" + nn.netns, "--", QEMU}, args...)
}

// sweepNICNetns deletes the namespaces of runs whose process is gone.
func sweepNICNetns() {
	ents, err := os.ReadDir("/run/netns")
	if err != nil {
		return
	}
	for _, e := range ents {
		rest, ok := strings.CutPrefix(e.Name(), nicNetnsPrefix)
		if !ok {
			continue
		}
		pid, err := strconv.Atoi(strings.SplitN(rest, "-", 2)[0])
		if err != nil || pid == os.Getpid() {
			continue
		}
		if syscall.Kill(pid, 0) == syscall.ESRCH {
			_ = exec.Command("ip", "netns", "delete", e.Name()).Run()
		}
	}
}

// nicArgs are QEMU's devices for the taps: virtio-net-pci, in order (the
// guest names them eth0, eth1, ... by PCI slot), MACs 52:54:00:5e:00:NN,
// multi-queue with a vector per queue and two more when queues > 1.
func nicArgs(taps []string, queues int) []string {
	var args []string
	for i, tap := range taps {
		id := "nic" + strconv.Itoa(i)
		netdev := "tap,id=" + id + ",ifname=" + tap + ",script=no,downscript=no,vhost=off"
		dev := fmt.Sprintf("virtio-net-pci,netdev=%s,mac=52:54:00:5e:00:%02x", id, i+1)
		if queues > 1 {
			netdev += ",queues=" + strconv.Itoa(queues)
			dev += fmt.Sprintf(",mq=on,vectors=%d", 2*queues+2)
		}
		args = append(args, "-netdev", netdev, "-device", dev)
	}
	return args
}
