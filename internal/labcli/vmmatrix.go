package labcli

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/sluice-dataplane/sluice/internal/vmtest/matrix"
)

// vmMatrixCommand is `sluice-lab vm matrix`: the kernel-facing tests on the
// host's kernel and on Debian's under QEMU (internal/vmtest/matrix,
// docs/kernels.md). It builds test binaries, so it runs from the source tree.
func vmMatrixCommand() *cobra.Command {
	var (
		kernels, suites []string
		out, doc        string
		cfg             matrix.Config
	)
	cmd := &cobra.Command{
		Use:   "matrix",
		Short: "Run the kernel-facing test packages and the lab smoke on each kernel; write JSON, Markdown and docs/kernels.md's table",
		Long: `matrix builds each suite's package with go test -c (from the module's root),
runs it on every kernel (the host's directly, Debian's in a guest booted per
suite) and writes matrix.json and matrix.md under --out and the table into
--doc. It exits 1 when a test failed on any kernel (a program the verifier
refuses fails TestPrivilegedVerifierHeadroom, which names it); a kernel that
cannot boot here (no QEMU, no kernel package) is reported as skipped.
Heavy: a TCG guest takes both cores for minutes. scripts/kernel-matrix.sh
builds and runs it.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			for _, s := range matrix.DefaultSuites {
				if len(suites) == 0 || slices.Contains(suites, s.Name) {
					cfg.Suites = append(cfg.Suites, s)
				}
			}
			if len(cfg.Suites) == 0 {
				return fmt.Errorf("--suites %s: want some of %s", strings.Join(suites, ","), suiteList())
			}
			cfg.Kernels, cfg.Log = kernels, cmd.ErrOrStderr()
			if cfg.BinDir == "" {
				cfg.BinDir = os.Getenv("SLUICE_BIN_DIR")
			}
			if cfg.BinDir == "" {
				cfg.BinDir = "bin"
			}
			var err error
			if cfg.Root, err = os.Getwd(); err != nil {
				return err
			}
			if cfg.BinDir, err = filepath.Abs(cfg.BinDir); err != nil {
				return err
			}
			doc = matrixDoc(cmd.Flags(), doc, cmd.ErrOrStderr())
			res, err := matrix.Run(cmd.Context(), cfg)
			if res == nil {
				return err
			}
			if err != nil && doc != "" {
				// An interrupted run's table would replace the full
				// matrix's with "context canceled" rows.
				fmt.Fprintf(cmd.ErrOrStderr(), "matrix: the run did not finish (%v): %s keeps its table; %s has what ran\n", err, doc, out)
				doc = ""
			}
			if werr := writeMatrix(res, out, doc); werr != nil && err == nil {
				err = werr
			}
			fmt.Fprintln(cmd.OutOrStdout(), res.Markdown())
			if err != nil {
				return err
			}
			if p := res.Problems(); len(p) > 0 {
				fmt.Fprintf(cmd.ErrOrStderr(), "\nkernel matrix FAILED:\n  %s\n", strings.Join(p, "\n  "))
				os.Exit(1)
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "\nkernel matrix passed on %d kernels in %.0f s\n", len(res.Kernels), res.WallS)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringSliceVar(&kernels, "kernels", matrix.DefaultKernels, `kernels: "host" (this one) and Debian specs ("6.1", "latest 6.12", "6.1.0-56-amd64")`)
	f.StringSliceVar(&suites, "suites", nil, "suites to run (default all): "+suiteList())
	f.StringVar(&out, "out", "results/kernels", "directory for matrix.json and matrix.md")
	f.StringVar(&doc, "doc", "docs/kernels.md", `Markdown file whose kernel-matrix block gets the table ("" for none)`)
	f.StringVar(&cfg.BinDir, "bin-dir", "", "directory with sluice and sluice-agent (default $SLUICE_BIN_DIR, else ./bin)")
	f.StringVar(&cfg.Accel, "accel", "auto", "guest accelerator: auto, kvm or tcg")
	f.IntVar(&cfg.MemoryMiB, "memory", 3072, "guest memory in MiB")
	f.IntVar(&cfg.CPUs, "cpus", 2, "guest vCPUs")
	f.StringVar(&cfg.LockFile, "lock", "", "flock this file around each suite's run, released between them (a machine shared with other heavy jobs)")
	return cmd
}

// matrixDoc is the file whose table a run rewrites: none for a partial
// run (--kernels or --suites narrowed) unless --doc names one, so that a
// quick check of one kernel does not replace the full matrix's table.
func matrixDoc(f *pflag.FlagSet, doc string, log io.Writer) string {
	if f.Changed("doc") || !(f.Changed("kernels") || f.Changed("suites")) {
		return doc
	}
	if doc != "" {
		fmt.Fprintf(log, "matrix: a partial run (--kernels or --suites): %s keeps the full matrix's table; --doc %s writes it anyway\n", doc, doc)
	}
	return ""
}

func suiteList() string {
	var names []string
	for _, s := range matrix.DefaultSuites {
		names = append(names, s.Name)
	}
	return strings.Join(names, ", ")
}

func writeMatrix(res *matrix.Result, out, doc string) error {
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	if err := res.WriteJSON(filepath.Join(out, "matrix.json")); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(out, "matrix.md"), []byte(res.Markdown()), 0o644); err != nil {
		return err
	}
	if doc == "" {
		return nil
	}
	return res.UpdateDoc(doc)
}
