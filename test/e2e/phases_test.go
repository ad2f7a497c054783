package e2e

import (
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// phaseEnv runs one phase of this package (scripts/test.sh): "alongside",
// the tests that call alongside, which then start together as soon as the
// binary does, beside the other packages' tests (lanes noGuest and alone
// wait for those to end); "serial", every other test, on a machine the
// script keeps otherwise quiet. Unset, both, serial first, as go test
// orders them. The phase is a -test.skip of the other phase's tests (the
// user's -skip still applies), so a test left out is not run rather than
// skipped.
const phaseEnv = "SLUICE_E2E_PHASE"

// packageTests lists the top-level tests declared in dir's _test.go files
// and, of them, those whose body calls alongside.
func packageTests(dir string) (all, along []string, err error) {
	files, err := filepath.Glob(filepath.Join(dir, "*_test.go"))
	if err != nil {
		return nil, nil, err
	}
	fset := token.NewFileSet()
	for _, path := range files {
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return nil, nil, err
		}
		for _, d := range f.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok || fn.Recv != nil || fn.Body == nil || !isTestFunc(fn) {
				continue
			}
			all = append(all, fn.Name.Name)
			if callsAlongside(fn.Body) {
				along = append(along, fn.Name.Name)
			}
		}
	}
	slices.Sort(all)
	slices.Sort(along)
	return all, along, nil
}

// isTestFunc: TestXxx(t *testing.T), as go test finds them.
func isTestFunc(fn *ast.FuncDecl) bool {
	name, ok := strings.CutPrefix(fn.Name.Name, "Test")
	if !ok || name != "" && strings.ToLower(name[:1]) == name[:1] {
		return false
	}
	ps := fn.Type.Params.List
	if len(ps) != 1 || len(ps[0].Names) > 1 {
		return false
	}
	star, ok := ps[0].Type.(*ast.StarExpr)
	if !ok {
		return false
	}
	sel, ok := star.X.(*ast.SelectorExpr)
	return ok && sel.Sel.Name == "T"
}

func callsAlongside(body *ast.BlockStmt) bool {
	found := false
	ast.Inspect(body, func(n ast.Node) bool {
		if c, ok := n.(*ast.CallExpr); ok {
			if id, ok := c.Fun.(*ast.Ident); ok && id.Name == "alongside" {
				found = true
			}
		}
		return !found
	})
	return found
}

// phaseSkip is the -test.skip pattern that leaves phase's tests.
func phaseSkip(phase string, all, along []string) (string, error) {
	var out []string
	switch phase {
	case "alongside":
		for _, name := range all {
			if !slices.Contains(along, name) {
				out = append(out, name)
			}
		}
	case "serial":
		out = along
	default:
		return "", fmt.Errorf("%s=%q: want alongside or serial", phaseEnv, phase)
	}
	if len(out) == 0 {
		return "", nil
	}
	for i, name := range out {
		out[i] = regexp.QuoteMeta(name)
	}
	return "^(" + strings.Join(out, "|") + ")$", nil
}

// selectPhase narrows the run to phase (phaseEnv's value; "" leaves it),
// reading the tests from the package's sources in the working directory,
// where go test runs the binary.
func selectPhase(phase string) error {
	if phase == "" {
		return nil
	}
	all, along, err := packageTests(".")
	if err != nil {
		return fmt.Errorf("%s: read the package's tests: %w", phaseEnv, err)
	}
	if len(all) == 0 {
		return fmt.Errorf("%s: no _test.go file here: run the binary in test/e2e", phaseEnv)
	}
	skip, err := phaseSkip(phase, all, along)
	if err != nil || skip == "" {
		return err
	}
	if !flag.Parsed() {
		flag.Parse()
	}
	if user := flag.Lookup("test.skip").Value.String(); user != "" {
		skip = "(" + user + ")|" + skip
	}
	return flag.Set("test.skip", skip)
}

// TestPhasesSplitThePackage: the phases part the package's tests by whether
// they call alongside, and together run each test once.
func TestPhasesSplitThePackage(t *testing.T) {
	all, along, err := packageTests(".")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"TestPrivilegedKubeletHelm", "TestPrivilegedKernelSmokeGuest", "TestPrivilegedBandwidthManagerEDTGuest"} {
		if !slices.Contains(along, want) {
			t.Errorf("%s calls alongside but is not in the alongside phase: %v", want, along)
		}
	}
	for _, want := range []string{"TestPrivilegedFloodShapesKeepConnections", "TestPrivilegedFrontendsReachable", "TestPhasesSplitThePackage"} {
		if !slices.Contains(all, want) || slices.Contains(along, want) {
			t.Errorf("%s: want it among the serial tests", want)
		}
	}
	if slices.Contains(all, "TestMain") {
		t.Error("TestMain listed as a test")
	}
	serialSkip, err := phaseSkip("serial", all, along)
	if err != nil {
		t.Fatal(err)
	}
	alongSkip, err := phaseSkip("alongside", all, along)
	if err != nil {
		t.Fatal(err)
	}
	s, a := regexp.MustCompile(serialSkip), regexp.MustCompile(alongSkip)
	for _, name := range all {
		inSerial, inAlong := !s.MatchString(name), !a.MatchString(name)
		if inSerial == inAlong {
			t.Errorf("%s: runs in the serial phase %v, in the alongside phase %v: want exactly one", name, inSerial, inAlong)
		}
		if inAlong != slices.Contains(along, name) {
			t.Errorf("%s: in the alongside phase %v, calls alongside %v", name, inAlong, slices.Contains(along, name))
		}
	}
	// A prefix of a name is not the name: the patterns are anchored.
	if s.MatchString("TestPrivilegedKubeletHelmX") || a.MatchString("TestPrivilegedFloodShapesKeepConnectionsX") {
		t.Error("a phase's pattern matches a longer name")
	}
	if _, err := phaseSkip("both", all, along); err == nil || !strings.Contains(err.Error(), phaseEnv) {
		t.Errorf("an unknown phase: err %v, want one naming %s", err, phaseEnv)
	}
}
