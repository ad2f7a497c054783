package cli

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/sluice-dataplane/sluice/internal/dnsecho"
	"github.com/sluice-dataplane/sluice/internal/dnsscale"
)

// DNSCommand is `sluice dns` (and `sluice-lab dns`): tools around cluster DNS.
func DNSCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "dns",
		Short: "Cluster DNS tools: the autoscaler's replica calculator, the DNS echo server",
	}
	cmd.AddCommand(dnsReplicasCommand(), dnsEchoCommand())
	return cmd
}

// dnsEchoCommand is `sluice dns echo`: the multi-core DNS study's echo
// server (internal/dnsecho).
func dnsEchoCommand() *cobra.Command {
	c := dnsecho.Config{Processes: 1, Threads: 1, Model: dnsecho.ModelBlocking}
	var listen, cpus string
	cmd := &cobra.Command{
		Use:   "echo",
		Short: "DNS echo server: answers every query with itself, QR and RA set; processes, threads, I/O model, SO_REUSEPORT, CPU pinning",
		Long: `Answers any DNS query by sending it back with QR and RA set, as the
multi-core DNS study's server does, to measure what each way of serving
costs (sluice-lab bench dns). --processes N runs N processes (this one and N-1
re-executed children), each with --threads M OS threads; each thread runs
the --model loop on a raw socket with its own system calls, never Go's
netpoller: blocking (recvfrom/sendto), select, poll, epoll (readiness, then
recvfrom until EAGAIN) or recvmmsg (up to 64 datagrams per call, answers
in one sendmmsg). --reuseport gives every thread its own socket, else all
share one. --cpus pins thread t of process p to the (p*M+t)-th CPU of the
list. Datagrams shorter than a header, or responses, are dropped and
counted. On SIGINT or SIGTERM it prints the counters of all processes as
JSON: answered, dropped, errors.`,
		Example: `  sluice dns echo --listen 0.0.0.0:5353 --processes 2 --model epoll --reuseport --cpus 0,1`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ap, err := netip.ParseAddrPort(listen)
			if err != nil {
				return fmt.Errorf("--listen %q: want ADDR:PORT ([::]:53 for IPv6 and IPv4): %w", listen, err)
			}
			c.Listen = ap
			if c.CPUs, err = dnsecho.ParseCPUs(cpus); err != nil {
				return err
			}
			exe, err := os.Executable()
			if err != nil {
				return err
			}
			return dnsecho.Run(cmd.Context(), c, exe, os.Args[1:], cmd.OutOrStdout())
		},
	}
	f := cmd.Flags()
	f.StringVar(&listen, "listen", "0.0.0.0:53", "address and port ([::]:53 takes IPv6 and IPv4)")
	f.IntVar(&c.Processes, "processes", c.Processes, "processes")
	f.IntVar(&c.Threads, "threads", c.Threads, "threads per process")
	f.StringVar(&c.Model, "model", c.Model, "I/O model: "+strings.Join(dnsecho.Models, ", "))
	f.BoolVar(&c.ReusePort, "reuseport", false, "a socket per thread (SO_REUSEPORT) instead of one shared")
	f.StringVar(&cpus, "cpus", "", "CPUs to pin threads to, round robin: 0,2,4-7")
	f.IntVar(&c.Buffer, "buffer", 0, "socket receive and send buffers, bytes (the study: 16777216; 0: the kernel's default)")
	return cmd
}

// dnsReplicasOutput is `sluice dns replicas -o json`.
type dnsReplicasOutput struct {
	dnsscale.Decision
	Params any                    `json:"params"`
	Input  dnsscale.ClusterStatus `json:"input"`
}

func dnsReplicasCommand() *cobra.Command {
	var (
		rawParams, mode, output string
		status                  dnsscale.ClusterStatus
	)
	cmd := &cobra.Command{
		Use:   "replicas",
		Short: "Replicas sluice-dns-autoscaler (and cluster-proportional-autoscaler) give for a cluster size",
		Long: `Computes the replica count for the given params and cluster size, and how
it was reached, with the arithmetic of sluice-dns-autoscaler.

--params takes the value stored under the ConfigMap's "linear" or "ladder"
key (or the whole {"linear": {...}} object of --default-params); the mode
follows from its fields unless --mode says. Invalid params exit non-zero
with the controller's error. --schedulable-nodes and --schedulable-cores
default to --nodes and --cores.`,
		Example: `  sluice dns replicas --params '{"coresPerReplica":256,"nodesPerReplica":16,"preventSinglePointFailure":true}' --nodes 40 --cores 160
  sluice dns replicas --params '{"nodesToReplicas":[[0,1],[6,2],[50,4]]}' --nodes 60 --cores 240 -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if output != "text" && output != "json" {
				return fmt.Errorf("-o %q: want text or json", output)
			}
			f := cmd.Flags()
			if !f.Changed("schedulable-nodes") {
				status.SchedulableNodes = status.TotalNodes
			}
			if !f.Changed("schedulable-cores") {
				status.SchedulableCores = status.TotalCores
			}
			if err := checkCounts(status); err != nil {
				return err
			}
			params, err := calculatorParams(rawParams, mode)
			if err != nil {
				return err
			}
			d := params.Replicas(status)
			w := cmd.OutOrStdout()
			if output == "json" {
				out := dnsReplicasOutput{Decision: d, Input: status, Params: params.Linear}
				if params.Ladder != nil {
					out.Params = params.Ladder
				}
				enc := json.NewEncoder(w)
				enc.SetIndent("", "  ")
				enc.SetEscapeHTML(false)
				return enc.Encode(out)
			}
			fmt.Fprintf(w, "replicas: %d\n", d.Replicas)
			fmt.Fprintf(w, "mode: %s\n", d.Mode)
			for _, s := range d.Steps {
				fmt.Fprintf(w, "  %s\n", s)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&rawParams, "params", "", `params JSON, e.g. '{"coresPerReplica":256,"nodesPerReplica":16}'`)
	f.StringVar(&mode, "mode", "", "linear or ladder (default: from the params' fields)")
	f.Int64Var(&status.TotalNodes, "nodes", 0, "nodes in the cluster")
	f.Int64Var(&status.TotalCores, "cores", 0, "allocatable cores in the cluster")
	f.Int64Var(&status.SchedulableNodes, "schedulable-nodes", 0, "schedulable nodes: not cordoned, Ready (default --nodes)")
	f.Int64Var(&status.SchedulableCores, "schedulable-cores", 0, "cores of the schedulable nodes (default --cores)")
	f.StringVarP(&output, "output", "o", "text", "text or json")
	_ = cmd.MarkFlagRequired("params")
	_ = cmd.MarkFlagRequired("nodes")
	_ = cmd.MarkFlagRequired("cores")
	return cmd
}

func checkCounts(s dnsscale.ClusterStatus) error {
	var errs []error
	for _, c := range []struct {
		flag string
		v    int64
	}{{"nodes", s.TotalNodes}, {"cores", s.TotalCores}, {"schedulable-nodes", s.SchedulableNodes}, {"schedulable-cores", s.SchedulableCores}} {
		if c.v < 0 {
			errs = append(errs, fmt.Errorf("--%s=%d: must not be negative", c.flag, c.v))
		}
	}
	if s.SchedulableNodes > s.TotalNodes {
		errs = append(errs, fmt.Errorf("--schedulable-nodes=%d: more than --nodes=%d", s.SchedulableNodes, s.TotalNodes))
	}
	if s.SchedulableCores > s.TotalCores {
		errs = append(errs, fmt.Errorf("--schedulable-cores=%d: more than --cores=%d", s.SchedulableCores, s.TotalCores))
	}
	return errors.Join(errs...)
}

// calculatorParams parses --params as the controller parses the ConfigMap
// value, so both give the same error for the same params.
func calculatorParams(raw, mode string) (dnsscale.Params, error) {
	m := dnsscale.Mode(mode)
	switch m {
	case "", dnsscale.ModeLinear, dnsscale.ModeLadder:
	default:
		return dnsscale.Params{}, fmt.Errorf("--mode=%s: want linear or ladder", mode)
	}
	detected, inner, err := dnsscale.DetectMode([]byte(raw))
	switch {
	case err == nil && m == "":
		m = detected
	case err == nil && string(inner) != raw && detected != m:
		return dnsscale.Params{}, fmt.Errorf("--mode=%s: the params are wrapped in %q", mode, detected)
	case err == nil:
		// --mode given and agrees, or overrides field-based detection.
	case m == "":
		return dnsscale.Params{}, err
	default:
		inner = []byte(raw) // --mode given: let the parser name what is wrong
	}
	return dnsscale.ParseParams(m, inner)
}
