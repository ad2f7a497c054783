package labcli

import (
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"

	"github.com/sluice-dataplane/sluice/internal/bench"
)

func benchClusterCommand() *cobra.Command {
	cfg := bench.DefaultClusterConfig()
	var out, output string
	cmd := &cobra.Command{
		Use:   "cluster",
		Short: "A big cluster's shape against the real kube-apiserver: 5,000 Nodes, 10,000 Services, big Services, churn; sluice vs kube-proxy",
		Long: `For each dataplane in turn, on the scale study's lab (real kube-apiserver,
3 nodes, echo pods on node1 and node2, the client pod on node3): --nodes
simulated Node objects with their Leases (each reports its status every
--status-period and renews its Lease every --lease-period, as a kubelet at
its defaults), --services Services × 10 endpoints, one Service per
--big-services size with that many endpoints on the simulated Nodes, then
--churn-rate EndpointSlice changes a second for --churn, while the client
pod sends a request every 100 ms through a live Service and the client
node's /metrics is scraped every second.

Reported per dataplane: seconds to program the set, the client node's
agent (or kube-proxy) RSS; one change of each big Service (trigger time →
maps or rules); over the churn: changes programmed, latency p50/p99 and the
highest bucket from the dataplane's own network programming histogram, CPU
cores, max RSS, bytes read a second, syncs, failed requests. Writes
results.json, results.md and plots (RSS and CPU during the churn) under
--out. Needs root, kube-apiserver and kube-proxy (./scripts/k8s-build.sh)
and etcd. The full shape takes about 30 minutes a dataplane on 2 cores.`,
		Example: `  sluice-lab bench cluster                           # the full shape: 5,000 Nodes, 10,000 Services, 10 min of churn
  sluice-lab bench cluster --nodes 500 --services 1000 --big-services 1000 --churn 1m --dataplanes sluice,kube-proxy-iptables`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if output != "table" && output != "json" {
				return fmt.Errorf("-o %q: want table or json", output)
			}
			if out == "" {
				out = filepath.Join("results", "cluster-"+time.Now().UTC().Format("20060102-150405"))
			}
			cfg.Progress = cmd.ErrOrStderr()
			cfg.LogDir = filepath.Join(out, "logs")
			report, runErr := bench.RunCluster(cmd.Context(), cfg)
			if report == nil {
				return runErr
			}
			if output == "json" {
				_, err := report.WriteFiles(out)
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				return errors.Join(runErr, err, enc.Encode(report))
			}
			return writeBenchReport(cmd, report, runErr, out)
		},
	}
	f := cmd.Flags()
	f.StringSliceVar(&cfg.Dataplanes, "dataplanes", cfg.Dataplanes, "contenders, in run order")
	f.IntVar(&cfg.Nodes, "nodes", cfg.Nodes, "simulated Node objects besides the lab's 3")
	f.IntVar(&cfg.Services, "services", cfg.Services, "Services of 10 endpoints")
	f.IntSliceVar(&cfg.BigServices, "big-services", cfg.BigServices, "endpoint counts of one big Service each")
	f.Float64Var(&cfg.ChurnRate, "churn-rate", cfg.ChurnRate, "EndpointSlice changes a second during the churn")
	f.DurationVar(&cfg.Churn, "churn", cfg.Churn, "how long the churn runs")
	f.DurationVar(&cfg.StatusPeriod, "status-period", cfg.StatusPeriod, "each simulated Node's status report period (0: none)")
	f.DurationVar(&cfg.LeasePeriod, "lease-period", cfg.LeasePeriod, "each simulated Node's Lease renewal period (0: none)")
	f.DurationVar(&cfg.StepTimeout, "step-timeout", cfg.StepTimeout, "limit of each wait for a dataplane")
	f.StringVar(&out, "out", "", "results directory (default results/cluster-<UTC timestamp>)")
	f.StringVarP(&output, "output", "o", "table", "stdout format: table or json")
	return cmd
}
