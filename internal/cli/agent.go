package cli

import (
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/sluice-dataplane/sluice/internal/api"
)

// agentOptions are the flags shared by the commands that ask the agent.
type agentOptions struct {
	socket string
	output string
}

func (o *agentOptions) addFlags(cmd *cobra.Command) {
	def := os.Getenv("SLUICE_API_SOCKET")
	if def == "" {
		def = api.DefaultSocket
	}
	cmd.PersistentFlags().StringVar(&o.socket, "api-socket", def, "the agent's API socket (default $SLUICE_API_SOCKET, else "+api.DefaultSocket+")")
	cmd.PersistentFlags().StringVarP(&o.output, "output", "o", "table", "output format: table or json")
}

// client checks the output flag and returns a client for the agent.
func (o *agentOptions) client() (*api.Client, error) {
	if o.output != "table" && o.output != "json" {
		return nil, fmt.Errorf("--output=%s: want table or json", o.output)
	}
	return api.NewClient(o.socket), nil
}

// agentCommands returns the commands that query a running sluice-agent.
func agentCommands() []*cobra.Command {
	return []*cobra.Command{statusCommand(), serviceCommand(), bpfCommand(), monitorCommand()}
}

func statusCommand() *cobra.Command {
	var o agentOptions
	var ready bool
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show the agent's state: source, kernel features, attach points, map fill, last sync",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := o.client()
			if err != nil {
				return err
			}
			st, err := c.Status(cmd.Context())
			if err != nil {
				return err
			}
			if ready {
				if err := st.Serving(); err != nil {
					return fmt.Errorf("not ready: %w", err)
				}
				fmt.Fprintln(cmd.OutOrStdout(), "ready: synced and attached")
				return nil
			}
			if o.output == "json" {
				return writeJSON(cmd.OutOrStdout(), st)
			}
			return writeStatus(cmd.OutOrStdout(), st)
		},
	}
	o.addFlags(cmd)
	cmd.Flags().BoolVar(&ready, "ready", false,
		"only say whether the agent serves (synced once, programs attached): exit 0 if so, 1 with what is missing (the chart's readiness probe)")
	return cmd
}

func serviceCommand() *cobra.Command {
	var o agentOptions
	cmd := &cobra.Command{Use: "service", Short: "Services the agent installed"}
	o.addFlags(cmd)
	cmd.AddCommand(&cobra.Command{
		Use:   "list",
		Short: "List installed frontends with their backends",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := o.client()
			if err != nil {
				return err
			}
			svcs, err := c.Services(cmd.Context())
			if err != nil {
				return err
			}
			if o.output == "json" {
				return writeJSON(cmd.OutOrStdout(), svcs)
			}
			return writeServices(cmd.OutOrStdout(), svcs)
		},
	})
	return cmd
}

func bpfCommand() *cobra.Command {
	var o agentOptions
	cmd := &cobra.Command{Use: "bpf", Short: "Raw contents of the BPF maps"}
	o.addFlags(cmd)
	lb := &cobra.Command{Use: "lb", Short: "The load balancer maps"}
	lb.AddCommand(&cobra.Command{
		Use:   "list",
		Short: "Dump lb_services, lb_backends, lb_rev_nat and lb_node_ips",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := o.client()
			if err != nil {
				return err
			}
			d, err := c.BPFLB(cmd.Context())
			if err != nil {
				return err
			}
			if o.output == "json" {
				return writeJSON(cmd.OutOrStdout(), d)
			}
			return writeBPFLB(cmd.OutOrStdout(), d)
		},
	})
	cmd.AddCommand(lb)
	ct := &cobra.Command{Use: "ct", Short: "The conntrack map of the tc/XDP load balancer"}
	ct.AddCommand(&cobra.Command{
		Use:   "list",
		Short: "Dump ct: tuple, direction, flags, backend, rev NAT, lifetime left, packets/bytes",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := o.client()
			if err != nil {
				return err
			}
			d, err := c.BPFCT(cmd.Context())
			if err != nil {
				return err
			}
			if o.output == "json" {
				return writeJSON(cmd.OutOrStdout(), d)
			}
			return writeBPFCT(cmd.OutOrStdout(), d)
		},
	})
	nat := &cobra.Command{Use: "nat", Short: "The SNAT map of the tc/XDP load balancer"}
	nat.AddCommand(&cobra.Command{
		Use:   "list",
		Short: "Dump snat: tuple, direction, translation, age",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := o.client()
			if err != nil {
				return err
			}
			d, err := c.BPFNAT(cmd.Context())
			if err != nil {
				return err
			}
			if o.output == "json" {
				return writeJSON(cmd.OutOrStdout(), d)
			}
			return writeBPFNAT(cmd.OutOrStdout(), d)
		},
	})
	cmd.AddCommand(ct, nat, bpfBandwidthCommand(&o))
	return cmd
}

// writeBPFCT prints one row per conntrack entry, like `cilium bpf ct list`.
func writeBPFCT(w io.Writer, d *api.BPFCT) error {
	tw := NewTable(w)
	fmt.Fprintln(tw, "TUPLE\tDIRECTION\tFLAGS\tBACKEND\tREVNAT\tLIFETIME\tPACKETS/BYTES\tREPLY PACKETS/BYTES")
	for _, e := range d.Entries {
		flags := strings.Join(e.Flags, "|")
		if e.ClientPort != 0 { // the port given, or the client's own
			flags = strings.Replace(flags, "SPORT", fmt.Sprintf("SPORT=%d", e.ClientPort), 1)
		}
		if flags == "" {
			flags = "-"
		}
		be := e.NAT
		if e.BackendID != 0 {
			be = fmt.Sprintf("%d (%s)", e.BackendID, e.NAT)
		}
		life := fmt.Sprintf("%ds", e.Remaining)
		if e.Remaining < 0 {
			life = "expired"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\t%d/%d\t%d/%d\n", e.Tuple, e.Direction, flags, be, e.RevNatID, life,
			e.Packets, e.Bytes, e.RxPackets, e.RxBytes)
	}
	return tw.Flush()
}

// writeBPFNAT prints one row per SNAT mapping.
func writeBPFNAT(w io.Writer, d *api.BPFNAT) error {
	tw := NewTable(w)
	fmt.Fprintln(tw, "TUPLE\tDIRECTION\tTRANSLATED TO\tAGE\tFLOW")
	for _, e := range d.Entries {
		flow := "established"
		if e.New {
			flow = "new"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%ds\t%s\n", e.Tuple, e.Direction, e.To, e.Age, flow)
	}
	return tw.Flush()
}

// writeNorthSouth prints the tc/XDP section, like the KubeProxyReplacement
// details of `cilium status`.
func writeNorthSouth(tw io.Writer, line func(k, format string, args ...any), ns *api.NorthSouth) {
	if ns == nil {
		return // an agent from before the north-south datapath
	}
	if ns.PerPacket {
		var pods []string
		for _, d := range ns.PodDevices {
			pods = append(pods, cmp.Or(d.Name, fmt.Sprintf("ifindex %d", d.Ifindex)))
		}
		line("PerPacketLB", "Enabled (%s)\ton %d pod veths: [%s]", cmp.Or(ns.PerPacketFlag, "--socket-lb=false"), len(pods), strings.Join(pods, ", "))
	}
	if !ns.Enabled {
		line("NorthSouth", "Disabled (no --devices)")
		return
	}
	var devs []string
	for _, d := range ns.Devices {
		xdp := "no XDP"
		if d.XDP != "" && d.XDP != "disabled" {
			xdp = "XDP " + d.XDP
		}
		devs = append(devs, fmt.Sprintf("%s (%s, %s)", d.Name, d.TC, xdp))
	}
	if len(devs) == 0 {
		devs = []string{"not attached yet"}
	}
	line("NorthSouth", "Enabled\t[%s]", strings.Join(devs, ", "))
	line("  Mode", "%s", strings.ToUpper(ns.Mode))
	if ns.SNATPorts != "" {
		line("  NAT ports", "%s", ns.SNATPorts)
	}
	if ns.SNATPortsPerBackend > 0 {
		line("  SNAT ports", "%s", snatPortsLine(ns))
	}
	for _, src := range ns.SNATSources {
		line("  SNAT source", "%s through %s (%d routes: the device's source, as MASQUERADE takes it)", src.Source, src.Device, src.Prefixes)
	}
	if ns.Mode == "dsr" || ns.Mode == "hybrid" {
		fb := "every remote backend's node is known"
		if ns.DSRSNATFallback > 0 {
			fb = fmt.Sprintf("%d backends on unknown nodes use SNAT: %s", ns.DSRSNATFallback, strings.Join(ns.DSRSNATFallbackExamples, ", "))
		}
		line("  DSR", "%d tunnel entries; %s", ns.DSRTunnels, fb)
		if ns.DSRDispatch != "" {
			line("  DSR dispatch", "%s", dsrDispatchLine(ns))
		}
		if ns.DSRGRO != "" {
			line("  DSR GRO", "%s", ns.DSRGRO)
		}
	}
	alg := "Random"
	if ns.Algorithm == "maglev" {
		alg = "Maglev"
	}
	line("  Backend selection", "%s (Maglev table size: %d)", alg, ns.MaglevTableSize)
	if seed := maglevSeedLine(ns.MaglevSeedSource); seed != "" {
		line("  Maglev seed", "%s", seed)
	}
	line("  XDP acceleration", "%s", ns.Acceleration)
	switch ns.LocalDelivery {
	case "stack":
		line("  Local delivery", "through the host's stack (--local-delivery=stack): its FORWARD chain (NetworkPolicy engines), rp_filter and the pod veth's qdisc apply to Service traffic into local pods")
	case "peer":
		line("  Local delivery", "bpf_redirect_peer on tc (--local-delivery=peer): faster, but Service traffic into local pods bypasses the host's FORWARD chain (NetworkPolicy engines there; a stateful one drops the pods' replies as INVALID), rp_filter and the veth's qdisc; XDP hands it to the stack")
	}
	if ns.NetfilterHandoff != "" {
		line("  Netfilter handoff", "%s; %d packets of flows netfilter's conntrack already tracked (kube-proxy's) left to it",
			ns.NetfilterHandoff, ns.NetfilterHandoffPackets)
	}
	if ns.FlowCacheSets == 0 {
		line("  Flow cache", "Disabled (--bpf-lb-flow-cache-sets=0): every packet looks up conntrack")
	} else {
		line("  Flow cache", "%d sets × %d ways per CPU, established masqueraded flows for a CT second",
			ns.FlowCacheSets, ns.FlowCacheWays)
	}
	for _, d := range ns.Devices {
		var ids []string
		for _, id := range d.LinkIDs {
			ids = append(ids, fmt.Sprint(id))
		}
		how := "attached"
		if d.Replaced {
			how = "programs replaced in pinned links"
		}
		line("  "+d.Name, "ifindex %d, links %s, %s", d.Ifindex, strings.Join(ids, ","), how)
	}
	gc := ns.CTGC
	switch {
	case gc.Runs == 0:
		line("  CT garbage collection", "every %s, none yet", gc.Interval)
	case gc.Error != "":
		line("  CT garbage collection", "every %s, last %s ago FAILED: %s", gc.Interval, ago(gc.Last), gc.Error)
	default:
		line("  CT garbage collection", "every %s, %d runs, %d ct and %d nat entries deleted", gc.Interval, gc.Runs, gc.CTDeleted, gc.NATDeleted)
	}
	line("  Flow filter", "%s", flowFilterLine(gc.FlowFilter))
	for _, n := range ns.Notes {
		line("  Note", "%s", n)
	}
}

// flowFilterLine is the fill of each table's flow filter, e.g. "ct 0.8%,
// ct_new 0.1%, snat 0.8%, snat_new 0.1% of bits set", or why it is off.
func flowFilterLine(fill map[string]float64) string {
	if len(fill) == 0 {
		return "off: every new flow's lookup is made (until a collection rebuilds it: the first once every program of this agent runs, or after a new hash key)"
	}
	var parts []string
	for _, name := range []string{"ct", "ct_new", "snat", "snat_new"} {
		if f, ok := fill[name]; ok {
			parts = append(parts, fmt.Sprintf("%s %.1f%%", name, 100*f))
		} else {
			parts = append(parts, name+" off")
		}
	}
	return strings.Join(parts, ", ") + " of bits set (a new flow looks up a key its table lacks that often)"
}

// snatPortsLine is the nat ports each backend has and the busiest
// backend's share of them, e.g. "33512 per backend (1024-65535 less
// 30000-60999); busiest 198.18.2.10:8080/TCP 1203 (3.6%)".
func snatPortsLine(ns *api.NorthSouth) string {
	s := fmt.Sprintf("%d per backend (%s)", ns.SNATPortsPerBackend, ns.SNATPortRanges)
	switch {
	case len(ns.SNATPortsInUse) > 0:
		b := ns.SNATPortsInUse[0]
		return s + fmt.Sprintf("; busiest %s/%s %d (%.1f%%)", b.Backend, b.Proto, b.Ports,
			100*float64(b.Ports)/float64(ns.SNATPortsPerBackend))
	case ns.CTGC.Runs == 0:
		return s + "; in use: counted at the first CT garbage collection"
	}
	return s + "; none in use"
}

// maglevSeedLine says where the Maglev seed came from.
func maglevSeedLine(source string) string {
	switch source {
	case api.MaglevSeedFlag:
		return "--bpf-lb-maglev-hash-seed"
	case api.MaglevSeedKubeSystem:
		return "derived from the kube-system Namespace's UID (the same on every node of the cluster)"
	case api.MaglevSeedDefault:
		return "0, the default: nodes must agree; set --bpf-lb-maglev-hash-seed on every node, or give the manifests a kube-system Namespace"
	}
	return source
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// NewTable is the tab writer of every table the CLIs print.
func NewTable(w io.Writer) *tabwriter.Writer {
	return tabwriter.NewWriter(w, 0, 0, 3, ' ', 0)
}

// writeStatus prints one screen in the manner of `cilium status`.
func writeStatus(w io.Writer, st *api.Status) error {
	tw := NewTable(w)
	line := func(k, format string, args ...any) {
		fmt.Fprintf(tw, "%s:\t"+format+"\n", append([]any{k}, args...)...)
	}

	line("Node", "%s", st.NodeName)
	line("Version", "%s", st.Version)
	writeWarnings(tw, line, st.Warnings)
	health := "Ok"
	switch {
	case !st.Source.Synced:
		health = "Waiting for the initial list"
	case len(st.Source.FileErrors) > 0:
		health = fmt.Sprintf("Degraded: %d file(s) rejected, their last good objects in use", len(st.Source.FileErrors))
	}
	line("Source", "%s %s\t%s", st.Source.Kind, st.Source.Detail, health)
	for _, f := range sortedKeys(st.Source.FileErrors) {
		fmt.Fprintf(tw, "  %s\t%s\n", f, st.Source.FileErrors[f])
	}
	if len(st.Source.Objects) > 0 {
		var parts []string
		for _, k := range sortedKeys(st.Source.Objects) {
			parts = append(parts, fmt.Sprintf("%d %s", st.Source.Objects[k], k))
		}
		line("Objects", "%s", strings.Join(parts, ", "))
	}

	line("Kernel features", "")
	for _, f := range st.Features {
		mark := "yes"
		if !f.Available {
			mark = "no"
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\n", f.Name, mark, f.Detail)
	}

	if !st.SocketLB.Enabled {
		line("SocketLB", "Disabled")
	} else if len(st.SocketLB.AttachPoints) == 0 {
		line("SocketLB", "Enabled, not attached yet (cgroup %s)", st.SocketLB.Cgroup)
	} else if st.SocketLB.HostnsOnly {
		line("SocketLB", "Enabled for the node's namespace only (--socket-lb-hostns-only; pods per packet, so mesh sidecars see Service addresses), cgroup %s", st.SocketLB.Cgroup)
	} else {
		line("SocketLB", "Enabled, cgroup %s", st.SocketLB.Cgroup)
		var hooks []string
		for _, p := range st.SocketLB.AttachPoints {
			hooks = append(hooks, fmt.Sprintf("%s (link %d)", p.Hook, p.LinkID))
		}
		line("  Attach points", "%s", strings.Join(hooks, ", "))
	}

	writeNorthSouth(tw, line, st.NorthSouth)
	writeBandwidthManager(line, st.BandwidthManager)
	writeMonitor(line, st.Monitor)
	if st.HostPort != "" {
		line("HostPort", "%s", st.HostPort)
	}
	if st.UDPSocketTermination != "" {
		line("UDP sockets", "%s", st.UDPSocketTermination)
	}

	line("Services", "%d services, %d frontends, %d backends", st.Services, st.Frontends, st.Backends)
	if len(st.Maps) > 0 {
		line("BPF maps", "")
		for _, m := range st.Maps {
			pct := 0.0
			if m.Max > 0 {
				pct = 100 * float64(m.Entries) / float64(m.Max)
			}
			fmt.Fprintf(tw, "  %s\t%d/%d\t%.1f%%\n", m.Name, m.Entries, m.Max, pct)
		}
	}

	writeHealthCheck(tw, line, st.HealthCheck)

	switch {
	case st.Sync.Total == 0:
		line("Last sync", "none yet")
	case st.Sync.Error != "":
		line("Last sync", "%s ago, took %s, FAILED: %s", ago(st.Sync.Last), st.Sync.Duration, st.Sync.Error)
	case st.Sync.Skipped > 0:
		line("Last sync", "%s ago, took %s, OK, %d skipped (below)", ago(st.Sync.Last), st.Sync.Duration, st.Sync.Skipped)
	default:
		line("Last sync", "%s ago, took %s, OK", ago(st.Sync.Last), st.Sync.Duration)
	}
	line("Syncs", "%d total, %d failed", st.Sync.Total, st.Sync.Failed)
	writeSkipped(tw, line, st.Skipped)
	if len(st.ObjectErrors) > 0 {
		line("Object errors", "%d", len(st.ObjectErrors))
		for _, k := range sortedKeys(st.ObjectErrors) {
			fmt.Fprintf(tw, "  %s\t%s\n", k, st.ObjectErrors[k])
		}
	}
	if len(st.NotImplemented) > 0 {
		line("Not implemented yet", "%s (accepted, no effect)", strings.Join(st.NotImplemented, " "))
	}
	return tw.Flush()
}

// maxSkippedRows bounds the skipped objects status prints: a full map can
// skip thousands; -o json has them all.
const maxSkippedRows = 20

// writeSkipped prints the objects, or values of them, left out of the maps.
func writeSkipped(tw io.Writer, line func(k, format string, args ...any), ks []api.Skipped) {
	if len(ks) == 0 {
		return
	}
	line("Skipped", "%d (everything else is programmed)", len(ks))
	for i, k := range ks {
		if i == maxSkippedRows {
			fmt.Fprintf(tw, "  …\t%d more (sluice status -o json)\n", len(ks)-i)
			break
		}
		what := k.Object
		if k.Value != "" {
			what += " " + k.Value
		}
		// The reason leads: object names are long and would widen the
		// table's first column for every line of status.
		fmt.Fprintf(tw, "  %s\t%s: %s\n", k.Reason, what, k.Message)
	}
}

// writeWarnings prints what loses traffic or state unless someone acts,
// first, so that nobody scrolls past it.
func writeWarnings(tw io.Writer, line func(k, format string, args ...any), ws []api.Warning) {
	if len(ws) == 0 {
		return
	}
	line("Warnings", "%d", len(ws))
	for _, w := range ws {
		fmt.Fprintf(tw, "  %s\t%s\n", w.Subsystem, w.Message)
		if w.Fix != "" {
			fmt.Fprintf(tw, "  \t  fix: %s\n", w.Fix)
		}
	}
}

// writeHealthCheck prints the proxier health server and one row per
// Service health check server, as kube-proxy users look for them.
func writeHealthCheck(tw io.Writer, line func(k, format string, args ...any), hc *api.HealthCheck) {
	if hc == nil {
		return // an agent from before health checks
	}
	p := hc.Proxier
	health := "healthy"
	switch {
	case !p.Healthy:
		health = "UNHEALTHY: changes not synced in time"
	case !p.NodeEligible:
		health = "healthy, node not eligible (/healthz 503)"
	}
	switch {
	case p.Address == "":
		line("Proxy healthz", "Disabled")
	case p.Listening:
		line("Proxy healthz", "%s (/healthz, /livez), %s", p.Address, health)
	case p.Error != "":
		line("Proxy healthz", "NOT LISTENING: %s; %s", p.Error, health)
	default:
		line("Proxy healthz", "%s, starting; %s", p.Address, health)
	}
	line("Health check ports", "%d (Services with externalTrafficPolicy Local)", len(hc.Services))
	for _, s := range hc.Services {
		if s.Error != "" {
			fmt.Fprintf(tw, "  %d\t%s\t%d local endpoints\tFAILED: %s\n", s.Port, s.Service, s.LocalEndpoints, s.Error)
			continue
		}
		fmt.Fprintf(tw, "  %d\t%s\t%d local endpoints\t%s\n", s.Port, s.Service, s.LocalEndpoints, strings.Join(s.Addresses, ", "))
	}
}

func sortedKeys[V any](m map[string]V) []string {
	return slices.Sorted(maps.Keys(m))
}

func ago(t time.Time) string {
	return time.Since(t).Truncate(time.Millisecond).String()
}

// writeServices prints one row per backend, the frontend on its first row,
// like `cilium service list`.
func writeServices(w io.Writer, svcs []api.Service) error {
	tw := NewTable(w)
	fmt.Fprintln(tw, "ID\tFrontend\tService Type\tName\tFlags\tTraffic\tBackend")
	for _, s := range svcs {
		name := s.Name
		if name == "" {
			name = "(restored, unclaimed)"
		}
		flags := strings.Join(s.Flags, ",")
		if flags == "" {
			flags = "-"
		}
		head := fmt.Sprintf("%d\t%s\t%s\t%s\t%s\t%s", s.ID, s.Frontend, s.Type, name, flags, traffic(s.Traffic))
		if s.Skipped != "" {
			fmt.Fprintf(tw, "-\t%s\t%s\t%s\t%s\t-\t(SKIPPED, not programmed: %s)\n", s.Frontend, s.Type, name, flags, s.Skipped)
			continue
		}
		if len(s.Backends) == 0 {
			fmt.Fprintf(tw, "%s\t(no backends: connect refused)\n", head)
			continue
		}
		for i, b := range s.Backends {
			state := b.State
			if b.Local {
				state += ", local"
			}
			if b.Scope != "" {
				state += ", " + b.Scope
			}
			be := fmt.Sprintf("%d => %s (%s)", i+1, b.Address, state)
			if b.Pod != "" {
				be += " " + b.Pod
			}
			if b.Traffic != nil {
				// The backend's own, whichever frontend sent it.
				be += " [backend: " + traffic(b.Traffic) + "]"
			}
			if i == 0 {
				fmt.Fprintf(tw, "%s\t%s\n", head, be)
			} else {
				fmt.Fprintf(tw, "\t\t\t\t\t\t%s\n", be)
			}
		}
	}
	return tw.Flush()
}

// traffic is a frontend's or a backend's counters in a few characters:
// new flows, then packets and bytes through tc/XDP.
func traffic(t *api.Traffic) string {
	if t == nil {
		return "-"
	}
	return fmt.Sprintf("%d conns, %d pkts, %s", t.Conns, t.Packets, humanBytes(t.Bytes))
}

func humanBytes(n uint64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := uint64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}

// writeBPFLB prints the raw map contents, one table per map.
func writeBPFLB(w io.Writer, d *api.BPFLB) error {
	tw := NewTable(w)
	fmt.Fprintln(tw, "SERVICE ADDRESS\tSCOPE\tSLOT\tBACKEND ID\tCOUNT\tREVNAT\tFLAGS")
	for _, s := range d.Services {
		flags := strings.Join(s.Flags, ",")
		if flags == "" {
			flags = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%d\t%s\n", s.Frontend, s.Scope, s.Slot, s.BackendID, s.Count, s.RevNatID, flags)
	}
	fmt.Fprintln(tw)
	fmt.Fprintln(tw, "BACKEND ID\tADDRESS\tFLAGS")
	for _, b := range d.Backends {
		flags := strings.Join(b.Flags, ",")
		if flags == "" {
			flags = "-"
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\n", b.ID, b.Address, flags)
	}
	fmt.Fprintln(tw)
	fmt.Fprintln(tw, "REVNAT ID\tFRONTEND")
	for _, r := range d.RevNat {
		fmt.Fprintf(tw, "%d\t%s\n", r.ID, r.Address)
	}
	fmt.Fprintln(tw)
	fmt.Fprintln(tw, "NODE IP\tNODE")
	for _, ip := range d.NodeIPs {
		fmt.Fprintf(tw, "%s\tthis node\n", ip)
	}
	for _, ip := range d.NoNodePortIPs {
		fmt.Fprintf(tw, "%s\tthis node, no NodePorts (--nodeport-addresses)\n", ip)
	}
	for _, ip := range d.OtherNodeIPs {
		fmt.Fprintf(tw, "%s\tanother node\n", ip)
	}
	return tw.Flush()
}

// dsrDispatchLine says how DSR flows leave and what comes in.
func dsrDispatchLine(ns *api.NorthSouth) string {
	if ns.DSRDispatch == "gue" {
		return fmt.Sprintf("GUE to UDP %d, source port from the flow hash (ECMP and RSS spread the flows); IPIP taken in too", ns.DSRGUEPort)
	}
	return fmt.Sprintf("IPIP, the backend in an IP option (one outer flow per node pair: --dsr-dispatch=gue spreads them); GUE to UDP %d taken in too", ns.DSRGUEPort)
}
