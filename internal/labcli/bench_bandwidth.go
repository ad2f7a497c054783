package labcli

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/sluice-dataplane/sluice/internal/bandwidth"
	"github.com/sluice-dataplane/sluice/internal/bench"
)

// benchBandwidthCommand is `sluice-lab bench bandwidth`: a Pod's limit held by
// each mechanism in turn, measured with iperf3.
func benchBandwidthCommand() *cobra.Command {
	cfg := bench.BandwidthConfig{
		Contenders: bench.BWDefaultContenders,
		Flows:      []int{1, 8},
		CCs:        []string{"cubic", "bbr"},
		UDP:        true,
		Ingress:    true,
		Latency:    true,
		Pin:        true,
		Duration:   5 * time.Second,
	}
	rates := []string{"10M", "50M", "200M", "1G"}
	var out, guest string
	var jsonStdout bool
	var dataplanes []string
	lcfg := bench.BandwidthLabConfig{Flows: 1, Repeats: 3, Ingress: true, Latency: true, Prefix: "sluice-bwlab-"}
	cmd := &cobra.Command{
		Use:   "bandwidth",
		Short: "Pod bandwidth limits: sluice (EDT, or its fallback), the policer, TBF and HTB, measured with iperf3 and sockperf",
		Long: `Builds a Pod, a node and a remote host in network namespaces of its own
(sluice-bw-*) and, for each contender in turn, limits the Pod's egress and
ingress at each rate and runs iperf3: TCP with each congestion control and
stream count, and UDP at twice the rate. Reports the receiver's goodput, the
wire rate it stands for (headers of every segment, as a limit counts) over
the rate, retransmits, UDP loss and the BPF limiter's drops and CE marks.
With --latency (the default) it then measures request/response round trips
(sockperf ping-pong over TCP) from the Pod while one iperf3 stream saturates
the limit: p50, p95, p99 and max, and p99 against the bandwidth CNI
plugin's TBF. The bulk stream runs on the first CPU and the probe on the
last (--pin), as a node's scheduler would spread them. A contender this kernel cannot run (edt-fq without sch_fq) is
reported as skipped. Contenders: ` + strings.Join(bench.BWContenders, ", ") + `
("sluice" is what the bandwidth manager uses on this kernel). Writes JSON,
Markdown and plots under --out (docs/bandwidth.md reads them). Needs root,
iperf3 and sockperf (scripts/deps.sh). The defaults take about 20 minutes.

--guest KERNEL runs the whole benchmark inside a Debian kernel under QEMU
(sluice-lab vm run; docs/vmtest.md), for what this machine's kernel lacks:
Debian's kernels have sch_fq, so edt-fq runs there. The report says which
kernel and accelerator; under TCG (no KVM) the guest is emulated, so
compare contenders of the same run, not figures across runs.

With --dataplanes, the lab mode: each dataplane's own bandwidth manager
(sluice's, the real Cilium's; scripts/cilium-build.sh) in a lab of its own,
driven by the Pod's annotations as a user drives it: node1-pod1 annotated
at each rate, node1-pod2 not (the path's ceiling), iperf3 from each to a
pod of node2 (TCP, --flows streams, --repeats runs of --duration), sockperf
under a bulk stream (--latency). Cilium's needs sch_fq, which this VM's
kernel lacks: its rows are skipped with the reason here, and run in a guest
(--guest 6.12; the Cilium agents compile their datapath there, emulated:
allow ~45 minutes). --rates, --flows (one value), --duration, --repeats,
--ingress, --latency, --guest and --out apply.`,
		Example: `  sluice-lab bench bandwidth --rates 10M,200M --contenders sluice,tbf-cni,htb
  sluice-lab bench bandwidth --guest 6.12 --rates 10M --contenders edt-fq,tbf-cni,htb --flows 1 --cc cubic --udp=false
  sluice-lab bench bandwidth --guest 6.12 --dataplanes sluice,cilium --rates 10M,50M`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			for _, s := range rates {
				r, err := bandwidth.ParseRate(s)
				if err != nil {
					return fmt.Errorf("--rates: %w", err)
				}
				cfg.Rates = append(cfg.Rates, r)
			}
			if len(dataplanes) > 0 {
				return bandwidthLab(cmd, lcfg, dataplanes, cfg, guest, out, jsonStdout)
			}
			if guest != "" {
				report, err := bandwidthInGuest(cmd, guest)
				if report == nil {
					return err
				}
				return writeBenchReport(cmd, report, err, out)
			}
			cfg.Progress = cmd.ErrOrStderr()
			report, runErr := bench.RunBandwidth(cmd.Context(), cfg)
			if report == nil {
				return runErr
			}
			if jsonStdout {
				return errors.Join(runErr, json.NewEncoder(cmd.OutOrStdout()).Encode(report))
			}
			return writeBenchReport(cmd, report, runErr, out)
		},
	}
	f := cmd.Flags()
	f.StringSliceVar(&rates, "rates", rates, "limits, as the annotation gives them")
	f.StringSliceVar(&cfg.Contenders, "contenders", cfg.Contenders, "contenders, in run order")
	f.IntSliceVar(&cfg.Flows, "flows", cfg.Flows, "TCP streams per run")
	f.StringSliceVar(&cfg.CCs, "cc", cfg.CCs, "TCP congestion controls")
	f.BoolVar(&cfg.UDP, "udp", cfg.UDP, "also UDP at twice the rate")
	f.BoolVar(&cfg.Ingress, "ingress", cfg.Ingress, "also limit and measure the Pod's ingress")
	f.BoolVar(&cfg.Latency, "latency", cfg.Latency, "also measure latency under load (sockperf)")
	f.BoolVar(&cfg.Pin, "pin", cfg.Pin, "under the latency probe, run the bulk stream on the first CPU and the probe on the last, so the probe measures the limiter's queue and not a shared CPU")
	f.DurationVar(&cfg.Duration, "duration", cfg.Duration, "length of one iperf3 run")
	f.StringVar(&out, "out", "results/bandwidth", "directory for the JSON results")
	f.StringSliceVar(&dataplanes, "dataplanes", nil, "the lab mode: these dataplanes' own bandwidth managers (sluice, cilium), each in a lab of its own, driven by the Pod's annotations")
	f.IntVar(&lcfg.Repeats, "repeats", lcfg.Repeats, "the lab mode: iperf3 runs per row")
	f.StringVar(&guest, "guest", "", `run inside this Debian kernel under QEMU ("6.12", "6.1"): one with sch_fq for edt-fq`)
	f.BoolVar(&jsonStdout, "json-stdout", false, "print the report as JSON on stdout and write no files (what --guest runs in the guest)")
	_ = f.MarkHidden("json-stdout")
	return cmd
}

// bandwidthInGuest runs this command with the same flags inside kernel
// spec and returns the report the guest printed, its kernel labelled with
// the accelerator.
func bandwidthInGuest(cmd *cobra.Command, spec string) (*bench.BandwidthReport, error) {
	var report bench.BandwidthReport
	accel, err := benchInGuest(cmd, spec, []string{"bench", "bandwidth", "--json-stdout"}, []string{"guest", "out", "json-stdout"}, nil, 0, &report)
	if accel == "" {
		return nil, err
	}
	report.Kernel += " (" + accel + ")"
	return &report, err
}

// bandwidthLab is the lab mode (--dataplanes): here, or in a guest with
// --guest, whose report the host prints and writes.
func bandwidthLab(cmd *cobra.Command, lcfg bench.BandwidthLabConfig, dataplanes []string, cfg bench.BandwidthConfig, guest, out string, jsonStdout bool) error {
	for _, name := range []string{"contenders", "cc", "udp", "pin"} {
		if cmd.Flags().Changed(name) {
			return fmt.Errorf("--%s: the standalone mode's; with --dataplanes (the lab mode) it does not apply", name)
		}
	}
	if len(cfg.Flows) != 1 && cmd.Flags().Changed("flows") {
		return fmt.Errorf("--flows %v: the lab mode takes one stream count", cfg.Flows)
	}
	if cmd.Flags().Changed("flows") {
		lcfg.Flows = cfg.Flows[0]
	}
	if !cmd.Flags().Changed("rates") {
		cfg.Rates = cfg.Rates[:2] // 10M and 50M: what an emulated guest carries
	}
	lcfg.Dataplanes, lcfg.Rates, lcfg.Duration, lcfg.Ingress, lcfg.Latency = dataplanes, cfg.Rates, cfg.Duration, cfg.Ingress, cfg.Latency
	if err := lcfg.Validate(); err != nil {
		return err
	}
	if guest != "" {
		var report bench.BandwidthLabReport
		accel, err := benchInGuest(cmd, guest, []string{"bench", "bandwidth", "--json-stdout"}, []string{"guest", "out", "json-stdout"}, nil, 8192, &report)
		if accel == "" {
			return err
		}
		report.Kernel += " (" + accel + ")"
		return writeBenchReport(cmd, &report, err, out)
	}
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	lcfg.Exe, lcfg.AgentBin, lcfg.Progress = exe, filepath.Join(filepath.Dir(exe), "sluice-agent"), cmd.ErrOrStderr()
	report, runErr := bench.RunBandwidthLab(cmd.Context(), lcfg)
	if report == nil {
		return runErr
	}
	if jsonStdout {
		return errors.Join(runErr, json.NewEncoder(cmd.OutOrStdout()).Encode(report))
	}
	return writeBenchReport(cmd, report, runErr, out)
}
