package datapath

import (
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/sluice-dataplane/sluice/internal/lbmap"
	"github.com/sluice-dataplane/sluice/internal/maglev"
	"github.com/sluice-dataplane/sluice/internal/probe"
	"github.com/sluice-dataplane/sluice/internal/probe/probetest"
	"github.com/sluice-dataplane/sluice/internal/verifierbudget"
)

// headroomObject is one BPF object and the load-time settings the agent
// may give it.
type headroomObject struct {
	name     string
	load     func() (*ebpf.CollectionSpec, error)
	features []string // probe features it needs
	configs  []headroomConfig
}

// headroomConfig is one choice of load-time settings (globals the
// verifier reads as constants, and the array sizes that go with them).
type headroomConfig struct {
	name      string
	configure func(*ebpf.CollectionSpec) error
}

// Flow cache sizes and Maglev table sizes the agent accepts: off or the
// smallest, default and largest (--bpf-lb-flow-cache-sets,
// --bpf-lb-maglev-table-size). Only a flow cache of 0 sets takes another
// path through the verifier; the sizes change constants it checks bounds
// with, so each is loaded once.
var (
	headroomFlowSets = []uint32{0, lbmap.MinFlowCacheSets, lbmap.DefaultFlowCacheSets, lbmap.MaxFlowCacheSets}
	headroomMaglev   = []uint32{maglev.MinTableSize, maglev.DefaultTableSize, maglev.MaxTableSize}
)

// headroomObjects lists every object sluice loads, each in every
// combination of its settings; with -short (a TCG guest spends 30 s on
// each north-south program) only the defaults and the flow cache off.
func headroomObjects(short bool) []headroomObject {
	flowSets, maglevSizes := headroomFlowSets, headroomMaglev
	if short {
		flowSets = []uint32{0, lbmap.DefaultFlowCacheSets}
		maglevSizes = []uint32{maglev.DefaultTableSize}
	}
	var nsConfigs, podConfigs []headroomConfig
	for _, m := range maglevSizes {
		podConfigs = append(podConfigs, headroomConfig{
			name: fmt.Sprintf("maglev=%d", m),
			configure: func(s *ebpf.CollectionSpec) error {
				if err := configureKernel(s); err != nil { // as the agent loads it here
					return err
				}
				return lbmap.ConfigureMaglev(s, m, 0)
			},
		})
		for _, f := range flowSets {
			nsConfigs = append(nsConfigs, headroomConfig{
				name: fmt.Sprintf("flowcache=%d,maglev=%d", f, m),
				configure: func(s *ebpf.CollectionSpec) error {
					if err := configureKernel(s); err != nil { // as the agent loads it here
						return err
					}
					if err := lbmap.ConfigureMaglev(s, m, 0); err != nil {
						return err
					}
					return lbmap.ConfigureFlowCache(s, f)
				},
			})
		}
	}
	defaults := []headroomConfig{{name: "defaults", configure: func(*ebpf.CollectionSpec) error { return nil }}}
	return []headroomObject{
		{"tclb", loadTclb, []string{probe.BTF, probe.TC}, nsConfigs},
		{"xdplb", loadXdplb, []string{probe.BTF, probe.XDP}, nsConfigs},
		{"tcpod", loadTcpod, []string{probe.BTF, probe.TC}, podConfigs},
		{"socklb", loadSocklb, []string{probe.BTF, probe.CgroupConnect4, probe.CgroupGetpeername4,
			probe.HelperSetRetval, probe.HelperNetnsCookie}, defaults},
		// The UDP socket destroyer, where the kernel has its kfunc.
		{"sockdestroy", loadSockdestroy, []string{probe.BTF, probe.SockDestroy}, defaults},
		// sluice-lab bench pps's generator and sinks, with its defaults.
		{"pps", func() (*ebpf.CollectionSpec, error) { return ebpf.LoadCollectionSpec("../bench/pps_bpfel.o") },
			[]string{probe.BTF, probe.XDP, probe.TC, probe.HelperLoop}, defaults},
		// The bandwidth manager's (internal/bandwidth): tc in both modes,
		// the socket hook with every feature and with none.
		{"tcedt", func() (*ebpf.CollectionSpec, error) { return ebpf.LoadCollectionSpec("../bandwidth/tcedt_bpfel.o") },
			[]string{probe.BTF, probe.TC}, []headroomConfig{setVars("edt", "bw_mode", 1), setVars("police", "bw_mode", 2)}},
		{"sockedt", func() (*ebpf.CollectionSpec, error) { return ebpf.LoadCollectionSpec("../bandwidth/sockedt_bpfel.o") },
			[]string{probe.BTF, probe.CgroupLinks},
			[]headroomConfig{setVars("bbr+pacing", "bw_enable_bbr", 1, "bw_enable_pacing", 1, "bw_pace_pct", 110), defaults[0]}},
	}
}

// setVars is a configuration that sets uint32 globals, name then value.
func setVars(name string, kv ...any) headroomConfig {
	return headroomConfig{name: name, configure: func(s *ebpf.CollectionSpec) error {
		for i := 0; i+1 < len(kv); i += 2 {
			v, ok := s.Variables[kv[i].(string)]
			if !ok {
				return fmt.Errorf("no global %s", kv[i])
			}
			if err := v.Set(uint32(kv[i+1].(int))); err != nil {
				return fmt.Errorf("%s: %w", kv[i], err)
			}
		}
		return nil
	}}
}

// TestPrivilegedVerifierHeadroom loads every program of every BPF object in
// every combination of the settings the agent can choose, with the
// verifier's statistics, and fails when a program's stack (its deepest
// BPF-to-BPF chain, by Linux 6.1's rule: each frame rounded up to 32
// bytes) or its processed instructions leave less headroom than
// verifierbudget.DefaultBudget (the service path's two programs:
// ServicePathBudget), so a change that eats it fails here, on
// any kernel, before an older kernel refuses the program. A program this
// kernel's verifier refuses fails with its name and the verifier's last
// lines. The figures of every program are logged (go test -v).
func TestPrivilegedVerifierHeadroom(t *testing.T) {
	probetest.RequireRoot(t, "loading BPF programs")
	release := kernelRelease(t)
	t.Logf("kernel %s; budget: stack %d of %d bytes (6.1's rule), %d of %d instructions",
		release, verifierbudget.DefaultBudget.Stack, verifierbudget.MaxStack,
		verifierbudget.DefaultBudget.Insns, verifierbudget.MaxInsns)
	// The verifier takes one CPU per load: a load per CPU at once, whatever
	// go test's -parallel (scripts/test.sh sets it for test/e2e's scheduler).
	cpus := make(chan struct{}, runtime.NumCPU())
	for _, obj := range headroomObjects(testing.Short()) {
		t.Run(obj.name, func(t *testing.T) {
			probetest.SkipUnless(t, obj.features...)
			for _, cfg := range obj.configs {
				t.Run(cfg.name, func(t *testing.T) {
					t.Parallel()
					cpus <- struct{}{}
					defer func() { <-cpus }()
					spec, err := obj.load()
					if err != nil {
						t.Fatal(err)
					}
					if err := cfg.configure(spec); err != nil {
						t.Fatal(err)
					}
					for _, prog := range loadEachProgram(t, spec) {
						label := fmt.Sprintf("%s %s [%s]", obj.name, prog.name, cfg.name)
						if prog.err != nil {
							t.Errorf("%s: kernel %s refuses it: %v", label, release, prog.err)
							continue
						}
						if prog.report.Program == "" {
							continue // loaded, but its log unreadable: reported above
						}
						t.Logf("%s: %s", label, prog.report)
						if err := prog.report.Check(verifierbudget.BudgetFor(prog.name)); err != nil {
							t.Errorf("%s on kernel %s: %v", label, release, err)
						}
					}
				})
			}
		})
	}
}

// kernelRelease is uname -r.
func kernelRelease(t *testing.T) string {
	t.Helper()
	var uts unix.Utsname
	if err := unix.Uname(&uts); err != nil {
		t.Fatal(err)
	}
	return unix.ByteSliceToString(uts.Release[:])
}

// headroomResult is one program's load: its report, or why it failed.
type headroomResult struct {
	name   string
	report verifierbudget.Report
	err    error
}

// loadEachProgram loads each program of spec on its own, over one set of
// private maps, so that every program is reported, and a refused one by
// name. The maps are unpinned, and hash-type maps shrink to 1,024 entries:
// the verifier never reads their size, while each preallocated LRU map of
// the defaults costs megabytes. Arrays keep theirs (the flow cache's and
// Maglev's sizes go with constants the verifier does read).
func loadEachProgram(t *testing.T, spec *ebpf.CollectionSpec) []headroomResult {
	t.Helper()
	for name, ms := range spec.Maps {
		// The stages' prog array names its programs, which load one
		// at a time here, each verified from its own entry.
		ms = withoutPrograms(ms)
		spec.Maps[name] = ms
		ms.Pinning = ebpf.PinNone
		switch ms.Type {
		case ebpf.Hash, ebpf.LRUHash, ebpf.PerCPUHash, ebpf.LRUCPUHash, ebpf.LPMTrie, ebpf.HashOfMaps:
			ms.MaxEntries = min(ms.MaxEntries, 1024)
		}
	}
	// The maps alone, made by the collection loader as it makes them for
	// programs (its flags, contents, frozen .rodata).
	mapsOnly := spec.Copy()
	mapsOnly.Programs = nil
	mapColl, err := ebpf.NewCollection(mapsOnly)
	if err != nil {
		t.Fatalf("maps: %v", err)
	}
	t.Cleanup(mapColl.Close)
	maps := mapColl.Maps
	names := make([]string, 0, len(spec.Programs))
	for name := range spec.Programs {
		names = append(names, name)
	}
	slices.Sort(names)
	results := make([]headroomResult, 0, len(names))
	for _, name := range names {
		one := spec.Copy()
		for other := range one.Programs {
			if other != name {
				delete(one.Programs, other)
			}
		}
		r := headroomResult{name: name}
		coll, err := ebpf.NewCollectionWithOptions(one, ebpf.CollectionOptions{
			MapReplacements: maps,
			Programs:        ebpf.ProgramOptions{LogLevel: ebpf.LogLevelStats},
		})
		if err != nil {
			r.err = verifierTail(err)
		} else {
			prog := coll.Programs[name]
			kept, err := keptSubprogs(prog)
			if err == nil {
				r.report, err = verifierbudget.Analyze(one.Programs[name], prog.VerifierLog, kept)
			}
			if err != nil {
				t.Errorf("%s: %v", name, err)
			}
			coll.Close()
		}
		results = append(results, r)
	}
	return results
}

// keptSubprogs names the subprograms of a loaded program, in order, from
// its BTF func infos: the verifier's "stack depth" figures are for these.
func keptSubprogs(prog *ebpf.Program) ([]string, error) {
	info, err := prog.Info()
	if err != nil {
		return nil, fmt.Errorf("program info: %w", err)
	}
	funcs, err := info.FuncInfos()
	if err != nil {
		return nil, fmt.Errorf("func infos: %w", err)
	}
	names := make([]string, len(funcs))
	for i, f := range funcs {
		names[i] = f.Func.Name
	}
	return names, nil
}

// verifierTail is err with the verifier's last lines, where it said why.
func verifierTail(err error) error {
	var verr *ebpf.VerifierError
	if !errors.As(err, &verr) {
		return err
	}
	lines := verr.Log[max(len(verr.Log)-8, 0):]
	return fmt.Errorf("%w\n\t%s", verr.Cause, strings.Join(lines, "\n\t"))
}
