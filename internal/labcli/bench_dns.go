package labcli

import (
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"

	"github.com/sluice-dataplane/sluice/internal/bench"
	"github.com/sluice-dataplane/sluice/internal/dnsecho"
	"github.com/sluice-dataplane/sluice/internal/lab"
)

// benchDNSCommand is `sluice-lab bench dns`: the multi-core DNS study's
// sweeps against the echo server in the lab.
func benchDNSCommand() *cobra.Command {
	cpus := bench.AllowedCPUs()
	cfg := bench.DNSConfig{
		Sweeps:       bench.DNSSweeps,
		MaxProcesses: len(cpus) + 2,
		Models:       dnsecho.Models,
		Clients:      8,
		Outstanding:  500,
		Duration:     30 * time.Second,
		Runs:         10,
		Dataplane:    lab.DataplaneNone,
		CPUs:         cpus,
		Buffer:       16 << 20,
		Prefix:       "sluice-dns-",
	}
	svc := bench.DNSServiceConfig{
		Dataplanes:  []string{lab.DataplaneSluice, lab.DataplaneKubeProxyIPTables, lab.DataplaneKubeProxyNFTables},
		Servers:     bench.DNSServers,
		Replicas:    []int{1, 2, 4},
		Duration:    10 * time.Second,
		Runs:        3,
		Clients:     8,
		Outstanding: 100,
		Lookups:     2000,
		Resolvers:   8,
		Timeout:     2 * time.Second,
		Prefix:      "sluice-dnssvc-",
	}
	var out string
	var short, throughService bool
	cmd := &cobra.Command{
		Use:   "dns",
		Short: "The multi-core DNS study: echo server throughput by processes, I/O model, CPU pinning and packet steering (dnsperf)",
		Long: `A lab of 2 nodes × 1 pod: "sluice dns echo" in node1's pod, Debian's dnsperf
(-c 8 -q 500, the study's settings) in node2's pod, by Pod IP. Sweeps:

  processes  1 to --max-processes processes, blocking I/O, one shared socket
  models     one process with each I/O model (blocking, select, poll, epoll, recvmmsg)
  pin        one process pinned to each CPU in turn
  pairs      two processes pinned to each pair of CPUs (and both on one)
  rps        RPS on the server pod's eth0 steering packets to one CPU (or off),
             with one process pinned to each CPU: the veth's stand-in for the
             study's NIC IRQ affinity

With --through-service: cluster DNS instead. CoreDNS (scripts/coredns-build.sh)
in 4 lab pods behind the kube-dns ClusterIP, the real kube-apiserver, and
each of --dataplanes in turn: dnsperf from a pod on every node at once to the
VIP with 1, 2 and 4 replicas serving (QPS, lost); lookups as glibc makes them
(A and AAAA at once from one new UDP socket, the conntrack race behind
Kubernetes' 5-second DNS timeouts), counting answers that never come; and a
replica deleted while lookups run. Then the echo rows: sluice's echo server
in the same pods behind a second Service, dnsperf again: a server that costs
next to nothing, so that what the dataplanes cost shows (--servers). kube-proxy needs ./scripts/k8s-build.sh
(else it is reported as skipped).

Each point is --runs dnsperf runs of --duration (default 10 × 30 s, as the
study; --short: 3 × 5 s and max processes = CPUs). Reports QPS min, mean and
max, dnsperf's average and maximum latency, lost queries and the CPUs that
handled the receive softirqs. JSON, Markdown and a plot per sweep under --out.
The load generator shares this machine's CPUs with the server: pin it with
--client-cpus to keep it off the server's. Needs root and dnsperf
(scripts/deps.sh).`,
		Example: `  sluice-lab bench dns --short
  sluice-lab bench dns --sweeps processes,models --runs 5 --duration 10s
  sluice-lab bench dns --sweeps pin,rps --client-cpus 1`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			f := cmd.Flags()
			exe, err := os.Executable()
			if err != nil {
				return err
			}
			if throughService {
				if short {
					svc.Runs, svc.Duration = 1, 5*time.Second
					if !f.Changed("lookups") {
						svc.Lookups = 500
					}
				}
				// --runs, --duration, --clients and --outstanding are
				// shared with the echo study.
				if f.Changed("runs") {
					svc.Runs = cfg.Runs
				}
				if f.Changed("duration") {
					svc.Duration = cfg.Duration
				}
				if f.Changed("clients") {
					svc.Clients = cfg.Clients
				}
				if f.Changed("outstanding") {
					svc.Outstanding = cfg.Outstanding
				}
				svc.Exe, svc.AgentBin, svc.Progress = exe, filepath.Join(filepath.Dir(exe), "sluice-agent"), cmd.ErrOrStderr()
				report, runErr := bench.RunDNSService(cmd.Context(), svc)
				if report == nil {
					return runErr
				}
				return writeBenchReport(cmd, report, runErr, out)
			}
			if short {
				if !f.Changed("runs") {
					cfg.Runs = 3
				}
				if !f.Changed("duration") {
					cfg.Duration = 5 * time.Second
				}
				if !f.Changed("max-processes") {
					cfg.MaxProcesses = len(cpus)
				}
			}
			cfg.Exe = exe
			cfg.AgentBin = filepath.Join(filepath.Dir(exe), "sluice-agent")
			cfg.Progress = cmd.ErrOrStderr()
			report, runErr := bench.RunDNS(cmd.Context(), cfg)
			if report == nil {
				return runErr
			}
			return writeBenchReport(cmd, report, runErr, out)
		},
	}
	f := cmd.Flags()
	f.StringSliceVar(&cfg.Sweeps, "sweeps", cfg.Sweeps, "sweeps, in run order")
	f.IntVar(&cfg.MaxProcesses, "max-processes", cfg.MaxProcesses, "the processes sweep's last point (default: CPUs + 2)")
	f.StringSliceVar(&cfg.Models, "models", cfg.Models, "I/O models of the models sweep")
	f.IntVar(&cfg.Clients, "clients", cfg.Clients, "dnsperf -c: clients dnsperf acts as")
	f.IntVar(&cfg.Outstanding, "outstanding", cfg.Outstanding, "dnsperf -q: queries outstanding")
	f.DurationVar(&cfg.Duration, "duration", cfg.Duration, "dnsperf -l: length of each run (whole seconds)")
	f.IntVar(&cfg.Runs, "runs", cfg.Runs, "runs per point (min, mean, max)")
	f.BoolVar(&short, "short", false, "3 runs of 5 s per point, processes up to the CPUs (unless given)")
	f.StringVar(&cfg.ClientCPUs, "client-cpus", "", "taskset -c for dnsperf, e.g. 1")
	f.IntVar(&cfg.Buffer, "buffer", cfg.Buffer, "socket buffers of the server and dnsperf, bytes (the study's 16 MiB; 0: the kernel's defaults)")
	f.StringVar(&cfg.Dataplane, "dataplane", cfg.Dataplane, "the lab's dataplane (the path is Pod to Pod by IP)")
	f.StringVar(&out, "out", "results/dns", "results directory")
	f.BoolVar(&throughService, "through-service", false, "cluster DNS through the kube-dns VIP: CoreDNS replicas, sluice vs kube-proxy")
	f.StringSliceVar(&svc.Dataplanes, "dataplanes", svc.Dataplanes, "--through-service: dataplanes, in run order")
	f.StringSliceVar(&svc.Servers, "servers", svc.Servers, "--through-service: servers behind the VIP, in turn: coredns, echo (sluice dns echo in the same pods, behind a second Service: the dataplane's share)")
	f.IntSliceVar(&svc.Replicas, "replicas", svc.Replicas, "--through-service: replicas serving, in turn (1..4)")
	f.IntVar(&svc.Lookups, "lookups", svc.Lookups, "--through-service: A+AAAA lookups per client pod")
	f.IntVar(&svc.Resolvers, "resolvers", svc.Resolvers, "--through-service: lookups at once per client pod")
	f.DurationVar(&svc.Timeout, "timeout", svc.Timeout, "--through-service: an answer later than this counts as lost")
	return cmd
}
