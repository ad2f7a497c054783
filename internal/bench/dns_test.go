package bench

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/sluice-dataplane/sluice/internal/dnsecho"
	"github.com/sluice-dataplane/sluice/internal/lab"
)

// dnsperfOutput is what Debian's dnsperf 2.10 prints after a run.
const dnsperfOutput = `DNS Performance Testing Tool
Version 2.10.0

[Status] Command line: dnsperf -s 127.0.0.1 -p 5399 -d /tmp/q.txt -l 1 -c 2 -q 10
[Status] Sending queries (to 127.0.0.1:5399)
[Status] Testing complete (time limit)

Statistics:

  Queries sent:         10491
  Queries completed:    10489 (99.98%)
  Queries lost:         2 (0.02%)

  Response codes:       NOERROR 10489 (100.00%)
  Average packet size:  request 29, response 29
  Run time (s):         1.000230
  Queries per second:   10488.587625

  Average Latency (s):  0.000108 (min 0.000014, max 0.002166)
  Latency StdDev (s):   0.000072
`

func TestParseDnsperf(t *testing.T) {
	r, err := parseDnsperf(dnsperfOutput)
	if err != nil {
		t.Fatal(err)
	}
	if r.sent != 10491 || r.completed != 10489 || r.lost != 2 {
		t.Errorf("sent/completed/lost = %d/%d/%d, want 10491/10489/2", r.sent, r.completed, r.lost)
	}
	if math.Abs(r.qps-10488.587625) > 1e-6 {
		t.Errorf("qps = %f", r.qps)
	}
	if math.Abs(r.latAvg-108) > 1e-6 || math.Abs(r.latMax-2166) > 1e-6 {
		t.Errorf("latency avg %f max %f µs, want 108 and 2166", r.latAvg, r.latMax)
	}
	// A run that printed no statistics (dnsperf failed to start) is an
	// error that shows what it printed.
	_, err = parseDnsperf("[Error] socket: Address family not supported\n")
	if err == nil || !strings.Contains(err.Error(), "Address family") {
		t.Errorf("no statistics: err = %v, want one quoting dnsperf", err)
	}
}

func TestCPUMask(t *testing.T) {
	for _, c := range []struct {
		cpus []int
		want string
	}{
		{[]int{0}, "1"}, {[]int{1}, "2"}, {[]int{0, 1}, "3"}, {[]int{7}, "80"}, {[]int{33}, "2,00000000"}, {[]int{0, 32}, "1,00000001"},
	} {
		if got := cpuMask(c.cpus); got != c.want {
			t.Errorf("cpuMask(%v) = %q, want %q", c.cpus, got, c.want)
		}
	}
}

func TestDNSPoints(t *testing.T) {
	cfg := DNSConfig{Sweeps: DNSSweeps, MaxProcesses: 3, Models: dnsecho.Models, CPUs: []int{0, 1}, Clients: 8, Outstanding: 500,
		Duration: time.Second, Runs: 1, Dataplane: lab.DataplaneNone}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	count := map[string]int{}
	for _, p := range cfg.Points() {
		count[p.Sweep]++
		if p.Sweep == DNSSweepPairs && p.Processes != 2 {
			t.Errorf("%s: %d processes, want 2", p.Label, p.Processes)
		}
		if p.Sweep != DNSSweepRPS && p.RPS != "off" {
			t.Errorf("%s %s: RPS %s, want off outside the rps sweep", p.Sweep, p.Label, p.RPS)
		}
	}
	// processes 1..3; 5 models; 2 CPUs; pairs 0+0 0+1 1+1; RPS off/0/1 × server 0/1.
	want := map[string]int{DNSSweepProcesses: 3, DNSSweepModels: len(dnsecho.Models), DNSSweepPin: 2, DNSSweepPairs: 3, DNSSweepRPS: 6}
	for s, n := range want {
		if count[s] != n {
			t.Errorf("%s: %d points, want %d", s, count[s], n)
		}
	}
	bad := cfg
	bad.Sweeps, bad.Models, bad.Duration, bad.ClientCPUs = []string{"irq"}, []string{"io_uring"}, 1500*time.Millisecond, "x"
	err := bad.Validate()
	for _, want := range []string{`"irq"`, `"io_uring"`, "whole seconds", "--client-cpus"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate() = %v, want it to name %s", err, want)
		}
	}
}

func TestShares(t *testing.T) {
	fr, said := shares([]uint64{5, 95})
	if len(fr) != 2 || math.Abs(fr[1]-0.95) > 1e-9 || said != "0:5% 1:95%" {
		t.Errorf("shares(5, 95) = %v %q, want [0.05 0.95] \"0:5%% 1:95%%\"", fr, said)
	}
	if fr, busiest := shares([]uint64{0, 0}); fr != nil || busiest != "" {
		t.Errorf("shares(0, 0) = %v %q, want nothing", fr, busiest)
	}
}

func TestDNSReportFiles(t *testing.T) {
	r := &DNSReport{Kernel: "6.18", Start: time.Unix(0, 0).UTC(), Dnsperf: "2.10.0",
		Config: DNSConfig{Runs: 2, Duration: time.Second, Clients: 8, Outstanding: 500, CPUs: []int{0, 1}}}
	for n := 1; n <= 3; n++ {
		r.Rows = append(r.Rows, DNSRow{DNSPoint: DNSPoint{Sweep: DNSSweepProcesses, Label: plural(n, "process", "processes"), Processes: n},
			QPS: []float64{float64(n) * 1000, float64(n) * 1200}, Min: float64(n) * 1000, Mean: float64(n) * 1100, Max: float64(n) * 1200})
	}
	r.Rows = append(r.Rows, DNSRow{DNSPoint: DNSPoint{Sweep: DNSSweepPin, Label: "CPU 0", Processes: 1}, Min: 900, Mean: 950, Max: 1000, NetRxCPU: "0:10% 1:90%"})
	paths, err := r.WriteFiles(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if len(paths) != 4 { // json, md, 2 plots
		t.Errorf("written %v, want json, md and a plot for each of the 2 sweeps", paths)
	}
	var md strings.Builder
	r.WriteMarkdown(&md)
	for _, want := range []string{"| 3 processes | 3000 | 3300 | 3600 |", "Best: 3 processes at 3300 queries/s, 3.00× one process", "| CPU 0 | 900 | 950 | 1000 |"} {
		if !strings.Contains(md.String(), want) {
			t.Errorf("Markdown lacks %q:\n%s", want, md.String())
		}
	}
}

func TestParseSnmpUDP(t *testing.T) {
	snmp := `Ip: Forwarding DefaultTTL
Ip: 1 64
Udp: InDatagrams NoPorts InErrors OutDatagrams RcvbufErrors SndbufErrors InCsumErrors IgnoredMulti MemErrors
Udp: 91371 0 688 91377 688 0 0 0 0
UdpLite: InDatagrams NoPorts InErrors OutDatagrams RcvbufErrors SndbufErrors InCsumErrors IgnoredMulti MemErrors
UdpLite: 0 0 0 0 5 0 0 0 0
`
	if n, err := parseSnmpUDP(snmp, "RcvbufErrors"); err != nil || n != 688 {
		t.Errorf("RcvbufErrors = %d, %v; want 688 (Udp's, not UdpLite's)", n, err)
	}
	if _, err := parseSnmpUDP("Ip: 1\n", "RcvbufErrors"); err == nil {
		t.Error("no Udp lines: want an error")
	}
}

func TestDNSServiceReport(t *testing.T) {
	cfg := DNSServiceConfig{Dataplanes: []string{lab.DataplaneSluice, lab.DataplaneKubeProxyIPTables}, Servers: DNSServers,
		Replicas: []int{1}, Duration: time.Second, Runs: 1, Clients: 1, Outstanding: 1, Lookups: 1, Resolvers: 1, Timeout: time.Second}
	if err := cfg.Validate(); err != nil {
		t.Fatalf("valid config: %v", err)
	}
	bad := cfg
	bad.Servers = []string{"bind"}
	if err := bad.Validate(); err == nil || !strings.Contains(err.Error(), `"bind"`) {
		t.Errorf("servers [bind]: %v, want an error naming it", err)
	}
	bad.Servers = nil
	if err := bad.Validate(); err == nil || !strings.Contains(err.Error(), "--servers") {
		t.Errorf("no servers: %v, want an error naming --servers", err)
	}
	r := &DNSServiceReport{Kernel: "6.18", Start: time.Unix(0, 0).UTC(), Config: cfg, Rows: []DNSServiceRow{
		{Dataplane: lab.DataplaneSluice, Server: DNSServerCoreDNS, Replicas: 1, Mean: 2000, Unanswered: 0},
		{Dataplane: lab.DataplaneKubeProxyIPTables, Server: DNSServerCoreDNS, Replicas: 1, Mean: 1000},
		{Dataplane: lab.DataplaneSluice, Server: DNSServerEcho, Replicas: 1, Mean: 3000, Backends: map[string]int{"198.18.1.11": 5}},
		{Dataplane: lab.DataplaneKubeProxyIPTables, Server: DNSServerEcho, Replicas: 1, Mean: 4000},
	}}
	var md strings.Builder
	r.WriteMarkdown(&md)
	for _, want := range []string{"| coredns | 1 | 2.00 | 0 |", "| echo | 1 | 0.75 | - |",
		"| sluice | echo | 1 | 3000 |", "198.18.1.11: 5", "dns-echo 198.19.0.54:53"} {
		if !strings.Contains(md.String(), want) {
			t.Errorf("Markdown lacks %q:\n%s", want, md.String())
		}
	}
	paths, err := r.WriteFiles(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if len(paths) != 3 {
		t.Errorf("written %v, want JSON, Markdown and a plot", paths)
	}
}
