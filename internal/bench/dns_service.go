package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/sluice-dataplane/sluice/internal/lab"
)

// Cluster DNS through the Service VIP (`sluice-lab bench dns
// --through-service`): CoreDNS replicas in the lab behind kube-dns, the
// real control plane, and each dataplane in turn. From a pod on every
// node at once: dnsperf to the VIP (QPS, lost), and lookups as glibc makes
// them (A and AAAA at once from a new connected UDP socket: the conntrack
// insertion race behind Kubernetes' 5-second DNS timeouts), counting the
// answers that never come and the latency of those that do. Last, a
// serving replica is deleted (taken out of the EndpointSlice and killed)
// while lookups run: the lookups lost then.
//
//	node1: pod1 pod2 (CoreDNS)  pod3 (clients)
//	node2: pod1 pod2 (CoreDNS)  pod3 (clients)

// The servers behind the VIP: CoreDNS, what a cluster runs, and sluice's
// echo server, whose own cost is small enough beside the dataplane's that
// what the dataplanes differ in shows (on a machine where CoreDNS takes
// the CPUs, its rows measure CoreDNS).
const (
	DNSServerCoreDNS = "coredns"
	DNSServerEcho    = "echo"
)

// DNSServers are the servers RunDNSService knows, in run order.
var DNSServers = []string{DNSServerCoreDNS, DNSServerEcho}

// DNSServiceConfig configures RunDNSService.
type DNSServiceConfig struct {
	Dataplanes  []string      `json:"dataplanes"`
	Servers     []string      `json:"servers"`
	Replicas    []int         `json:"replicas"`
	Duration    time.Duration `json:"duration"` // each dnsperf run
	Runs        int           `json:"runs"`
	Clients     int           `json:"clients"`     // dnsperf -c per client pod
	Outstanding int           `json:"outstanding"` // dnsperf -q per client pod
	Lookups     int           `json:"lookups"`     // A+AAAA lookups per client pod
	Resolvers   int           `json:"resolvers"`   // lookups at once per client pod
	Timeout     time.Duration `json:"timeout"`     // an answer later than this counts as lost
	Prefix      string        `json:"-"`
	Exe         string        `json:"-"`
	AgentBin    string        `json:"-"`
	Progress    io.Writer     `json:"-"`
}

// DNSServiceRow is one dataplane with some replicas serving.
type DNSServiceRow struct {
	Dataplane string    `json:"dataplane"`
	Server    string    `json:"server"` // DNSServerCoreDNS or DNSServerEcho
	Replicas  int       `json:"replicas"`
	QPS       []float64 `json:"qps"` // both clients' sum, per run
	Min       float64   `json:"min"`
	Mean      float64   `json:"mean"`
	Max       float64   `json:"max"`
	Sent      int64     `json:"sent"`
	Lost      int64     `json:"lost"` // dnsperf's
	// The glibc-shaped lookups (CoreDNS rows): queries (2 per lookup),
	// those never answered within Timeout, latency of the answered.
	Queries    int     `json:"queries"`
	Unanswered int     `json:"unanswered"`
	P50        float64 `json:"p50_us"`
	P99        float64 `json:"p99_us"`
	// Backends are the answers per replica address (the spread): of the
	// lookups to which.replica.lab for CoreDNS, the echo servers' own
	// counts of answers for echo.
	Backends map[string]int `json:"backends"`
}

// DNSDeletionRow is a replica deleted while lookups run.
type DNSDeletionRow struct {
	Dataplane  string  `json:"dataplane"`
	Deleted    string  `json:"deleted"`
	Queries    int     `json:"queries"`
	Unanswered int     `json:"unanswered"`
	IntervalMS float64 `json:"interval_ms"` // between a client's lookups
	FirstError string  `json:"first_error,omitempty"`
}

// DNSServiceReport is a whole run.
type DNSServiceReport struct {
	Kernel    string            `json:"kernel"`
	Start     time.Time         `json:"start"`
	Config    DNSServiceConfig  `json:"config"`
	CoreDNS   string            `json:"coredns"`
	Rows      []DNSServiceRow   `json:"rows"`
	Deletions []DNSDeletionRow  `json:"deletions"`
	Skipped   map[string]string `json:"skipped,omitempty"`
}

// Validate checks the configuration.
func (c DNSServiceConfig) Validate() error {
	var errs []error
	for _, d := range c.Dataplanes {
		if !slices.Contains(lab.Dataplanes, d) || d == lab.DataplaneNone {
			errs = append(errs, fmt.Errorf("--dataplanes: %q: want one of %s", d, strings.Join(lab.Dataplanes[1:], ", ")))
		}
	}
	if len(c.Servers) == 0 {
		errs = append(errs, fmt.Errorf("--servers: want one or more of %s", strings.Join(DNSServers, ", ")))
	}
	for _, s := range c.Servers {
		if !slices.Contains(DNSServers, s) {
			errs = append(errs, fmt.Errorf("--servers: %q: want %s", s, strings.Join(DNSServers, " or ")))
		}
	}
	for _, n := range c.Replicas {
		if n < 1 || n > dnsServiceMaxReplicas {
			errs = append(errs, fmt.Errorf("--replicas: %d: want 1..%d", n, dnsServiceMaxReplicas))
		}
	}
	if c.Runs < 1 || c.Lookups < 1 || c.Resolvers < 1 || c.Clients < 1 || c.Outstanding < 1 {
		errs = append(errs, errors.New("--runs, --lookups, --resolvers, --clients and --outstanding: want 1 or more"))
	}
	if c.Duration < time.Second || c.Duration%time.Second != 0 {
		errs = append(errs, fmt.Errorf("--duration %v: want whole seconds, 1s or more", c.Duration))
	}
	if c.Timeout <= 0 {
		errs = append(errs, fmt.Errorf("--timeout %v: want more than 0", c.Timeout))
	}
	return errors.Join(errs...)
}

// The lab: 2 nodes × 3 pods, CoreDNS in pods 1 and 2 of each.
const (
	dnsServiceNodes       = 2
	dnsServicePods        = 3
	dnsServiceMaxReplicas = 4
)

// dnsServiceQueries: names the kubernetes plugin answers.
const dnsServiceQueries = `kubernetes.default.svc.cluster.local A
kube-dns.default.svc.cluster.local A
kubernetes.default.svc.cluster.local AAAA
`

func (c DNSServiceConfig) step(format string, args ...any) {
	if c.Progress != nil {
		fmt.Fprintf(c.Progress, "[dns-service %s] %s\n", time.Now().Format("15:04:05"), fmt.Sprintf(format, args...))
	}
}

// RunDNSService runs every dataplane in turn on a lab of its own.
func RunDNSService(ctx context.Context, cfg DNSServiceConfig) (*DNSServiceReport, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if _, err := lab.CoreDNSBinary(); err != nil {
		return nil, err
	}
	rep := &DNSServiceReport{Kernel: kernelRelease(), Start: time.Now().UTC(), Config: cfg, Skipped: map[string]string{}}
	err := eachDataplane(cfg.Dataplanes, rep.Skipped, cfg.step, func(d string) error { return runDNSServiceDataplane(ctx, cfg, d, rep) })
	if err != nil {
		return rep, err
	}
	return rep, nil
}

func runDNSServiceDataplane(ctx context.Context, cfg DNSServiceConfig, d string, rep *DNSServiceReport) (err error) {
	cfg.step("%s: lab up (%d nodes × %d pods, real control plane, %d CoreDNS replicas)", d, dnsServiceNodes, dnsServicePods, dnsServiceMaxReplicas)
	l, err := lab.Up(ctx, lab.Config{Prefix: cfg.Prefix, Nodes: dnsServiceNodes, PodsPerNode: dnsServicePods, Dataplane: d,
		ControlPlane: lab.ControlPlaneReal, ClusterDNS: dnsServiceMaxReplicas, Exe: cfg.Exe, AgentBin: cfg.AgentBin,
		Progress: indent{cfg.Progress}})
	if err != nil {
		return err
	}
	defer func() {
		cfg.step("%s: lab down", d)
		err = errors.Join(err, l.Down())
	}()
	rep.CoreDNS = l.ClusterDNS.Version
	var clients []string
	for _, n := range l.Nodes {
		clients = append(clients, n.Pods[dnsServicePods-1].Name)
	}
	queries := filepath.Join(l.RunDir, "dnsperf-cluster-queries.txt")
	if err := os.WriteFile(queries, []byte(dnsServiceQueries), 0o644); err != nil {
		return err
	}
	if slices.Contains(cfg.Servers, DNSServerCoreDNS) {
		if err := dnsCoreDNSRows(ctx, cfg, l, d, clients, queries, rep); err != nil {
			return err
		}
	}
	// Before the deletion below, which kills a replica's pod the echo rows
	// start a server in.
	if slices.Contains(cfg.Servers, DNSServerEcho) {
		if err := dnsEchoRows(ctx, cfg, l, d, clients, queries, rep); err != nil {
			return fmt.Errorf("echo servers: %w", err)
		}
	}
	if slices.Contains(cfg.Servers, DNSServerCoreDNS) {
		del, err := dnsDeletion(ctx, cfg, l, d, clients, l.ClusterDNS.VIP.String())
		if err != nil {
			return fmt.Errorf("replica deletion: %w", err)
		}
		rep.Deletions = append(rep.Deletions, del)
	}
	return nil
}

// dnsCoreDNSRows: CoreDNS behind kube-dns with each replica count.
func dnsCoreDNSRows(ctx context.Context, cfg DNSServiceConfig, l *lab.Lab, d string, clients []string, queries string, rep *DNSServiceReport) error {
	vip := l.ClusterDNS.VIP.String()
	for _, n := range cfg.Replicas {
		if err := l.SetClusterDNSServing(n); err != nil {
			return err
		}
		if err := waitDNSSpread(ctx, l, clients[0], vip, n); err != nil {
			return fmt.Errorf("%d replicas: %w", n, err)
		}
		row := DNSServiceRow{Dataplane: d, Server: DNSServerCoreDNS, Replicas: n, Backends: map[string]int{}}
		if err := dnsperfRuns(ctx, cfg, l, clients, vip, queries, &row); err != nil {
			return fmt.Errorf("%d replicas: %w", n, err)
		}
		// The glibc-shaped lookups, from every client pod at once.
		reps, err := probeDNSAll(ctx, l, clients, vip, cfg.Lookups, cfg.Resolvers, cfg.Timeout, 0)
		if err != nil {
			return err
		}
		for _, r := range reps {
			row.Queries += r.Count
			row.Unanswered += r.Count - r.OK
			for b, c := range r.Backends {
				row.Backends[b] += c
			}
			// Each pod made as many lookups: the mean of their medians,
			// the worse of their p99s.
			row.P50 += r.Latency.P50 / float64(len(reps))
			row.P99 = max(row.P99, r.Latency.P99)
		}
		cfg.step("%s, %d replicas: %d A/AAAA queries from %d resolvers per pod, %d unanswered within %v; p50 %.0f µs, p99 %.0f µs",
			d, n, row.Queries, cfg.Resolvers, row.Unanswered, cfg.Timeout, row.P50, row.P99)
		rep.Rows = append(rep.Rows, row)
	}
	return nil
}

// dnsEchoRows: with each replica count, the serving replicas' pods behind
// the dns-echo Service (lab.DNSEchoService) as well as kube-dns, an echo
// server started in every replica's pod on lab.DNSEchoPort, and dnsperf
// from every client pod to the echo VIP. The servers' own counts of
// answers are the spread: a pod out of the Service that answered shows.
func dnsEchoRows(ctx context.Context, cfg DNSServiceConfig, l *lab.Lab, d string, clients []string, queries string, rep *DNSServiceReport) error {
	vip := lab.DNSEchoVIP.String()
	for _, n := range cfg.Replicas {
		if err := l.SetClusterDNSServing(n); err != nil {
			return err
		}
		if err := l.Apply(lab.DNSEchoService()); err != nil {
			return err
		}
		if err := waitEchoSpread(ctx, cfg, l, clients[0], vip, queries); err != nil {
			return fmt.Errorf("%d replicas: %w", n, err)
		}
		row := DNSServiceRow{Dataplane: d, Server: DNSServerEcho, Replicas: n, Backends: map[string]int{}}
		if err := dnsEchoRuns(ctx, cfg, l, clients, vip, queries, &row); err != nil {
			return fmt.Errorf("%d replicas: %w", n, err)
		}
		cfg.step("%s, echo servers, %d replicas: %.0f queries/s, answered by %s", d, n, row.Mean, counts(row.Backends))
		rep.Rows = append(rep.Rows, row)
	}
	return nil
}

// waitEchoSpread waits until the dataplane has dns-echo's change: a
// second of queries from 32 sockets of one client pod through vip is
// answered by the
// serving replicas' echo servers, each of them, and by no other (their
// own counts, servers started afresh for each try).
func waitEchoSpread(ctx context.Context, cfg DNSServiceConfig, l *lab.Lab, from, vip, queries string) error {
	want := slices.Sorted(slices.Values(l.ClusterDNS.Serving))
	deadline := time.Now().Add(30 * time.Second)
	for {
		var got map[string]int
		err := withEchoServers(ctx, cfg, l, from, vip, queries, &got, func() error {
			// 32 sockets: each keeps one backend (a socket LB's
			// connect, a conntrack entry), so one would reach one.
			_, err := runDnsperf(ctx, l, from, vip, queries, "", 0, time.Second, 32, 64, 0)
			return err
		})
		if err != nil {
			return err
		}
		if slices.Equal(slices.Sorted(maps.Keys(got)), want) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("queries through %s never reached exactly the serving replicas %v: answered by %s", vip, want, counts(got))
		}
		if err := sleepCtx(ctx, 500*time.Millisecond); err != nil {
			return err
		}
	}
}

// dnsEchoRuns runs dnsperf from every client pod at once cfg.Runs times
// against the echo servers behind vip; the servers' counts, by pod
// address, go to row.Backends.
func dnsEchoRuns(ctx context.Context, cfg DNSServiceConfig, l *lab.Lab, clients []string, vip, queries string, row *DNSServiceRow) error {
	var byPod map[string]int
	err := withEchoServers(ctx, cfg, l, clients[0], vip, queries, &byPod, func() error {
		return dnsperfRuns(ctx, cfg, l, clients, vip, queries, row)
	})
	for pod, c := range byPod {
		p, _ := l.Pod(pod)
		row.Backends[p.IPv4.String()] += c
	}
	return err
}

// withEchoServers starts an echo server in every replica's pod, waits
// until vip answers a query from the pod from, runs f, stops the servers
// and puts the count of answers of each that answered in *answered, by
// pod name.
func withEchoServers(ctx context.Context, cfg DNSServiceConfig, l *lab.Lab, from, vip, queries string, answered *map[string]int, f func() error) (err error) {
	servers := map[string]*echoServer{}
	*answered = map[string]int{}
	defer func() {
		for _, pod := range slices.Sorted(maps.Keys(servers)) {
			cnt, serr := servers[pod].stop()
			err = errors.Join(err, serr)
			if cnt.Answered > 0 {
				(*answered)[pod] += int(cnt.Answered)
			}
		}
	}()
	for _, pod := range l.ClusterDNS.Replicas {
		srv, err := startEchoServer(ctx, l, pod, cfg.Exe, "dns", "echo", "--listen", fmt.Sprintf("0.0.0.0:%d", lab.DNSEchoPort))
		if err != nil {
			return err
		}
		servers[pod] = srv
	}
	first := servers[l.ClusterDNS.Serving[0]]
	if err := waitAnswer(ctx, first, vip, func(ctx context.Context, dur time.Duration, c, o, n int) (dnsperfResult, error) {
		return runDnsperf(ctx, l, from, vip, queries, "", 0, dur, c, o, n)
	}); err != nil {
		return err
	}
	return f()
}

// dnsperfRuns runs dnsperf from every client pod at once to vip, cfg.Runs
// times, into row: QPS summed over the pods per run, mean, min and max,
// sent and lost.
func dnsperfRuns(ctx context.Context, cfg DNSServiceConfig, l *lab.Lab, clients []string, vip, queries string, row *DNSServiceRow) error {
	for run := 1; run <= cfg.Runs; run++ {
		results := make([]dnsperfResult, len(clients))
		errs := make([]error, len(clients))
		var wg sync.WaitGroup
		for i, c := range clients {
			wg.Go(func() {
				results[i], errs[i] = runDnsperf(ctx, l, c, vip, queries, "", 0, cfg.Duration, cfg.Clients, cfg.Outstanding, 0)
			})
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			return fmt.Errorf("run %d: %w", run, err)
		}
		var qps float64
		for _, r := range results {
			qps += r.qps
			row.Sent += r.sent
			row.Lost += r.lost
		}
		row.QPS = append(row.QPS, qps)
		cfg.step("%s, %s, %d replicas, run %d/%d: %.0f queries/s from %d pods, %d lost", row.Dataplane, row.Server, row.Replicas,
			run, cfg.Runs, qps, len(clients), row.Lost)
	}
	s := Summarize(row.QPS)
	row.Min, row.Max = s.Min, s.Max
	row.Mean = 0
	for _, q := range row.QPS {
		row.Mean += q / float64(len(row.QPS))
	}
	return nil
}

// waitDNSSpread waits until lookups through the VIP reach n replicas (the
// dataplane has the EndpointSlice change).
func waitDNSSpread(ctx context.Context, l *lab.Lab, from, vip string, n int) error {
	deadline := time.Now().Add(30 * time.Second)
	var last *lab.ProbeReport
	for time.Now().Before(deadline) {
		r, err := probeDNS(ctx, l, from, vip, 40, 4, time.Second, 0)
		if err != nil {
			return err
		}
		last = r
		if len(r.Backends) == n && r.OK == r.Count {
			return nil
		}
		if err := sleepCtx(ctx, 500*time.Millisecond); err != nil {
			return err
		}
	}
	return fmt.Errorf("lookups through %s never reached %d replicas: %d/%d answered, by %v", vip, n, last.OK, last.Count, last.Backends)
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}

// probeDNS runs `lab probe dns` in a pod.
func probeDNS(ctx context.Context, l *lab.Lab, from, vip string, lookups, resolvers int, timeout, interval time.Duration) (*lab.ProbeReport, error) {
	return l.Probe(ctx, from, "dns", "--addr", vip+":53", "--name", lab.ReplicaName, "--count", strconv.Itoa(lookups), "--clients", strconv.Itoa(resolvers),
		"--timeout", timeout.String(), "--interval", interval.String(), "--budget", "5m")
}

// probeDNSAll runs probeDNS from every client at once.
func probeDNSAll(ctx context.Context, l *lab.Lab, clients []string, vip string, lookups, resolvers int, timeout, interval time.Duration) ([]*lab.ProbeReport, error) {
	reps := make([]*lab.ProbeReport, len(clients))
	errs := make([]error, len(clients))
	var wg sync.WaitGroup
	for i, c := range clients {
		wg.Go(func() { reps[i], errs[i] = probeDNS(ctx, l, c, vip, lookups, resolvers, timeout, interval) })
	}
	wg.Wait()
	return reps, errors.Join(errs...)
}

// dnsDeletion: two replicas serve; lookups run from every client pod, a
// lookup every 10 ms per resolver; a second in, one replica is taken out
// of the Service and its CoreDNS killed, as a deleted Pod's is. The
// lookups that got no answer are counted.
func dnsDeletion(ctx context.Context, cfg DNSServiceConfig, l *lab.Lab, d string, clients []string, vip string) (DNSDeletionRow, error) {
	row := DNSDeletionRow{Dataplane: d, IntervalMS: 10}
	if err := l.SetClusterDNSServing(2); err != nil {
		return row, err
	}
	if err := waitDNSSpread(ctx, l, clients[0], vip, 2); err != nil {
		return row, err
	}
	victim := l.ClusterDNS.Serving[1]
	row.Deleted = victim
	type result struct {
		reps []*lab.ProbeReport
		err  error
	}
	done := make(chan result, 1)
	go func() {
		// 4 resolvers × 300 lookups at 10 ms: about 3 s per pod.
		reps, err := probeDNSAll(ctx, l, clients, vip, 1200, 4, cfg.Timeout, 10*time.Millisecond)
		done <- result{reps, err}
	}()
	if err := sleepCtx(ctx, time.Second); err != nil {
		return row, err
	}
	cfg.step("%s: deleting the replica in %s while lookups run", d, victim)
	setErr := l.SetClusterDNSServing(1)
	killErr := syscall.Kill(l.ClusterDNS.PIDs[victim], syscall.SIGKILL)
	r := <-done
	if err := errors.Join(setErr, killErr, r.err); err != nil {
		return row, err
	}
	for _, p := range r.reps {
		row.Queries += p.Count
		row.Unanswered += p.Count - p.OK
		if row.FirstError == "" {
			row.FirstError = p.FirstError
		}
	}
	cfg.step("%s: replica %s deleted: %d of %d queries unanswered", d, victim, row.Unanswered, row.Queries)
	return row, nil
}

// WriteFiles writes dns-service-<time>.json, .md and a plot.
func (r *DNSServiceReport) WriteFiles(dir string) ([]string, error) {
	base, paths, err := writeReport(dir, "dns-service", r.Start, r)
	if err != nil {
		return nil, err
	}
	// One bar group per server and replica count, a bar per dataplane.
	type point struct {
		server   string
		replicas int
	}
	var names, groups []string
	var points []point
	for _, srv := range r.Config.Servers {
		for _, n := range r.Config.Replicas {
			names = append(names, srv+", "+plural(n, "replica", "replicas"))
			points = append(points, point{srv, n})
		}
	}
	var values [][]float64
	for _, d := range r.Config.Dataplanes {
		vals := make([]float64, len(names))
		found := false
		for _, row := range r.Rows {
			if row.Dataplane == d {
				if i := slices.Index(points, point{row.Server, row.Replicas}); i >= 0 {
					vals[i], found = row.Mean, true
				}
			}
		}
		if found {
			groups, values = append(groups, d), append(values, vals)
		}
	}
	drawn, err := groupedBars(base+".png", fmt.Sprintf("Cluster DNS through the kube-dns VIP: queries/s, dnsperf from %d pods (kernel %s)", dnsServiceNodes, r.Kernel),
		"queries/s", names, groups, values, "%.0f")
	if err != nil {
		return paths, err
	}
	if drawn {
		paths = append(paths, base+".png")
	}
	return paths, nil
}

// WriteMarkdown writes the tables and the targets.
func (r *DNSServiceReport) WriteMarkdown(w io.Writer) {
	c := r.Config
	fmt.Fprintf(w, "# sluice-lab bench dns --through-service, %s\n\n", r.Start.Format(time.RFC3339))
	fmt.Fprintf(w, "Kernel %s, %s in pods 1 and 2 of each of %d nodes behind kube-dns %s (real kube-apiserver, kubernetes plugin). "+
		"From pod %d of every node at once: dnsperf `-c %d -q %d -l %d` to the VIP, %d runs (QPS summed over the pods: mean, min, max); "+
		"then %d lookups per pod as glibc makes them (A and AAAA at once from a new UDP socket), %d at once: queries without an answer within %v "+
		"(a 5 s timeout in a real resolver) and the answers' latency.\n\n",
		r.Kernel, r.CoreDNS, dnsServiceNodes, lab.ClusterDNSIPv4, dnsServicePods, c.Clients, c.Outstanding, int(c.Duration/time.Second), c.Runs,
		c.Lookups, c.Resolvers, c.Timeout)
	for d, why := range r.Skipped {
		fmt.Fprintf(w, "- %s skipped: %s\n", d, why)
	}
	if slices.Contains(c.Servers, DNSServerEcho) {
		fmt.Fprintf(w, "\nThe echo rows: `sluice dns echo` (one process) in the same replica pods on port %d behind a second Service, dns-echo %s:53, "+
			"with the same serving replicas; dnsperf as above. The answers per replica are the servers' own counts.\n", lab.DNSEchoPort, lab.DNSEchoVIP)
	}
	fmt.Fprintf(w, "\n| dataplane | server | replicas | QPS mean | min | max | dnsperf lost | A/AAAA queries | unanswered | p50 µs | p99 µs | answers per replica |\n|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n")
	for _, row := range r.Rows {
		fmt.Fprintf(w, "| %s | %s | %d | %.0f | %.0f | %.0f | %d of %d | %d | %d | %.0f | %.0f | %s |\n", row.Dataplane, row.Server, row.Replicas, row.Mean, row.Min, row.Max,
			row.Lost, row.Sent, row.Queries, row.Unanswered, row.P50, row.P99, counts(row.Backends))
	}
	if len(r.Deletions) > 0 {
		fmt.Fprintf(w, "\nA serving replica deleted (out of the EndpointSlice and killed) while 4 resolvers per pod look up every 10 ms:\n\n| dataplane | deleted | queries | unanswered | first error |\n|---|---|---:|---:|---|\n")
		for _, d := range r.Deletions {
			fmt.Fprintf(w, "| %s | %s | %d | %d | %s |\n", d.Dataplane, d.Deleted, d.Queries, d.Unanswered, d.FirstError)
		}
	}
	fmt.Fprintf(w, "\n## Targets\n\nsluice's QPS over kube-proxy iptables' at each replica count (target ≥ 1), and sluice's unanswered A/AAAA queries (target 0):\n\n| server | replicas | sluice / kube-proxy-iptables | sluice unanswered |\n|---|---:|---:|---:|\n")
	for _, srv := range c.Servers {
		for _, n := range c.Replicas {
			s, k := r.row(lab.DataplaneSluice, srv, n), r.row(lab.DataplaneKubeProxyIPTables, srv, n)
			if s == nil {
				continue
			}
			ratio := "-"
			if k != nil && k.Mean > 0 {
				ratio = fmt.Sprintf("%.2f", s.Mean/k.Mean)
			}
			unanswered := "-"
			if srv == DNSServerCoreDNS {
				unanswered = strconv.Itoa(s.Unanswered)
			}
			fmt.Fprintf(w, "| %s | %d | %s | %s |\n", srv, n, ratio, unanswered)
		}
	}
}

func (r *DNSServiceReport) row(d, server string, n int) *DNSServiceRow {
	for i := range r.Rows {
		if row := &r.Rows[i]; row.Dataplane == d && row.Server == server && row.Replicas == n {
			return row
		}
	}
	return nil
}

func counts(m map[string]int) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b string) int {
		pa, ea := netip.ParseAddrPort(a)
		pb, eb := netip.ParseAddrPort(b)
		if ea == nil && eb == nil {
			return pa.Compare(pb)
		}
		return strings.Compare(a, b)
	})
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s: %d", k, m[k])
	}
	return strings.Join(parts, ", ")
}
