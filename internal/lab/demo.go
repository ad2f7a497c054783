package lab

import (
	"bytes"
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/sluice-dataplane/sluice/internal/api"
)

//go:embed testdata/demo-services.yaml
var demoServices []byte

// Frontends of testdata/demo-services.yaml.
const (
	demoTCP        = "198.19.0.10:80"
	demoUDP        = "198.19.0.11:53"
	demoNodePort   = 30080
	demoAffinity   = "198.19.0.13:80"
	demoDual4      = "198.19.0.14:80"
	demoDual6      = "[fd00:198:19::14]:80"
	demoDualUDP6   = "[fd00:198:19::14]:53"
	demoLatency    = "198.19.0.15:80" // its only backend: demoLatencyPod
	demoLatencyPod = "node2-pod1"
	demoFrom       = "node1-pod1"
	// North-south: the client enters by demoXDPNode (native XDP) and by
	// demoTCNode (tc), each time to a backend on the other node.
	demoXDPNode     = "node1"
	demoXDPNodePort = 30081
	demoTCNode      = "node2"
	demoTCNodePort  = 30082
)

// DemoConfig configures `lab demo`.
type DemoConfig struct {
	Dataplane  string
	AgentBin   string
	Requests   int    // per latency measurement; at least 1,000 for the report
	ResultsDir string // latest.json goes here
	Out        io.Writer
}

// DemoResult is what the demo measured, written as latest.json.
type DemoResult struct {
	Started     time.Time        `json:"started"`
	Finished    time.Time        `json:"finished"`
	Nodes       int              `json:"nodes"`
	PodsPerNode int              `json:"podsPerNode"`
	Dataplane   string           `json:"dataplane"`
	ServiceList string           `json:"serviceList,omitempty"`
	Spread      []DemoSpread     `json:"spread"`
	Latency     []DemoLatencyRow `json:"latency"`
	// Acceleration is what each node's agent runs on eth0, as its status
	// says ("native XDP", or "tc" with the reason).
	Acceleration map[string]string `json:"acceleration,omitempty"`
	// NorthSouth compares the external client's requests to a NodePort
	// through native XDP (node1) and through tc (node2).
	NorthSouth []DemoNorthSouthRow `json:"northSouth,omitempty"`
	// Bandwidth is a Pod limited by its annotation next to one that is
	// not, each sending to a pod of the other node.
	Bandwidth []DemoBandwidthRow `json:"bandwidth,omitempty"`
	Error     string             `json:"error,omitempty"`
}

// DemoBandwidthRow is one Pod's iperf3 stream in the bandwidth step.
type DemoBandwidthRow struct {
	Pod        string  `json:"pod"`
	Annotation string  `json:"annotation"` // "" for none
	Mechanism  string  `json:"mechanism"`  // the node's BandwidthManager line
	Goodput    float64 `json:"goodputBitsPerSecond"`
	Wire       float64 `json:"wireBitsPerSecond"`
}

// The bandwidth step: demoLimitedPod annotated demoLimit, demoFreePod not,
// each sending to demoBWServer.
const (
	demoLimitedPod = "node1-pod2"
	demoFreePod    = "node1-pod3"
	demoBWServer   = "node2-pod2"
	demoLimit      = "50M"
)

// DemoNorthSouthRow compares a NodePort through XDP with one through tc,
// both forwarding to a backend on the other node.
type DemoNorthSouthRow struct {
	Mode     string       `json:"mode"` // new-connection or keepalive
	XDP      LatencyStats `json:"xdp"`
	TC       LatencyStats `json:"tc"`
	RatioP50 float64      `json:"ratioP50"` // XDP / tc
	RatioP99 float64      `json:"ratioP99"`
	Rounds   int          `json:"rounds"`
}

// DemoSpread is how one Service's requests spread over its backends.
type DemoSpread struct {
	Service string       `json:"service"`
	From    string       `json:"from"`
	Kind    string       `json:"kind"`
	Target  string       `json:"target"`
	Report  *ProbeReport `json:"report"`
}

// DemoLatencyRow compares the Service VIP with the pod IP behind it.
type DemoLatencyRow struct {
	Mode     string       `json:"mode"` // new-connection or keepalive
	VIP      LatencyStats `json:"vip"`
	Pod      LatencyStats `json:"pod"`
	RatioP50 float64      `json:"ratioP50"` // VIP / pod
	RatioP99 float64      `json:"ratioP99"`
	// Rounds of up to RoundSize requests per target, alternating which
	// target goes first; the samples of all rounds are merged.
	Rounds    int `json:"rounds"`
	RoundSize int `json:"roundSize"`
}

// demoRoundSize is how many requests go to one target before the other
// takes its turn. One: VIP and pod IP alternate request by request, so both
// connections see the same scheduler, cache and backend state.
const demoRoundSize = 1

func demoCommand(prefix *string) *cobra.Command {
	cfg := DemoConfig{}
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "2 nodes × 3 pods, sample Services, traffic through each, VIP vs pod-IP latency, NodePort through XDP vs tc",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg.Out = cmd.OutOrStdout()
			return RunDemo(cmd.Context(), *prefix, cfg)
		},
	}
	cmd.Flags().StringVar(&cfg.Dataplane, "dataplane", DataplaneSluice, "sluice or none (none: only pod-IP traffic works)")
	cmd.Flags().StringVar(&cfg.AgentBin, "agent-bin", "", "sluice-agent binary (default: next to this binary)")
	cmd.Flags().IntVar(&cfg.Requests, "requests", 1000, "requests per latency measurement")
	cmd.Flags().StringVar(&cfg.ResultsDir, "results", "results/demo", "directory for latest.json")
	cmd.AddCommand(demoLatencyCommand())
	return cmd
}

// demoLatencyCommand runs inside the client pod: both targets are measured
// by one process, so they share its warm-up, CPU and timing.
func demoLatencyCommand() *cobra.Command {
	var cfg LatencyCompareConfig
	cmd := &cobra.Command{
		Use:    "latency",
		Short:  "Measure a VIP and a pod IP in alternating rounds; print JSON",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			res, err := CompareLatency(cmd.Context(), cfg)
			if err != nil {
				return err
			}
			return json.NewEncoder(cmd.OutOrStdout()).Encode(res)
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.VIP, "vip", "", "URL through the Service VIP (empty: measure the pod only)")
	f.StringVar(&cfg.Pod, "pod", "", "URL of the backend's pod IP")
	f.IntVar(&cfg.Requests, "requests", 1000, "requests per target")
	f.IntVar(&cfg.RoundSize, "round", demoRoundSize, "requests per target and round")
	f.BoolVar(&cfg.KeepAlive, "keepalive", false, "one connection per target for all its requests")
	f.DurationVar(&cfg.Timeout, "timeout", 2*time.Second, "timeout of each request")
	f.DurationVar(&cfg.Budget, "budget", 5*time.Minute, "time limit of the whole run")
	return cmd
}

// RunDemo runs the demo end to end and always tears the lab down.
func RunDemo(ctx context.Context, prefix string, cfg DemoConfig) (err error) {
	if cfg.Requests < 1 || cfg.Requests > MaxProbeCount {
		return fmt.Errorf("--requests %d: want 1..%d", cfg.Requests, MaxProbeCount)
	}
	out := cfg.Out
	res := &DemoResult{Started: time.Now().UTC(), Nodes: 2, PodsPerNode: 3, Dataplane: cfg.Dataplane}
	defer func() {
		res.Finished = time.Now().UTC()
		if err != nil {
			res.Error = err.Error()
		}
		if werr := writeDemoResult(cfg.ResultsDir, res); werr != nil {
			err = errors.Join(err, werr)
		} else {
			fmt.Fprintf(out, "==> results in %s\n", filepath.Join(cfg.ResultsDir, "latest.json"))
		}
	}()

	// One lab shows both north-south paths: node1's agent runs native XDP
	// on its eth0 (the lab readies the veth's peer for it), node2's
	// best-effort, which keeps a veth on tc.
	l, err := Up(ctx, Config{Prefix: prefix, Nodes: res.Nodes, PodsPerNode: res.PodsPerNode,
		Dataplane: cfg.Dataplane, AgentBin: cfg.AgentBin, Progress: out,
		LBAcceleration: AccelerationBestEffort, NodeLBAcceleration: map[string]string{demoXDPNode: AccelerationNative},
		BandwidthManager: cfg.Dataplane == DataplaneSluice})
	if err != nil {
		return err
	}
	defer func() {
		if derr := l.Down(); derr != nil {
			err = errors.Join(err, fmt.Errorf("teardown: %w", derr))
		}
	}()

	fmt.Fprintln(out, "==> applying sample Services (testdata/demo-services.yaml)")
	objs, err := DecodeObjects(bytes.NewReader(demoServices))
	if err != nil {
		return fmt.Errorf("demo services: %w", err)
	}
	if err := l.Apply(objs...); err != nil {
		return err
	}
	if cfg.Dataplane == DataplaneNone {
		fmt.Fprintln(out, "==> dataplane none: skipping Service traffic, measuring pod IPs only")
	} else {
		if err := waitServing(ctx, l, "http://"+demoTCP+"/", 20*time.Second); err != nil {
			return err
		}
		node1, _ := l.Node("node1")
		fmt.Fprintf(out, "==> sluice service list (node1's agent)\n")
		list, err := serviceList(ctx, l.Exe, node1.Agent.Socket)
		if err != nil {
			fmt.Fprintf(out, "    (service list failed: %v)\n", err)
		}
		res.ServiceList = list
		fmt.Fprint(out, list)

		node2, _ := l.Node("node2")
		nodePort := func(ip fmt.Stringer, port int) string { return demoURL(ip.String(), port) }
		res.Acceleration = map[string]string{}
		fmt.Fprintln(out, "==> north-south on eth0, as each agent's status says")
		for _, n := range l.Nodes {
			res.Acceleration[n.Name] = eth0Acceleration(ctx, n)
			fmt.Fprintf(out, "    %s: %s\n", n.Name, res.Acceleration[n.Name])
		}
		checks := []struct{ svc, from, kind, target string }{
			{"echo-tcp (ClusterIP TCP)", demoFrom, "http", "http://" + demoTCP + "/"},
			{"echo-udp (ClusterIP UDP, socket per request)", demoFrom, "udp", demoUDP},
			{"echo-nodeport (NodePort, node2 IP, from a pod)", demoFrom, "http", nodePort(node2.IPv4, demoNodePort)},
			{"echo-nodeport (NodePort, node1 IP, from node1)", "node1", "http", nodePort(node1.IPv4, demoNodePort)},
			{"echo-ns-xdp (NodePort via node1: XDP)", "client", "http", nodePort(node1.IPv4, demoXDPNodePort)},
			{"echo-ns-tc (NodePort via node2: tc)", "client", "http", nodePort(node2.IPv4, demoTCNodePort)},
			{"echo-affinity (ClientIP affinity)", demoFrom, "http", "http://" + demoAffinity + "/"},
			{"echo-dual (IPv4 VIP)", demoFrom, "http", "http://" + demoDual4 + "/"},
			{"echo-dual (IPv6 VIP)", demoFrom, "http", "http://" + demoDual6 + "/"},
			{"echo-dual (IPv6 VIP, UDP)", demoFrom, "udp", demoDualUDP6},
		}
		fmt.Fprintln(out, "==> 60 requests through each Service: how they spread over backends")
		for _, c := range checks {
			args := []string{"--count", "60", "--timeout", "1s", "--budget", "60s"}
			if c.kind == "http" {
				args = append(args, "--url", c.target)
			} else {
				args = append(args, "--addr", c.target, "--new-socket-per-request")
			}
			rep, err := l.Probe(ctx, c.from, c.kind, args...)
			if err != nil {
				return err
			}
			res.Spread = append(res.Spread, DemoSpread{Service: c.svc, From: c.from, Kind: c.kind, Target: c.target, Report: rep})
			fmt.Fprintf(out, "    %-48s from %-10s %2d/%d ok  %s\n", c.svc, c.from, rep.OK, rep.Count, formatCounts(rep.Backends))
			if len(rep.Errors) > 0 {
				fmt.Fprintf(out, "    %-48s errors: %s (%s)\n", "", formatCounts(rep.Errors), rep.FirstError)
			}
		}
	}

	// One backend behind the VIP, so both measurements take the same path
	// (across nodes) and differ only by the Service translation.
	backend, _ := l.Pod(demoLatencyPod)
	podURL := demoURL(backend.IPv4.String(), EchoHTTPPort)
	vipURL := "http://" + demoLatency + "/"
	if cfg.Dataplane == DataplaneNone {
		vipURL = ""
	}
	fmt.Fprintf(out, "==> latency from %s: echo-latency VIP %s vs its backend's pod IP %s, %d requests each, alternating\n",
		demoFrom, demoLatency, backend.IPv4, cfg.Requests)
	rows, err := compareModes(ctx, l, out, demoFrom, vipURL, podURL, cfg.Requests)
	if err != nil {
		return fmt.Errorf("latency, %w", err)
	}
	for _, r := range rows {
		row := DemoLatencyRow{Mode: r.mode, VIP: r.VIP, Pod: r.Pod, Rounds: r.Rounds, RoundSize: r.RoundSize}
		if vipURL != "" {
			row.RatioP50, row.RatioP99 = r.ratios()
		}
		res.Latency = append(res.Latency, row)
	}
	printComparison(out, "VIP", "pod", rows)
	if cfg.Dataplane == DataplaneNone {
		return nil
	}

	// The client reaches no pod IP: XDP and tc are measured against each
	// other, alternating request by request like the VIP and the pod IP.
	xdpNode, _ := l.Node(demoXDPNode)
	tcNode, _ := l.Node(demoTCNode)
	xdpURL, tcURL := demoURL(xdpNode.IPv4.String(), demoXDPNodePort), demoURL(tcNode.IPv4.String(), demoTCNodePort)
	fmt.Fprintf(out, "==> north-south latency from the client: NodePort %s through %s's XDP vs %s through %s's tc, "+
		"backend on the other node, %d requests each, alternating\n", xdpURL, demoXDPNode, tcURL, demoTCNode, cfg.Requests)
	rows, err = compareModes(ctx, l, out, "client", xdpURL, tcURL, cfg.Requests)
	if err != nil {
		return fmt.Errorf("north-south latency, %w", err)
	}
	for _, r := range rows {
		p50, p99 := r.ratios()
		res.NorthSouth = append(res.NorthSouth, DemoNorthSouthRow{Mode: r.mode, XDP: r.VIP, TC: r.Pod, Rounds: r.Rounds,
			RatioP50: p50, RatioP99: p99})
	}
	printComparison(out, "XDP", "tc", rows)
	if res.Bandwidth, err = demoBandwidth(ctx, l, out); err != nil {
		return fmt.Errorf("bandwidth, %w", err)
	}
	return nil
}

// demoBandwidth annotates demoLimitedPod with an egress limit and runs an
// iperf3 stream from it and from its unlimited neighbour to a pod of the
// other node.
func demoBandwidth(ctx context.Context, l *Lab, out io.Writer) ([]DemoBandwidthRow, error) {
	if _, err := exec.LookPath("iperf3"); err != nil {
		fmt.Fprintln(out, "==> bandwidth: skipped, iperf3 not found (scripts/deps.sh installs it)")
		return nil, nil
	}
	server, _ := l.Pod(demoBWServer)
	fmt.Fprintf(out, "==> bandwidth manager: %s annotated kubernetes.io/egress-bandwidth=%s, %s not; iperf3 from each to %s\n",
		demoLimitedPod, demoLimit, demoFreePod, demoBWServer)
	if err := l.Annotate(ctx, demoLimitedPod, map[string]string{"kubernetes.io/egress-bandwidth": demoLimit}, nil); err != nil {
		return nil, err
	}
	srv := l.Command(ctx, demoBWServer, "iperf3", "-s")
	if err := srv.Start(); err != nil {
		return nil, fmt.Errorf("iperf3 server in %s: %w", demoBWServer, err)
	}
	defer func() {
		_ = srv.Process.Kill()
		_ = srv.Wait()
	}()
	node1, _ := l.Node("node1")
	mech := ""
	deadline := time.Now().Add(20 * time.Second)
	for {
		st, err := api.NewClient(node1.Agent.Socket).Status(ctx)
		if err == nil && st.BandwidthManager != nil && st.BandwidthManager.Pods > 0 {
			mech = st.BandwidthManager.Line
			break
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("node1's agent did not install %s's limit within 20 s (status: %v)", demoLimitedPod, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	fmt.Fprintf(out, "    node1 BandwidthManager: %s\n", mech)
	var rows []DemoBandwidthRow
	for _, pod := range []string{demoLimitedPod, demoFreePod} {
		row := DemoBandwidthRow{Pod: pod, Mechanism: mech}
		if pod == demoLimitedPod {
			row.Annotation = demoLimit
		}
		var err error
		if row.Goodput, row.Wire, err = iperf3Stream(ctx, l, pod, server.IPv4.String()); err != nil {
			return rows, err
		}
		limit := "none"
		if row.Annotation != "" {
			limit = row.Annotation
		}
		fmt.Fprintf(out, "    %-12s limit %-5s %8.2f Mbit/s goodput, %8.2f Mbit/s on the wire\n", pod, limit, row.Goodput/1e6, row.Wire/1e6)
		rows = append(rows, row)
	}
	return rows, nil
}

// iperf3Stream runs a 5-second iperf3 TCP stream from pod to server and
// returns the receiver's goodput and the wire rate it stands for (every
// segment's headers, as a limit counts), bits/s.
func iperf3Stream(ctx context.Context, l *Lab, pod, server string) (goodput, wire float64, err error) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	var res struct {
		Start struct {
			TCPMSS int `json:"tcp_mss_default"`
		} `json:"start"`
		End struct {
			SumReceived struct {
				BitsPerSecond float64 `json:"bits_per_second"`
			} `json:"sum_received"`
		} `json:"end"`
		Error string `json:"error"`
	}
	for attempt := 1; ; attempt++ {
		out, err := l.Command(ctx, pod, "iperf3", "-c", server, "-J", "-t", "5", "-O", "1").Output()
		if jerr := json.Unmarshal(out, &res); err == nil && jerr == nil && res.Error == "" {
			break
		} else if attempt >= 5 || !bytes.Contains(out, []byte("unable to connect")) && !bytes.Contains(out, []byte("busy")) {
			return 0, 0, fmt.Errorf("iperf3 from %s to %s: %v %v %s", pod, server, err, jerr, res.Error)
		}
		time.Sleep(500 * time.Millisecond) // the server starting, or still with the last client
	}
	mss := res.Start.TCPMSS
	if mss == 0 {
		mss = 1448
	}
	goodput = res.End.SumReceived.BitsPerSecond
	return goodput, goodput * float64(mss+66) / float64(mss), nil
}

// modeComparison is one `lab demo latency` run: its first target is
// LatencyComparison's VIP, its second the pod.
type modeComparison struct {
	mode string // new-connection or keepalive
	LatencyComparison
}

// ratios are the first target's p50 and p99 over the second's.
func (m modeComparison) ratios() (p50, p99 float64) {
	return ratio(m.VIP.P50, m.Pod.P50), ratio(m.VIP.P99, m.Pod.P99)
}

// compareModes measures first (may be "") against second from a lab
// namespace, with a new connection per request and then with keepalive.
func compareModes(ctx context.Context, l *Lab, out io.Writer, from, first, second string, requests int) ([]modeComparison, error) {
	var rows []modeComparison
	for _, mode := range []string{"new-connection", "keepalive"} {
		fmt.Fprintf(out, "    %s ...\n", mode)
		args := []string{l.Exe, "demo", "latency", "--vip", first, "--pod", second,
			"--requests", strconv.Itoa(requests), "--round", strconv.Itoa(demoRoundSize)}
		if mode == "keepalive" {
			args = append(args, "--keepalive")
		}
		cmp, err := runLatency(ctx, l, from, args)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", mode, err)
		}
		rows = append(rows, modeComparison{mode: mode, LatencyComparison: *cmp})
	}
	return rows, nil
}

// eth0Acceleration says what a node's agent runs on eth0, from its status.
func eth0Acceleration(ctx context.Context, n Node) string {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	st, err := api.NewClient(n.Agent.Socket).Status(ctx)
	if err != nil {
		return fmt.Sprintf("unknown (status: %v)", err)
	}
	if st.NorthSouth != nil {
		for _, d := range st.NorthSouth.Devices {
			switch {
			case d.Name != uplinkName:
			case d.XDP == "native" || d.XDP == "generic":
				return fmt.Sprintf("%s XDP and %s (--lb-acceleration %s)", d.XDP, d.TC, st.NorthSouth.Acceleration)
			case d.XDPError != "":
				return fmt.Sprintf("%s only (--lb-acceleration %s: %s)", d.TC, st.NorthSouth.Acceleration, d.XDPError)
			default:
				return fmt.Sprintf("%s only (--lb-acceleration %s)", d.TC, st.NorthSouth.Acceleration)
			}
		}
	}
	return "nothing attached to " + uplinkName
}

// runLatency runs `lab demo latency` in a pod and decodes its result.
func runLatency(ctx context.Context, l *Lab, from string, args []string) (*LatencyComparison, error) {
	cmd := l.Command(ctx, from, args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	data, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("%s in %s: %w: %s", filepath.Base(args[0])+" lab demo latency", from, err, bytes.TrimSpace(stderr.Bytes()))
	}
	var cmp LatencyComparison
	if err := json.Unmarshal(data, &cmp); err != nil {
		return nil, fmt.Errorf("decode latency result %.200q: %w", data, err)
	}
	return &cmp, nil
}

// LatencyCompareConfig configures CompareLatency.
type LatencyCompareConfig struct {
	VIP, Pod  string // URLs; an empty VIP measures the pod only
	Requests  int    // per target
	RoundSize int    // requests per target before the other's turn
	KeepAlive bool
	Timeout   time.Duration
	Budget    time.Duration
}

// LatencyComparison is CompareLatency's result: the merged samples of all
// rounds, per target.
type LatencyComparison struct {
	VIP       LatencyStats `json:"vip"`
	Pod       LatencyStats `json:"pod"`
	Rounds    int          `json:"rounds"`
	RoundSize int          `json:"roundSize"`
}

// CompareLatency sends GETs to the VIP and the pod URL in alternating
// rounds: round i sends RoundSize requests to one, then to the other, and
// round i+1 starts with the other one. Warm-up, caches and drift over the
// run thus fall on both alike, and no ordering favours either. Any failed
// request fails the comparison: a latency over a subset would mislead.
func CompareLatency(ctx context.Context, cfg LatencyCompareConfig) (*LatencyComparison, error) {
	if cfg.Pod == "" {
		return nil, errors.New("latency: --pod is required")
	}
	if cfg.Requests < 1 || cfg.Requests > MaxProbeCount {
		return nil, fmt.Errorf("latency: --requests %d: want 1..%d", cfg.Requests, MaxProbeCount)
	}
	if cfg.RoundSize < 1 {
		return nil, fmt.Errorf("latency: --round %d: want at least 1", cfg.RoundSize)
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 2 * time.Second
	}
	if cfg.Budget <= 0 {
		cfg.Budget = 5 * time.Minute
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.Budget)
	defer cancel()

	type target struct {
		url     string
		client  *http.Client
		samples []time.Duration
	}
	newTarget := func(url string) *target {
		tr := &http.Transport{
			DialContext:         (&net.Dialer{Timeout: cfg.Timeout}).DialContext,
			DisableKeepAlives:   !cfg.KeepAlive,
			MaxIdleConnsPerHost: 1,
			DisableCompression:  true,
			Proxy:               nil, // lab traffic stays in the lab
		}
		return &target{url: url, client: &http.Client{Transport: tr, Timeout: cfg.Timeout},
			samples: make([]time.Duration, 0, cfg.Requests)}
	}
	pod := newTarget(cfg.Pod)
	targets := []*target{pod}
	var vip *target
	if cfg.VIP != "" {
		vip = newTarget(cfg.VIP)
		targets = append(targets, vip)
	}
	defer func() {
		for _, t := range targets {
			t.client.Transport.(*http.Transport).CloseIdleConnections()
		}
	}()

	res := &LatencyComparison{RoundSize: cfg.RoundSize}
	for sent := 0; sent < cfg.Requests; sent += cfg.RoundSize {
		n := min(cfg.RoundSize, cfg.Requests-sent)
		order := targets
		if res.Rounds%2 == 1 {
			order = slices.Clone(targets)
			slices.Reverse(order)
		}
		for _, t := range order {
			for range n {
				start := time.Now()
				if _, _, err := httpGet(ctx, t.client, t.url); err != nil {
					return nil, fmt.Errorf("latency: GET %s (request %d): %w", t.url, len(t.samples)+1, err)
				}
				t.samples = append(t.samples, time.Since(start))
			}
		}
		res.Rounds++
	}
	res.Pod = summarize(pod.samples)
	if vip != nil {
		res.VIP = summarize(vip.samples)
	}
	return res, nil
}

func ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}

// printComparison prints p50 and p99 of both targets and their ratios,
// a row per mode.
func printComparison(w io.Writer, first, second string, rows []modeComparison) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "mode\t%[1]s p50 µs\t%[2]s p50 µs\tp50 %[1]s/%[2]s\t%[1]s p99 µs\t%[2]s p99 µs\tp99 %[1]s/%[2]s\t\n", first, second)
	for _, r := range rows {
		p50, p99 := r.ratios()
		fmt.Fprintf(tw, "%s\t%.0f\t%.0f\t%.3f\t%.0f\t%.0f\t%.3f\t\n", r.mode, r.VIP.P50, r.Pod.P50, p50, r.VIP.P99, r.Pod.P99, p99)
	}
	tw.Flush()
}

// demoURL is the echo backend's URL at host:port.
func demoURL(host string, port int) string { return "http://" + joinHostPort(host, port) + "/" }

func joinHostPort(host string, port int) string {
	if len(host) > 0 && host[0] != '[' && bytes.ContainsRune([]byte(host), ':') {
		host = "[" + host + "]"
	}
	return host + ":" + strconv.Itoa(port)
}

// waitServing waits until the agents have programmed the Service: one GET
// through its VIP succeeds.
func waitServing(ctx context.Context, l *Lab, url string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		rep, err := l.Probe(ctx, demoFrom, "http", "--url", url, "--count", "1", "--timeout", "500ms")
		if err == nil && rep.OK == 1 {
			return nil
		}
		if time.Now().After(deadline) {
			if err == nil {
				err = errors.New(rep.FirstError)
			}
			return fmt.Errorf("service %s not answering after %s: %w", url, timeout, err)
		}
		if err := sleepCtx(ctx, 200*time.Millisecond); err != nil {
			return err
		}
	}
}

// serviceList runs this binary's `service list` against an agent.
func serviceList(ctx context.Context, exe, socket string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	// The operator CLI, built beside sluice-lab (issue 47 split them).
	cli := filepath.Join(filepath.Dir(exe), "sluice")
	out, err := exec.CommandContext(ctx, cli, "service", "list", "--api-socket", socket).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("sluice service list: %w", err)
	}
	return string(out), nil
}

func writeDemoResult(dir string, res *DemoResult) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("results: %w", err)
	}
	data, err := json.MarshalIndent(res, "", "  ")
	if err != nil {
		return fmt.Errorf("results: %w", err)
	}
	return writeAtomic(filepath.Join(dir, "latest.json"), append(data, '\n'))
}
