package labcli

import (
	"bytes"
	"cmp"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/sluice-dataplane/sluice/internal/vmtest"
)

// benchInGuest runs this binary's args, followed by the flags the user set
// on cmd but those named in skip, inside kernel spec under QEMU (vmtest),
// with env added to the guest's environment and memMiB of memory (0: 3 GiB), and decodes the JSON report
// the command prints on stdout into report. It returns the kernel's label
// ("a guest under tcg: why"), "" when the guest did not run or printed no
// report, and an error for a run that failed.
func benchInGuest(cmd *cobra.Command, spec string, args, skip, env []string, memMiB int, report any) (string, error) {
	progress := cmd.ErrOrStderr()
	say := func(s string) { fmt.Fprintf(progress, "vmtest: %s\n", s) }
	k, err := vmtest.Get(cmd.Context(), spec, say)
	if err != nil {
		return "", err
	}
	exe, err := os.Executable()
	if err != nil {
		return "", err
	}
	argv := append([]string{exe}, args...)
	argv = append(argv, guestFlags(cmd.Flags(), skip)...)
	say(fmt.Sprintf("kernel %s (%s %s): %s", k.Release, k.Package, k.Version, strings.Join(argv[1:], " ")))
	var stdout bytes.Buffer
	res, err := vmtest.Run(cmd.Context(), vmtest.Config{
		Kernel: k, Argv: argv, Stdout: &stdout, Stderr: progress, Progress: progress,
		Env:       append([]string{"PATH=" + os.Getenv("PATH"), "HOME=/root", "TERM=dumb"}, env...),
		MemoryMiB: cmp.Or(memMiB, 3072), CPUs: 2, Timeout: 3 * time.Hour,
	})
	if err != nil {
		return "", err
	}
	if jerr := json.Unmarshal(stdout.Bytes(), report); jerr != nil {
		return "", fmt.Errorf("the guest's report (exit status %d): %w: %.400s", res.ExitCode, jerr, stdout.String())
	}
	accel := fmt.Sprintf("a guest under %s: %s", res.Accel.Name, res.Accel.Reason)
	if res.ExitCode != 0 {
		return accel, fmt.Errorf("the benchmark in the guest exited with status %d", res.ExitCode)
	}
	return accel, nil
}

// guestFlags are the flags set on fs, but those named in skip, as
// arguments: lists comma-separated.
func guestFlags(fs *pflag.FlagSet, skip []string) []string {
	var out []string
	fs.Visit(func(f *pflag.Flag) {
		if slices.Contains(skip, f.Name) {
			return
		}
		v := f.Value.String()
		if sv, ok := f.Value.(pflag.SliceValue); ok {
			v = strings.Join(sv.GetSlice(), ",")
		}
		out = append(out, "--"+f.Name+"="+v)
	})
	return out
}
