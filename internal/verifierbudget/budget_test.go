package verifierbudget

import (
	"slices"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
)

func TestRound61(t *testing.T) {
	for _, c := range []struct{ depth, want int }{
		{0, 32}, // an empty frame still costs 32 bytes on 6.1
		{1, 32},
		{8, 32},
		{32, 32},
		{33, 64},
		{40, 64},
		{464, 480},
		{480, 480},
		{481, 512},
	} {
		if got := Round61(c.depth); got != c.want {
			t.Errorf("Round61(%d) = %d, want %d", c.depth, got, c.want)
		}
	}
}

// The log of tc_lb_ingress as 6.18 wrote it before the restructure:
// the figures 6.1 refused as "combined stack size of 2 calls is 544".
const log618 = `func#0 @0
verification time 412345 usec
stack depth 464+8+24+16+24+40
processed 284966 insns (limit 1000000) max_states_per_insn 17 total_states 12743 peak_states 5244 mark_read 0
`

func TestParseLog(t *testing.T) {
	stack, insns, err := ParseLog(log618)
	if err != nil {
		t.Fatal(err)
	}
	if want := []int{464, 8, 24, 16, 24, 40}; !slices.Equal(stack, want) || insns != 284966 {
		t.Errorf("ParseLog = %v, %d; want %v, 284966", stack, insns, want)
	}
	for name, log := range map[string]string{
		"no stack line":     "processed 10 insns (limit 1000000)\n",
		"no processed line": "stack depth 8\n",
		"bad figure":        "stack depth 8+x\nprocessed 10 insns\n",
	} {
		if _, _, err := ParseLog(log); err == nil {
			t.Errorf("%s: ParseLog(%q) = nil error", name, log)
		}
	}
}

// serviceProgram is tc_lb_ingress's shape: the entry calls five functions,
// one of them only through a callback reference (as bpf_loop's would be).
func serviceProgram() *ebpf.ProgramSpec {
	fn := func(name string) asm.Instructions {
		return asm.Instructions{asm.Mov.Imm(asm.R0, 0).WithSymbol(name), asm.Return()}
	}
	insns := asm.Instructions{
		asm.Mov.Imm(asm.R0, 0).WithSymbol("tc_lb_ingress"),
		asm.Call.Label("fc_drop"),
		asm.Call.Label("fc_fill"),
		asm.Call.Label("snat_refresh"),
		asm.Call.Label("ns_maglev_backend_id"),
		asm.Instruction{OpCode: asm.LoadImmOp(asm.DWord), Dst: asm.R2, Src: asm.PseudoFunc}.
			WithReference("ns_src_range_allowed"),
		asm.Return(),
	}
	for _, name := range []string{"fc_drop", "fc_fill", "ns_maglev_backend_id", "ns_src_range_allowed", "snat_refresh"} {
		insns = append(insns, fn(name)...)
	}
	return &ebpf.ProgramSpec{Name: "tc_lb_ingress", Instructions: insns}
}

func TestAnalyzeReproducesSixOneRefusal(t *testing.T) {
	r, err := Analyze(serviceProgram(), log618, nil)
	if err != nil {
		t.Fatal(err)
	}
	// 6.1 said "combined stack size of 2 calls is 544": 464 -> 480 and
	// snat_refresh's 40 -> 64.
	if r.Combined != 544 || !slices.Equal(r.Chain, []string{"tc_lb_ingress", "snat_refresh"}) {
		t.Errorf("Combined %d via %v, want 544 via [tc_lb_ingress snat_refresh]", r.Combined, r.Chain)
	}
	if r.Insns != 284966 {
		t.Errorf("Insns %d, want 284966", r.Insns)
	}
	err = r.Check(DefaultBudget)
	if err == nil || !strings.Contains(err.Error(), "combined stack 544") ||
		!strings.Contains(err.Error(), "tc_lb_ingress 480 + snat_refresh 64") {
		t.Errorf("Check(%+v) = %v, want the combined stack named with its chain", DefaultBudget, err)
	}
}

func TestAnalyzeWithinBudget(t *testing.T) {
	r, err := Analyze(serviceProgram(), "stack depth 328+8+24+16+24+32\nprocessed 219868 insns (limit 1000000)\n", nil)
	if err != nil {
		t.Fatal(err)
	}
	// 328 -> 352; fc_fill 24, ns_src_range_allowed 24 and snat_refresh 32
	// all cost 32: the first of them in load order is reported.
	if r.Combined != 384 || r.Chain[0] != "tc_lb_ingress" || len(r.Chain) != 2 {
		t.Errorf("Combined %d via %v, want 384 via tc_lb_ingress and one callee", r.Combined, r.Chain)
	}
	if err := r.Check(DefaultBudget); err != nil {
		t.Error(err)
	}
	if err := r.Check(Budget{Stack: 512, Insns: 200_000}); err == nil || !strings.Contains(err.Error(), "219868 instructions") {
		t.Errorf("Check with a 200K instruction budget = %v, want the count named", err)
	}
}

// With the flow cache off, 6.18 removes fc_drop and fc_fill as dead code:
// four figures for the four it kept, and no chain through the others.
func TestAnalyzeDroppedSubprogs(t *testing.T) {
	kept := []string{"tc_lb_ingress", "ns_maglev_backend_id", "ns_src_range_allowed", "snat_refresh"}
	r, err := Analyze(serviceProgram(), "stack depth 312+16+24+72\nprocessed 150000 insns\n", kept)
	if err != nil {
		t.Fatal(err)
	}
	if r.Combined != 320+96 || !slices.Equal(r.Chain, []string{"tc_lb_ingress", "snat_refresh"}) ||
		!slices.Equal(r.Dropped, []string{"fc_drop", "fc_fill"}) {
		t.Errorf("Combined %d via %v, dropped %v; want 416 via [tc_lb_ingress snat_refresh], dropped [fc_drop fc_fill]",
			r.Combined, r.Chain, r.Dropped)
	}
	if !strings.Contains(r.String(), "dead code here: fc_drop, fc_fill") {
		t.Errorf("String() = %q, want the dropped subprograms named", r.String())
	}
}

func TestAnalyzeMismatch(t *testing.T) {
	if _, err := Analyze(serviceProgram(), "stack depth 328+8\nprocessed 1 insns\n", nil); err == nil {
		t.Error("two figures for six subprograms: want an error")
	}
	if _, err := Analyze(serviceProgram(), "stack depth 328+8\nprocessed 1 insns\n",
		[]string{"tc_lb_ingress", "not_in_spec"}); err == nil {
		t.Error("a kept subprogram the spec has not: want an error")
	}
	spec := &ebpf.ProgramSpec{Name: "p", Instructions: asm.Instructions{
		asm.Mov.Imm(asm.R0, 0).WithSymbol("p"), asm.Call.Label("gone"), asm.Return(),
	}}
	if _, err := CallGraph(spec); err == nil {
		t.Error("a call to a function not linked in: want an error")
	}
}

func TestDeepestChains(t *testing.T) {
	for _, c := range []struct {
		name  string
		subs  []Subprog
		chain []int
		depth int
	}{
		{"entry alone", []Subprog{{Name: "a", Stack: 0}}, []int{0}, 32},
		{"three deep beats a wide callee", []Subprog{
			{Name: "a", Stack: 100, Calls: []int{1, 2}},
			{Name: "b", Stack: 60},
			{Name: "c", Stack: 8, Calls: []int{3}},
			{Name: "d", Stack: 40},
		}, []int{0, 2, 3}, 128 + 32 + 64},
		{"shared callee counted on each chain", []Subprog{
			{Name: "a", Stack: 0, Calls: []int{1, 2}},
			{Name: "b", Stack: 200, Calls: []int{2}},
			{Name: "c", Stack: 40},
		}, []int{0, 1, 2}, 32 + 224 + 64},
	} {
		chain, depth, err := Deepest(c.subs)
		if err != nil || !slices.Equal(chain, c.chain) || depth != c.depth {
			t.Errorf("%s: Deepest = %v, %d, %v; want %v, %d", c.name, chain, depth, err, c.chain, c.depth)
		}
	}
	if _, _, err := Deepest([]Subprog{{Name: "a", Calls: []int{1}}, {Name: "b", Calls: []int{0}}}); err == nil {
		t.Error("recursion: want an error")
	}
}

func TestBudgetFor(t *testing.T) {
	for _, c := range []struct {
		prog string
		want Budget
	}{
		{"tc_lb_ingress", ServicePathBudget},
		{"xdp_lb_ingress", ServicePathBudget},
		{"tc_lb_dsr_backend", DefaultBudget},
		{"sock4_connect", DefaultBudget},
	} {
		if got := BudgetFor(c.prog); got != c.want {
			t.Errorf("BudgetFor(%s) = %+v, want %+v", c.prog, got, c.want)
		}
	}
	if ServicePathBudget.Stack >= DefaultBudget.Stack || ServicePathBudget.Insns >= DefaultBudget.Insns {
		t.Errorf("ServicePathBudget %+v is no tighter than DefaultBudget %+v", ServicePathBudget, DefaultBudget)
	}
}
