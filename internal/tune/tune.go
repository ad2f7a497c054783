// Package tune is `sluice tune`: the tuning list of the brief (section 6,
// after Cilium's performance-tuning guide) as checks that say, for each
// item, what it needs, what is here, and whether sluice can apply it; an
// apply that writes every value it changes to a state file before it
// changes it; and a revert that puts exactly those values back.
//
//	Check(scope) ─▶ []Item, each with the Changes that would tune it
//	Apply(scope, state file, ids) ─▶ state file written first, then the Changes
//	Revert(state file) ─▶ every Change's old value, last first
//
// A Change is one value: a sysctl (in a network namespace, or the
// machine's), a device attribute (BIG TCP sizes), an nftables table (the
// conntrack bypass), a file (CPU governor, IRQ affinity, preemption) or a
// service (irqbalance). Machine-wide ones need Scope.Host; the default
// scope is the network namespaces given (the lab's nodes). Agent settings
// (--lb-mode dsr, XDP, the bandwidth manager, BBR) are never changed here:
// apply prints the flags and the ConfigMap patch, so that nothing restarts
// silently.
package tune

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/sluice-dataplane/sluice/internal/api"
	"github.com/sluice-dataplane/sluice/internal/bandwidth"
)

// Profiles of the tuned-like sysctls (the tuning list's "tuned profiles
// network-latency / network-throughput").
const (
	ProfileLatency    = "latency"
	ProfileThroughput = "throughput"
)

// Scope is where tune looks and may change things.
type Scope struct {
	// Netns are named network namespaces (/run/netns/NAME) whose own
	// settings are checked and tuned; empty: the caller's.
	Netns []string
	// Host allows machine-wide changes (global sysctls, CPU governor,
	// IRQs, irqbalance, preemption, ring sizes).
	Host bool
	// Agents are the API sockets of the sluice agents whose settings are
	// read (the lab's nodes, or a node's agent).
	Agents []string
	// PodCIDRs are the native-routing CIDRs whose traffic may bypass
	// netfilter's conntrack.
	PodCIDRs []netip.Prefix
	// Profile is ProfileLatency (the default) or ProfileThroughput.
	Profile string
}

// Item is one entry of the tuning list as found here.
type Item struct {
	ID       string `json:"id"`
	Name     string `json:"name"`
	Requires string `json:"requires"`
	State    string `json:"state"`
	// Applied: set as the list asks.
	Applied bool `json:"applied"`
	// Possible: it can be had here (the kernel, the devices allow it).
	Possible bool `json:"possible"`
	// CanApply: `sluice tune apply` does it in this scope (Changes).
	CanApply bool `json:"canApply"`
	// Why it is not possible, or what apply needs that is not given.
	Why string `json:"why,omitempty"`
	// Action is what apply does, or what it prints for the operator.
	Action  string   `json:"action,omitempty"`
	Changes []Change `json:"changes,omitempty"`
	// Flags are the agent flags that turn it on (printed, never applied).
	Flags []string `json:"agentFlags,omitempty"`
}

// Change kinds.
const (
	KindSysctl  = "sysctl"
	KindLink    = "link"
	KindNFT     = "nft"
	KindFile    = "file"
	KindService = "service"
)

// Change is one value apply sets and revert puts back.
type Change struct {
	Item  string `json:"item"`
	Kind  string `json:"kind"`
	Netns string `json:"netns,omitempty"` // "" : the caller's (or the machine's, for machine-wide ones)
	// Target: the sysctl (dotted), "DEV gso_max_size", the nft table
	// ("inet sluice_tune"), a path, a systemd unit.
	Target string `json:"target"`
	Old    string `json:"old"`
	New    string `json:"new"`
}

func (c Change) String() string {
	where := ""
	if c.Netns != "" {
		where = " in netns " + c.Netns
	}
	old, nw := c.Old, c.New
	if c.Kind == KindNFT {
		old, nw = presence(c.Old), presence(c.New)
	}
	return fmt.Sprintf("%s %s%s: %s -> %s", c.Kind, c.Target, where, old, nw)
}

func presence(s string) string {
	if s == "" {
		return "absent"
	}
	return "present"
}

// State is the state file: every Change apply made, in order.
type State struct {
	Written time.Time `json:"written"`
	Changes []Change  `json:"changes"`
}

// env is what the checks read, gathered once.
type env struct {
	scope    Scope
	release  string
	major    int
	minor    int
	agents   []*api.Status
	agentErr error
}

func (e *env) kernelAtLeast(major, minor int) bool {
	return e.major > major || e.major == major && e.minor >= minor
}

// agent is the first agent's status, or nil.
func (e *env) agent() *api.Status {
	if len(e.agents) == 0 {
		return nil
	}
	return e.agents[0]
}

// netnsList is the scope's namespaces, "" for the caller's.
func (e *env) netnsList() []string {
	if len(e.scope.Netns) == 0 {
		return []string{""}
	}
	return e.scope.Netns
}

// Check reads everything and returns the list, in the brief's order, each
// item with the Changes that would tune it in scope.
func Check(ctx context.Context, scope Scope) ([]Item, error) {
	if scope.Profile == "" {
		scope.Profile = ProfileLatency
	}
	if scope.Profile != ProfileLatency && scope.Profile != ProfileThroughput {
		return nil, fmt.Errorf("--profile %q: want %s or %s", scope.Profile, ProfileLatency, ProfileThroughput)
	}
	for _, n := range scope.Netns {
		if _, err := os.Stat(filepath.Join("/run/netns", n)); err != nil {
			return nil, fmt.Errorf("network namespace %s: %w", n, err)
		}
	}
	e := &env{scope: scope}
	var err error
	if e.release, e.major, e.minor, err = kernel(); err != nil {
		return nil, err
	}
	for _, sock := range scope.Agents {
		c, cancel := context.WithTimeout(ctx, 5*time.Second)
		st, err := api.NewClient(sock).Status(c)
		cancel()
		if err != nil {
			e.agentErr = errors.Join(e.agentErr, fmt.Errorf("agent at %s: %w", sock, err))
			continue
		}
		e.agents = append(e.agents, st)
	}
	// The caller's own namespace, when it is the machine's, is machine
	// scope: nothing changes there without --host.
	own := len(scope.Netns) == 0 && !scope.Host
	if own {
		if init, err := bandwidth.InInitNetns(); err == nil && !init {
			own = false
		}
	}
	var items []Item
	for _, c := range checks {
		it := c(e)
		if own && len(it.Changes) > 0 {
			it.Changes, it.Action = nil, ""
			it.Why = strings.TrimPrefix(it.Why+"; this is the machine's own network namespace: needs --host (or --netns)", "; ")
		}
		it.CanApply = len(it.Changes) > 0
		items = append(items, it)
	}
	return items, nil
}

// Pending are the items apply would change (CanApply), or of ids those
// (every id must name an item).
func Pending(items []Item, ids []string) ([]Item, error) {
	var out []Item
	for _, id := range ids {
		if !slices.ContainsFunc(items, func(it Item) bool { return it.ID == id }) {
			var known []string
			for _, it := range items {
				known = append(known, it.ID)
			}
			return nil, fmt.Errorf("no tuning item %q: want one of %s", id, strings.Join(known, ", "))
		}
	}
	for _, it := range items {
		if len(ids) > 0 && !slices.Contains(ids, it.ID) {
			continue
		}
		if it.CanApply || len(it.Flags) > 0 && !it.Applied {
			out = append(out, it)
		}
	}
	return out, nil
}

// Apply writes the Changes of items to the state file, merged with what an
// earlier apply left there (the first old value of each target is kept),
// and then makes them. It returns the Changes made; on an error the state
// file still holds all of them, and Revert puts back those that were made.
func Apply(items []Item, stateFile string) ([]Change, error) {
	var changes []Change
	for _, it := range items {
		changes = append(changes, it.Changes...)
	}
	if len(changes) == 0 {
		return nil, nil
	}
	st, err := ReadState(stateFile)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	for _, c := range changes {
		if !slices.ContainsFunc(st.Changes, func(o Change) bool { return sameTarget(o, c) }) {
			st.Changes = append(st.Changes, c)
		}
	}
	st.Written = time.Now().UTC()
	if err := writeState(stateFile, st); err != nil {
		return nil, err
	}
	var done []Change
	for _, c := range changes {
		if err := set(c, c.New); err != nil {
			return done, fmt.Errorf("apply %s: %w (the state file %s has the old values: sluice tune revert)", c, err, stateFile)
		}
		done = append(done, c)
	}
	return done, nil
}

func sameTarget(a, b Change) bool {
	return a.Kind == b.Kind && a.Netns == b.Netns && a.Target == b.Target
}

// Revert puts back every old value of the state file, last change first,
// and removes the file. A value already back is left alone.
func Revert(stateFile string) ([]Change, error) {
	st, err := ReadState(stateFile)
	if err != nil {
		return nil, err
	}
	var done []Change
	var errs []error
	for i := len(st.Changes) - 1; i >= 0; i-- {
		c := st.Changes[i]
		if err := set(c, c.Old); err != nil {
			errs = append(errs, fmt.Errorf("revert %s: %w", c, err))
			continue
		}
		done = append(done, c)
	}
	if len(errs) > 0 {
		return done, errors.Join(errs...)
	}
	if err := os.Remove(stateFile); err != nil {
		return done, err
	}
	return done, nil
}

// ReadState reads a state file.
func ReadState(path string) (State, error) {
	var st State
	raw, err := os.ReadFile(path)
	if err != nil {
		return st, err
	}
	if err := json.Unmarshal(raw, &st); err != nil {
		return st, fmt.Errorf("state file %s: %w", path, err)
	}
	return st, nil
}

func writeState(path string, st State) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	raw, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, append(raw, '\n'), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// AllApplied reports whether every item that could be applied here is.
func AllApplied(items []Item) bool {
	for _, it := range items {
		if it.Possible && !it.Applied && (it.CanApply || len(it.Flags) > 0) {
			return false
		}
	}
	return true
}
