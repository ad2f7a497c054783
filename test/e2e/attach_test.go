package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// sockHooks are the socket-LB hooks every agent attaches.
var sockHooks = []string{"connect4", "connect6", "sendmsg4", "sendmsg6", "recvmsg4", "recvmsg6",
	"getpeername4", "getpeername6", "bind4", "bind6", "egress"}

// bpftoolJSON runs `bpftool -j ARGS` and decodes its output (none is []).
func bpftoolJSON(t *testing.T, into any, args ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "bpftool", append([]string{"-j"}, args...)...).Output()
	if err != nil {
		t.Fatalf("bpftool %v: %v", args, err)
	}
	if len(strings.TrimSpace(string(out))) == 0 {
		out = []byte("[]")
	}
	if err := json.Unmarshal(out, into); err != nil {
		t.Fatalf("bpftool %v: %v in %.200q", args, err, out)
	}
}

// bpfLink is what the test reads of `bpftool link show -j`. Not the type:
// bpftool 7.1 prints link types it does not know (tcx) as numbers.
type bpfLink struct {
	ID     uint32 `json:"id"`
	ProgID uint32 `json:"prog_id"`
}

type cgroupProg struct {
	ID         uint32 `json:"id"`
	AttachType string `json:"attach_type"`
	Name       string `json:"name"`
}

// TestPrivilegedAttachOnlyToNodeCgroup checks where the agents attach
// (`sluice status -o json` and the kernel's view through bpftool), and that
// after lab down none of their links or programs remain.
func TestPrivilegedAttachOnlyToNodeCgroup(t *testing.T) {
	requirePrivileged(t, "bpftool")
	l := ownLab(t, 2, 1)
	cgroup2 := filepath.Dir(l.CgroupRoot) // the hierarchy's root, never to be touched

	links := map[uint32]string{} // link ID → node/hook
	progs := map[uint32]string{} // program ID → node/program
	var progNames []string
	for _, n := range l.Nodes {
		st := agentStatus(t, l, n)
		if !st.SocketLB.Enabled || st.SocketLB.Cgroup != n.Cgroup {
			t.Errorf("%s: socket LB enabled %v on %q, want enabled on the node's cgroup %s", n.Name, st.SocketLB.Enabled, st.SocketLB.Cgroup, n.Cgroup)
		}
		var hooks []string
		for _, ap := range st.SocketLB.AttachPoints {
			hooks = append(hooks, ap.Hook)
			links[ap.LinkID] = n.Name + "/" + ap.Hook
			if ap.Cgroup != n.Cgroup {
				t.Errorf("%s: %s (%s) attached to %s, want only %s", n.Name, ap.Hook, ap.Program, ap.Cgroup, n.Cgroup)
			}
			if !slices.Contains(progNames, ap.Program) {
				progNames = append(progNames, ap.Program)
			}
		}
		slices.Sort(hooks)
		if want := slices.Sorted(slices.Values(sockHooks)); !slices.Equal(hooks, want) {
			t.Errorf("%s: attach points %v, want %v", n.Name, hooks, want)
		}

		// The kernel agrees: the node's cgroup holds exactly the programs.
		var attached []cgroupProg
		bpftoolJSON(t, &attached, "cgroup", "show", n.Cgroup)
		if len(attached) != len(sockHooks) {
			t.Errorf("%s: bpftool cgroup show %s: %d programs %v, want %d", n.Name, n.Cgroup, len(attached), attached, len(sockHooks))
		}
		for _, p := range attached {
			progs[p.ID] = n.Name + "/" + p.Name
		}
	}

	var atRoot []cgroupProg
	bpftoolJSON(t, &atRoot, "cgroup", "show", cgroup2)
	for _, p := range atRoot {
		if _, ours := progs[p.ID]; ours || slices.Contains(progNames, p.Name) {
			t.Errorf("root cgroup %s has program %d %s (%s) attached", cgroup2, p.ID, p.Name, p.AttachType)
		}
	}
	// Pods are in the node's sub-tree: the node's programs are effective
	// there without being attached.
	pod := l.Nodes[0].Pods[0]
	var podAttached []cgroupProg
	bpftoolJSON(t, &podAttached, "cgroup", "show", pod.Cgroup)
	if len(podAttached) != 0 {
		t.Errorf("%s's cgroup %s has its own programs %v, want none (inherited from the node)", pod.Name, pod.Cgroup, podAttached)
	}
	if len(links) != len(sockHooks)*len(l.Nodes) || len(progs) != len(sockHooks)*len(l.Nodes) {
		t.Fatalf("links %v and programs %v: want %d each", links, progs, len(sockHooks)*len(l.Nodes))
	}

	if err := l.Down(); err != nil {
		t.Fatalf("lab down: %v", err)
	}
	// By ID rather than by name: other sluice tests may load programs of the
	// same names meanwhile.
	var allLinks []bpfLink
	bpftoolJSON(t, &allLinks, "link", "show")
	for _, k := range allLinks {
		if what, ok := links[k.ID]; ok {
			t.Errorf("after lab down: link %d (%s) remains", k.ID, what)
		}
		if what, ok := progs[k.ProgID]; ok {
			t.Errorf("after lab down: link %d holds program %d (%s)", k.ID, k.ProgID, what)
		}
	}
	var allProgs []struct {
		ID   uint32 `json:"id"`
		Name string `json:"name"`
	}
	bpftoolJSON(t, &allProgs, "prog", "show")
	for _, p := range allProgs {
		if what, ok := progs[p.ID]; ok {
			t.Errorf("after lab down: program %d (%s) remains loaded", p.ID, what)
		}
	}
	if _, err := os.Stat(l.BPFRoot); !os.IsNotExist(err) {
		t.Errorf("after lab down: pin directory %s: %v, want it gone", l.BPFRoot, err)
	}
	if t.Failed() {
		fmt.Fprintln(t.Output(), "agents' link and program IDs:", links, progs)
	}
}
