// Package verifierbudget reads what the kernel's verifier spent on a loaded
// BPF program and holds it against the limits of the oldest kernel sluice
// supports: the stack of the deepest BPF-to-BPF call chain, by Linux 6.1's
// rule, and the instructions processed.
//
//	program spec ──▶ subprograms in load order, who calls whom (calls and
//	                 callback references, as the verifier walks them)
//	verifier log ──▶ "stack depth 328+8+24" (one figure per subprogram)
//	                 "processed 219868 insns"
//	          both ──▶ Report: each chain's stack, 6.1-rounded, the deepest
//	                 one, and the instructions, against Budget
//
// Why 6.1's rule: check_max_stack_depth adds up the frames of a call chain
// and refuses more than 512 bytes. Before 6.9 it rounds every frame up to
// 32 bytes, an empty one too (the interpreter's granularity); from 6.9 a
// JITed program's frames round to 16 and an empty one costs nothing. So a
// program that 6.18 accepts can be refused by 6.1 (Debian 12): 464 + 40
// bytes load on 6.18 and are 480 + 64 = 544 on 6.1.
package verifierbudget

import (
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"github.com/cilium/ebpf"
)

// The verifier's limits (MAX_BPF_STACK, BPF_COMPLEXITY_LIMIT_INSNS).
const (
	MaxStack = 512
	MaxInsns = 1_000_000
)

// Budget is what a program may use and still leave headroom for the next
// change: a frame that grows by one 8-byte spill slot can cost 32 bytes
// under 6.1's rounding, on each frame of a chain, so two such steps stay
// free; and 30% of the instructions, as older verifiers prune less.
type Budget struct {
	Stack int // combined stack of the deepest chain, 6.1-rounded
	Insns int // instructions processed
}

// DefaultBudget is the budget sluice's programs are held to.
var DefaultBudget = Budget{Stack: MaxStack - 64, Insns: MaxInsns * 7 / 10}

// ServicePathBudget holds the programs every north-south packet enters
// (tc_lb_ingress, xdp_lb_ingress) to a third of the verifier's limit and
// two 32-byte frames less than DefaultBudget, so that each new branch of
// the service path finds room: their rare subpaths run as tail-call
// stages (bpf/lib/nodeport.h), verified on their own under DefaultBudget.
// On Debian's 6.1, which prunes least, they process 321K and 240K
// instructions (2026-11-30; 543K and 505K before the stages).
var ServicePathBudget = Budget{Stack: MaxStack - 128, Insns: 350_000}

// ServicePathPrograms are the programs ServicePathBudget holds.
var ServicePathPrograms = []string{"tc_lb_ingress", "xdp_lb_ingress"}

// BudgetFor is the budget of the program named prog.
func BudgetFor(prog string) Budget {
	for _, p := range ServicePathPrograms {
		if p == prog {
			return ServicePathBudget
		}
	}
	return DefaultBudget
}

// Round61 is a frame's share of the combined stack on Linux 6.1 (up to
// 6.8): rounded up to 32 bytes, at least 32.
func Round61(depth int) int {
	return (max(depth, 1) + 31) &^ 31
}

// Subprog is one function of a loaded program, in load order (the order
// of the verifier's "stack depth" figures).
type Subprog struct {
	Name  string
	Stack int   // bytes, as the verifier reported it
	Calls []int // subprograms it calls or passes as a callback
	// Dropped: the kernel removed it as dead code (every call to it was
	// dead: 6.8 and later do not even verify such a global function), so
	// no chain goes through it and it has no figure.
	Dropped bool
}

// Report is what the verifier spent on one program.
type Report struct {
	Program  string
	Subprogs []Subprog
	// Chain is the deepest call chain by 6.1's rule (subprogram names from
	// the entry), Combined its stack.
	Chain    []string
	Combined int
	Insns    int
	Dropped  []string // subprograms the kernel removed as dead code
}

// Check returns an error for each limit of b that r exceeds.
func (r Report) Check(b Budget) error {
	var errs []error
	if r.Combined > b.Stack {
		errs = append(errs, fmt.Errorf("%s: combined stack %d bytes on 6.1 (%s), budget %d of %d: "+
			"move buffers of the deepest chain to the per-CPU scratch (ns_scratch) or keep fewer values live",
			r.Program, r.Combined, r.ChainString(), b.Stack, MaxStack))
	}
	if r.Insns > b.Insns {
		errs = append(errs, fmt.Errorf("%s: %d instructions processed, budget %d of %d",
			r.Program, r.Insns, b.Insns, MaxInsns))
	}
	return errors.Join(errs...)
}

// ChainString shows the deepest chain with each frame's 6.1 share, e.g.
// "tc_lb_ingress 352 + snat_refresh 32".
func (r Report) ChainString() string {
	byName := make(map[string]int, len(r.Subprogs))
	for _, s := range r.Subprogs {
		byName[s.Name] = s.Stack
	}
	parts := make([]string, len(r.Chain))
	for i, name := range r.Chain {
		parts[i] = fmt.Sprintf("%s %d", name, Round61(byName[name]))
	}
	return strings.Join(parts, " + ")
}

// String is a one-line summary for test logs.
func (r Report) String() string {
	s := fmt.Sprintf("%s: stack %d of %d on 6.1 (%s), insns %d of %d (%d%%)",
		r.Program, r.Combined, MaxStack, r.ChainString(), r.Insns, MaxInsns, r.Insns*100/MaxInsns)
	if len(r.Dropped) > 0 {
		s += fmt.Sprintf("; dead code here: %s", strings.Join(r.Dropped, ", "))
	}
	return s
}

var (
	stackDepthRe = regexp.MustCompile(`(?m)^stack depth ([0-9+]+)\s*$`)
	processedRe  = regexp.MustCompile(`(?m)^processed (\d+) insns`)
)

// ParseLog reads the per-subprogram stack depths and the instructions
// processed from a verifier log written with ebpf.LogLevelStats.
func ParseLog(log string) (stack []int, insns int, err error) {
	m := stackDepthRe.FindStringSubmatch(log)
	if m == nil {
		return nil, 0, errors.New("no \"stack depth\" line in the verifier log (load with ebpf.LogLevelStats)")
	}
	for _, f := range strings.Split(m[1], "+") {
		n, err := strconv.Atoi(f)
		if err != nil {
			return nil, 0, fmt.Errorf("stack depth %q: %w", m[1], err)
		}
		stack = append(stack, n)
	}
	p := processedRe.FindStringSubmatch(log)
	if p == nil {
		return nil, 0, errors.New("no \"processed N insns\" line in the verifier log")
	}
	insns, err = strconv.Atoi(p[1])
	if err != nil {
		return nil, 0, fmt.Errorf("processed insns %q: %w", p[1], err)
	}
	return stack, insns, nil
}

// CallGraph lists the functions of a program spec in load order (the
// entry first, then the functions cilium/ebpf linked in after it) and, for
// each, the functions it calls or passes as a callback (bpf_loop and
// the like), which 6.1's check counts as calls too.
func CallGraph(spec *ebpf.ProgramSpec) ([]Subprog, error) {
	var subs []Subprog
	index := map[string]int{}
	var refs [][]string
	for i, ins := range spec.Instructions {
		if name := ins.Symbol(); name != "" || i == 0 {
			if name == "" {
				name = spec.Name
			}
			index[name] = len(subs)
			subs = append(subs, Subprog{Name: name})
			refs = append(refs, nil)
		}
		if ins.IsFunctionCall() || ins.IsLoadOfFunctionPointer() {
			refs[len(refs)-1] = append(refs[len(refs)-1], ins.Reference())
		}
	}
	for i, rs := range refs {
		for _, r := range rs {
			j, ok := index[r]
			if !ok {
				return nil, fmt.Errorf("%s: %s calls %q, which is not linked into the program", spec.Name, subs[i].Name, r)
			}
			subs[i].Calls = append(subs[i].Calls, j)
		}
	}
	return subs, nil
}

// Analyze reports a program loaded from spec with log, the verifier's
// output at ebpf.LogLevelStats. kept names the subprograms the loaded
// program has, in order (its BTF func infos), which the figures of the
// log are for; nil when the kernel kept all of spec's.
func Analyze(spec *ebpf.ProgramSpec, log string, kept []string) (Report, error) {
	subs, err := CallGraph(spec)
	if err != nil {
		return Report{}, err
	}
	stack, insns, err := ParseLog(log)
	if err != nil {
		return Report{}, fmt.Errorf("%s: %w", spec.Name, err)
	}
	if kept == nil {
		kept = names(subs)
	}
	if len(stack) != len(kept) {
		return Report{}, fmt.Errorf("%s: the verifier reports %d subprograms, the loaded program has %d (%v)",
			spec.Name, len(stack), len(kept), kept)
	}
	figure := make(map[string]int, len(kept))
	for i, name := range kept {
		figure[name] = stack[i]
	}
	for i := range subs {
		n, ok := figure[subs[i].Name]
		subs[i].Stack, subs[i].Dropped = n, !ok
		delete(figure, subs[i].Name)
	}
	for name := range figure {
		return Report{}, fmt.Errorf("%s: the loaded program has a subprogram %s that the spec has not (%v)",
			spec.Name, name, names(subs))
	}
	if subs[0].Dropped {
		return Report{}, fmt.Errorf("%s: the loaded program does not start with the entry %s (%v)",
			spec.Name, subs[0].Name, kept)
	}
	chain, combined, err := Deepest(subs)
	if err != nil {
		return Report{}, fmt.Errorf("%s: %w", spec.Name, err)
	}
	r := Report{Program: spec.Name, Subprogs: subs, Combined: combined, Insns: insns}
	for _, i := range chain {
		r.Chain = append(r.Chain, subs[i].Name)
	}
	for _, s := range subs {
		if s.Dropped {
			r.Dropped = append(r.Dropped, s.Name)
		}
	}
	return r, nil
}

// Deepest returns the call chain from subs[0] with the largest combined
// stack under 6.1's rule, as indexes into subs, and that stack.
func Deepest(subs []Subprog) ([]int, int, error) {
	if len(subs) == 0 {
		return nil, 0, errors.New("no subprograms")
	}
	type result struct {
		chain []int
		depth int
	}
	memo := make([]*result, len(subs))
	onPath := make([]bool, len(subs))
	var walk func(i int) (result, error)
	walk = func(i int) (result, error) {
		if memo[i] != nil {
			return *memo[i], nil
		}
		if onPath[i] {
			return result{}, fmt.Errorf("recursion through %s", subs[i].Name)
		}
		onPath[i] = true
		var best result
		for _, c := range subs[i].Calls {
			if subs[c].Dropped {
				continue
			}
			r, err := walk(c)
			if err != nil {
				return result{}, err
			}
			if r.depth > best.depth {
				best = r
			}
		}
		onPath[i] = false
		res := result{chain: append([]int{i}, best.chain...), depth: Round61(subs[i].Stack) + best.depth}
		memo[i] = &res
		return res, nil
	}
	r, err := walk(0)
	return r.chain, r.depth, err
}

func names(subs []Subprog) []string {
	out := make([]string, len(subs))
	for i, s := range subs {
		out[i] = s.Name
	}
	return out
}
