package labcli

import (
	"encoding/json"
	"fmt"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/sluice-dataplane/sluice/internal/vmtest"
)

// vmCommand is `sluice-lab vm`: commands on Debian kernels booted under QEMU
// (internal/vmtest, docs/vmtest.md).
func vmCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "vm",
		Short: "Run a command on another kernel: a Debian kernel package booted under QEMU",
		Long: `vm boots a Debian kernel package (downloaded with apt and cached under
$SLUICE_CACHE/kernels, default /var/cache/sluice/kernels) under QEMU, KVM when
a KVM guest boots here and TCG otherwise, with the host's filesystem shared
read-only (writes stay in guest memory) and the package's own /lib/modules,
and runs a command inside. docs/vmtest.md`,
	}
	cmd.AddCommand(vmRunCommand(), vmFetchCommand(), vmMatrixCommand(), vmGuestInitCommand())
	return cmd
}

func vmRunCommand() *cobra.Command {
	var (
		kernel, accel, report string
		cfg                   vmtest.Config
		console               bool
	)
	cmd := &cobra.Command{
		Use:   "run [flags] -- COMMAND [ARG...]",
		Short: "Boot a kernel and run a command in it; its exit status is ours",
		Example: `  sluice-lab vm run --kernel 6.1 -- sh -c 'uname -r; modprobe sch_fq && lsmod'
  sluice-lab vm run --kernel 6.12.117+deb12 --accel tcg -- ./datapath.test -test.run TestX`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			progress := cmd.ErrOrStderr()
			say := func(s string) { fmt.Fprintf(progress, "vmtest: %s\n", s) }
			k, err := vmtest.Get(cmd.Context(), kernel, say)
			if err != nil {
				return err
			}
			say(fmt.Sprintf("kernel %s (%s %s) in %s", k.Release, k.Package, k.Version, k.Dir))
			cfg.Kernel, cfg.Accel, cfg.Argv = k, accel, args
			cfg.Stdout, cfg.Stderr, cfg.Progress = cmd.OutOrStdout(), cmd.ErrOrStderr(), progress
			if console {
				cfg.Console = progress
			}
			res, err := vmtest.Run(cmd.Context(), cfg)
			if report != "" {
				if werr := writeReport(report, res, err); werr != nil && err == nil {
					err = werr
				}
			}
			if err != nil {
				return err
			}
			fmt.Fprintf(progress, "vmtest: kernel %s, %s: boot %.1fs (guest uptime %.2fs), command %.1fs, total %.1fs, exit status %d\n",
				res.Release, res.Accel.Name, res.Boot.Seconds(), res.GuestBoot.Seconds(), res.Command.Seconds(), res.Total.Seconds(), res.ExitCode)
			if res.ExitCode != 0 {
				os.Exit(res.ExitCode) // the command's status is ours; Run has cleaned up
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&kernel, "kernel", "6.1", `kernel: a series ("6.1", "latest 6.12": the newest Debian release) or a release ("6.1.0-56-amd64")`)
	f.StringVar(&accel, "accel", vmtest.AccelAuto, "accelerator: auto (KVM when a KVM guest boots here, else TCG), kvm or tcg")
	f.IntVar(&cfg.MemoryMiB, "memory", 3072, "guest memory in MiB")
	f.IntVar(&cfg.CPUs, "cpus", 2, "guest vCPUs")
	f.IntVar(&cfg.NICs, "nics", 0, fmt.Sprintf("virtio-net cards (0..%d), the guest's eth0, eth1, ..., joined to each other by a bridge in a network namespace of the run's own", vmtest.MaxNICs))
	f.IntVar(&cfg.NICQueues, "nic-queues", 1, fmt.Sprintf("queue pairs of each card (1..%d; more is multi-queue)", vmtest.MaxNICQueues))
	f.DurationVar(&cfg.Timeout, "timeout", 30*time.Minute, "bound on the whole run; QEMU is killed after it")
	f.DurationVar(&cfg.BootTimeout, "boot-timeout", 3*time.Minute, "bound on the time until the command starts")
	f.StringVar(&cfg.Dir, "dir", "", "working directory in the guest (default: the current one; the host's files are there read-only)")
	f.StringArrayVar(&cfg.Env, "env", nil, "environment of the command, KEY=VALUE (repeatable; default PATH, HOME=/root, TERM=dumb)")
	f.StringVar(&cfg.Init, "init-bin", "", "sluice binary to run as the guest's init (default: this one)")
	f.BoolVar(&console, "console", false, "show the guest kernel's console")
	f.StringArrayVar(&cfg.KernelArgs, "kernel-arg", nil, "extra guest kernel command-line argument (repeatable), e.g. loglevel=7")
	f.StringVar(&report, "report", "", "write the timings and the exit status as JSON to this file")
	return cmd
}

// writeReport writes a run's result (and its error) as JSON.
func writeReport(path string, res vmtest.Result, runErr error) error {
	r := struct {
		Release     string  `json:"release"`
		Accel       string  `json:"accel"`
		AccelReason string  `json:"accel_reason"`
		ExitCode    int     `json:"exit_code"`
		BootS       float64 `json:"boot_s"`
		GuestBootS  float64 `json:"guest_boot_s"`
		CommandS    float64 `json:"command_s"`
		TotalS      float64 `json:"total_s"`
		Error       string  `json:"error,omitempty"`
	}{res.Release, res.Accel.Name, res.Accel.Reason, res.ExitCode,
		res.Boot.Seconds(), res.GuestBoot.Seconds(), res.Command.Seconds(), res.Total.Seconds(), ""}
	if runErr != nil {
		r.Error = runErr.Error()
	}
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

func vmFetchCommand() *cobra.Command {
	return &cobra.Command{
		Use:     "fetch KERNEL...",
		Short:   "Resolve and download kernels into the cache; print each release and where it is",
		Example: "  sluice-lab vm fetch 6.1 6.12",
		Args:    cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			say := func(s string) { fmt.Fprintf(cmd.ErrOrStderr(), "vmtest: %s\n", s) }
			for _, a := range args {
				k, err := vmtest.Get(cmd.Context(), a, say)
				if err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "%s\t%s\t%s\t%s\n", k.Release, k.Package, k.Version, k.Dir)
			}
			return nil
		},
	}
}

// vmGuestInitCommand is the guest's PID 1 (the kernel command line ends in
// "-- vm guest-init"); it refuses to run anywhere else.
func vmGuestInitCommand() *cobra.Command {
	return &cobra.Command{
		Use:    "guest-init",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			if os.Getpid() != 1 {
				return fmt.Errorf("vm guest-init runs only as a guest's PID 1 (started by sluice-lab vm run)")
			}
			vmtest.GuestInit()
			return nil
		},
	}
}
