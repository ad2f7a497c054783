package agent

import (
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
	"golang.org/x/sys/unix"
)

// parse parses args as sluice-agent would and validates them.
func parse(t testing.TB, args ...string) (*Config, error) {
	t.Helper()
	var c Config
	fs := pflag.NewFlagSet("sluice-agent", pflag.ContinueOnError)
	fs.SetOutput(new(strings.Builder))
	c.AddFlags(fs)
	if err := fs.Parse(args); err != nil {
		return &c, err
	}
	return &c, c.Validate()
}

// fakeCgroup accepts any path as a non-root cgroup2 directory: making a
// cgroup needs root, and checkCgroupRoot has its own test.
func fakeCgroup(t testing.TB) {
	t.Helper()
	old := checkCgroup
	checkCgroup = func(path string, allowRoot bool) error {
		if path == "" {
			return checkCgroupRoot(path, allowRoot)
		}
		return nil
	}
	t.Cleanup(func() { checkCgroup = old })
}

func TestConfigValid(t *testing.T) {
	fakeCgroup(t)
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	dir := t.TempDir()
	c, err := parse(t, "--node-name=node1", "--manifests="+dir, "--cgroup-root=/sys/fs/cgroup/unified/sluice-ag-x",
		"--bpf-root=/sys/fs/bpf/sluice-ag", "--api-socket=/run/sluice-ag/a.sock", "--metrics-addr=127.0.0.1:9962",
		"--healthz-bind-address=[::1]:10266", "--devices=eth0,eth+", "--lb-algorithm=maglev", "--lb-mode=dsr", "--lb-acceleration=best-effort",
		"--node-port-range=30000-30100", "--enable-bandwidth-manager", "--socket-lb=false", "--bpf-lb-map-max=1024",
		"--sync-period-min=10ms", "--sync-period=1m", "--log-level=debug",
		"--bpf-lb-maglev-table-size=251", "--bpf-lb-maglev-hash-seed=42", "--bpf-ct-gc-interval=5s", "--xdp-generic", "--unload-on-exit",
		"--bpf-ct-global-max=131072", "--bpf-nat-global-max=2048", "--bpf-lb-flow-cache-sets=256", "--bpf-map-dynamic-size-ratio=0.01",
		"--snat-port-range=20000-40000")
	if err != nil {
		t.Fatalf("Validate: %v", err)
	}
	if c.FlowCacheSets != 256 {
		t.Errorf("flow cache sets = %d, want 256", c.FlowCacheSets)
	}
	if c.HealthzAddr != "[::1]:10266" {
		t.Errorf("healthz address = %q, want [::1]:10266", c.HealthzAddr)
	}
	if c.MaglevTableSize != 251 || c.MaglevSeed != 42 || !c.MaglevSeedSet || c.CTGCInterval != 5*time.Second || !c.XDPGeneric || !c.UnloadOnExit {
		t.Errorf("north-south flags: table %d seed %d (set %v) gc %v xdp-generic %v unload %v",
			c.MaglevTableSize, c.MaglevSeed, c.MaglevSeedSet, c.CTGCInterval, c.XDPGeneric, c.UnloadOnExit)
	}
	if c.snatRange != [2]uint16{20000, 40000} {
		t.Errorf("snat port range = %v, want [20000 40000]", c.snatRange)
	}
	if c.CTMapMax != 131072 || c.NATMapMax != 2048 || c.LBMapMax != 1024 || c.MapSizeRatio != 0.01 {
		t.Errorf("map sizes: ct %d nat %d lb %d ratio %v, want 131072, 2048, 1024, 0.01", c.CTMapMax, c.NATMapMax, c.LBMapMax, c.MapSizeRatio)
	}
	if c.nodePortRange != [2]uint16{30000, 30100} {
		t.Errorf("node port range = %v, want [30000 30100]", c.nodePortRange)
	}
	want := "" // --devices makes the north-south flags take effect
	if got := strings.Join(c.NotImplemented(), " "); got != want {
		t.Errorf("NotImplemented = %q, want %q", got, want)
	}
}

func TestConfigDefaults(t *testing.T) {
	fakeCgroup(t)
	t.Setenv("NODE_NAME", "from-env")
	t.Setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
	c, err := parse(t, "--cgroup-root=/sys/fs/cgroup/unified/sluice-ag-x")
	if err != nil {
		t.Fatalf("Validate: %v", err)
	}
	if c.NodeName != "from-env" || !c.inCluster || !c.SocketLB || c.BPFRoot != DefaultBPFRoot ||
		c.SyncPeriodMin != DefaultSyncPeriodMin || len(c.NotImplemented()) != 0 ||
		c.HealthzAddr != "0.0.0.0:10256" || c.MaglevTableSize != 16381 || c.CTGCInterval != 30*time.Second || c.UnloadOnExit {
		t.Errorf("defaults: %+v", c)
	}
	// The seed is derived per cluster and the nat ports chosen at start
	// unless given.
	if c.MaglevSeedSet || c.MaglevSeed != 0 || c.SNATRange != "" || c.snatRange != [2]uint16{} {
		t.Errorf("seed %d (set %v), snat port range %q %v: want unset", c.MaglevSeed, c.MaglevSeedSet, c.SNATRange, c.snatRange)
	}
	// Map sizes are derived from memory unless given.
	if c.LBMapMax != 0 || c.CTMapMax != 0 || c.NATMapMax != 0 || c.MapSizeRatio != 0.0025 {
		t.Errorf("map size defaults: lb %d ct %d nat %d ratio %v, want 0, 0, 0 (derive) and 0.0025",
			c.LBMapMax, c.CTMapMax, c.NATMapMax, c.MapSizeRatio)
	}
}

func TestConfigInvalid(t *testing.T) {
	fakeCgroup(t)
	t.Setenv("NODE_NAME", "")
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	dir := t.TempDir()
	file := filepath.Join(dir, "f.yaml")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	base := []string{"--node-name=node1", "--manifests=" + dir, "--cgroup-root=/sys/fs/cgroup/unified/sluice-ag-x"}
	for _, tc := range []struct {
		name string
		args []string // added to base, unless they start with --node-name
		want string
	}{
		{"node-name missing", []string{"--node-name=", "--manifests=" + dir, "--cgroup-root=/x"}, `--node-name="": required`},
		{"node-name syntax", []string{"--node-name=Node_1", "--manifests=" + dir, "--cgroup-root=/x"}, "--node-name=Node_1:"},
		{"no source", []string{"--node-name=n", "--cgroup-root=/x"}, "--kubeconfig or --manifests: one is required"},
		{"two sources", []string{"--kubeconfig=" + file}, "give only one source"},
		{"manifests missing", []string{"--node-name=n", "--cgroup-root=/x", "--manifests=" + dir + "/nope"}, "--manifests=" + dir + "/nope:"},
		{"manifests file", []string{"--node-name=n", "--cgroup-root=/x", "--manifests=" + file}, "--manifests=" + file + ": not a directory"},
		{"kubeconfig missing", []string{"--node-name=n", "--cgroup-root=/x", "--kubeconfig=/nonexistent/kc"}, "--kubeconfig=/nonexistent/kc:"},
		{"cgroup-root missing", []string{"--node-name=n", "--manifests=" + dir}, `--cgroup-root="": required`},
		{"bpf-root relative", []string{"--bpf-root=sluice"}, "--bpf-root=sluice: must be an absolute path"},
		{"api-socket relative", []string{"--api-socket=a.sock"}, "--api-socket=a.sock: must be an absolute path"},
		{"api-socket long", []string{"--api-socket=/" + strings.Repeat("a", 120)}, "longer than a unix socket path"},
		{"metrics-addr no port", []string{"--metrics-addr=localhost"}, "--metrics-addr=localhost: want host:port"},
		{"metrics-addr bad port", []string{"--metrics-addr=:99999"}, `--metrics-addr=:99999: invalid port "99999"`},
		{"healthz-bind-address no port", []string{"--healthz-bind-address=0.0.0.0"}, "--healthz-bind-address=0.0.0.0: want host:port"},
		{"healthz-bind-address bad port", []string{"--healthz-bind-address=:70000"}, `--healthz-bind-address=:70000: invalid port "70000"`},
		{"healthz-bind-address host name", []string{"--healthz-bind-address=node1:10256"}, `--healthz-bind-address=node1:10256: host "node1" is not an IP address`},
		{"devices slash", []string{"--devices=eth0,a/b"}, "--devices=a/b:"},
		{"devices long", []string{"--devices=abcdefghijklmnopq"}, "--devices=abcdefghijklmnopq: longer than 15 bytes"},
		{"devices empty", []string{"--devices=eth0,,eth1"}, `--devices="": empty device name`},
		{"nodeport-addresses not a CIDR", []string{"--nodeport-addresses=10.0.0.0/8,10.1.2.3"}, "--nodeport-addresses=10.1.2.3: want a CIDR"},
		{"nodeport-addresses primary and CIDRs", []string{"--nodeport-addresses=primary,10.0.0.0/8"}, "primary stands alone"},
		{"lb-algorithm", []string{"--lb-algorithm=roundrobin"}, "--lb-algorithm=roundrobin: want one of random, maglev"},
		{"lb-mode", []string{"--lb-mode=dnat"}, "--lb-mode=dnat: want one of snat, dsr, hybrid"},
		{"dsr-dispatch", []string{"--dsr-dispatch=geneve"}, "--dsr-dispatch=geneve: want one of ipip, gue"},
		{"dsr-gue-port zero", []string{"--dsr-gue-port=0"}, "--dsr-gue-port=0: want a UDP port from 1 to 65535"},
		{"lb-acceleration", []string{"--lb-acceleration=generic"}, "--lb-acceleration=generic: want one of disabled, native, best-effort"},
		{"log-level", []string{"--log-level=trace"}, "--log-level=trace: want one of debug, info, warn, error"},
		{"node-port-range reversed", []string{"--node-port-range=32000-31000"}, "--node-port-range=32000-31000: MIN 32000 is above MAX 31000"},
		{"node-port-range syntax", []string{"--node-port-range=30000:32767"}, "--node-port-range=30000:32767: want MIN-MAX"},
		{"node-port-range zero", []string{"--node-port-range=0-10"}, "--node-port-range=0-10: want MIN-MAX"},
		{"node-port-range leaves no nat ports", []string{"--node-port-range=30000-65000"},
			"--node-port-range=30000-65000: want MAX at most 64511: the ports above it are for SNAT (at least 1024)"},
		{"bpf-lb-map-max small", []string{"--bpf-lb-map-max=1"}, "--bpf-lb-map-max=1: want 0 (sized from memory) or 16 to 16777216"},
		{"bpf-lb-map-max syntax", []string{"--bpf-lb-map-max=lots"}, `invalid argument "lots" for "--bpf-lb-map-max"`},
		{"sync-period-min negative", []string{"--sync-period-min=-1s"}, "--sync-period-min=-1s: want 0 to 1m"},
		{"sync-period-min syntax", []string{"--sync-period-min=soon"}, `invalid argument "soon" for "--sync-period-min"`},
		{"sync-period short", []string{"--sync-period=10ms"}, "--sync-period=10ms: want at least 1s"},
		{"k8s-sync-timeout short", []string{"--k8s-sync-timeout=100ms"}, "--k8s-sync-timeout=100ms: want 1s to 1h"},
		{"socket-lb syntax", []string{"--socket-lb=maybe"}, `invalid argument "maybe" for "--socket-lb"`},
		{"ct map small", []string{"--bpf-ct-global-max=100"}, "--bpf-ct-global-max=100: want 0 (sized from memory) or 1024 to 16777216"},
		{"map size ratio negative", []string{"--bpf-map-dynamic-size-ratio=-0.1"}, "--bpf-map-dynamic-size-ratio=-0.1: want 0 (fixed sizes) to 1"},
		{"map size ratio above 1", []string{"--bpf-map-dynamic-size-ratio=1.5"}, "--bpf-map-dynamic-size-ratio=1.5: want 0 (fixed sizes) to 1"},
		{"map size ratio NaN", []string{"--bpf-map-dynamic-size-ratio=NaN"}, "--bpf-map-dynamic-size-ratio=NaN: want 0 (fixed sizes) to 1"},
		{"map size ratio syntax", []string{"--bpf-map-dynamic-size-ratio=some"}, `invalid argument "some" for "--bpf-map-dynamic-size-ratio"`},
		{"flow cache not a power of two", []string{"--bpf-lb-flow-cache-sets=1000"},
			"--bpf-lb-flow-cache-sets=1000: want 0 (off) or a power of two from 16 to 65536"},
		{"nat map large", []string{"--bpf-nat-global-max=16777217"}, "--bpf-nat-global-max=16777217: want 0 (sized from memory) or 1024 to 16777216"},
		{"maglev table size not prime", []string{"--bpf-lb-maglev-table-size=16380"}, "--bpf-lb-maglev-table-size=16380: want a prime from 251 to 131071"},
		{"maglev table size small", []string{"--bpf-lb-maglev-table-size=13"}, "--bpf-lb-maglev-table-size=13: want a prime"},
		{"maglev table size large", []string{"--bpf-lb-maglev-table-size=131101"}, "--bpf-lb-maglev-table-size=131101: want a prime"},
		{"maglev hash seed syntax", []string{"--bpf-lb-maglev-hash-seed=-1"}, `invalid argument "-1" for "--bpf-lb-maglev-hash-seed"`},
		{"maglev hash seed too large", []string{"--bpf-lb-maglev-hash-seed=4294967296"}, `invalid argument "4294967296" for "--bpf-lb-maglev-hash-seed"`},
		{"snat-port-range syntax", []string{"--snat-port-range=high"}, "--snat-port-range=high: want MIN-MAX"},
		{"snat-port-range well-known ports", []string{"--snat-port-range=80-5000"}, "--snat-port-range=80-5000: want MIN at least 1024"},
		{"snat-port-range inside the node ports", []string{"--snat-port-range=30000-32767"},
			"--snat-port-range=30000-32767: 0 ports are left outside --node-port-range=30000-32767, want at least 1024"},
		{"snat-port-range mostly node ports", []string{"--node-port-range=30000-32767", "--snat-port-range=29000-32767"},
			"--snat-port-range=29000-32767: 1000 ports are left outside --node-port-range=30000-32767, want at least 1024"},
		{"xdp-generic without acceleration", []string{"--xdp-generic"}, "--xdp-generic=true: needs --lb-acceleration=native or best-effort"},
		{"ct gc interval short", []string{"--bpf-ct-gc-interval=10ms"}, "--bpf-ct-gc-interval=10ms: want 1s to 1h"},
		{"ct timeout fraction", []string{"--bpf-ct-timeout-regular-tcp=1.5s"}, "--bpf-ct-timeout-regular-tcp=1.5s: want whole seconds"},
		{"ct timeout zero", []string{"--bpf-ct-timeout-regular-any=0s"}, "--bpf-ct-timeout-regular-any=0s: want whole seconds"},
		{"bandwidth manager syntax", []string{"--enable-bandwidth-manager=sometimes"}, `invalid argument "sometimes" for "--enable-bandwidth-manager"`},
		{"bbr without the bandwidth manager", []string{"--enable-bbr"}, "--enable-bbr=true: needs --enable-bandwidth-manager"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append(append([]string{}, base...), tc.args...)
			if strings.HasPrefix(tc.args[0], "--node-name=") {
				args = tc.args
			}
			_, err := parse(t, args...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("args %q: error %v, want it to contain %q", args, err, tc.want)
			}
		})
	}
}

func TestCheckCgroupRoot(t *testing.T) {
	if err := checkCgroupRoot("relative/path", false); err == nil || !strings.Contains(err.Error(), "absolute") {
		t.Errorf("relative path: %v", err)
	}
	if err := checkCgroupRoot(t.TempDir(), false); err == nil || !strings.Contains(err.Error(), "not on a cgroup2 filesystem") {
		t.Errorf("temp dir: %v, want not on cgroup2", err)
	}
	var st unix.Statfs_t
	root := "/sys/fs/cgroup/unified"
	if unix.Statfs(root, &st) != nil || st.Type != unix.CGROUP2_SUPER_MAGIC {
		root = "/sys/fs/cgroup"
		if unix.Statfs(root, &st) != nil || st.Type != unix.CGROUP2_SUPER_MAGIC {
			t.Fatal("no cgroup2 hierarchy at /sys/fs/cgroup/unified or /sys/fs/cgroup (the socket LB needs one)")
		}
	}
	if err := checkCgroupRoot(root, false); err == nil || !strings.Contains(err.Error(), "root of a cgroup2 hierarchy") {
		t.Errorf("%s: %v, want refused as hierarchy root", root, err)
	}
	if err := checkCgroupRoot(root, true); err != nil {
		t.Errorf("%s with --allow-cgroup-root: %v", root, err)
	}
}

func TestParsePortRange(t *testing.T) {
	for in, want := range map[string][2]uint16{"30000-32767": {30000, 32767}, "80": {80, 80}, "1-65535": {1, 65535}} {
		if got, err := ParsePortRange(in); err != nil || got != want {
			t.Errorf("ParsePortRange(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"", "-", "a-b", "0-1", "1-65536", "5-4"} {
		if got, err := ParsePortRange(in); err == nil {
			t.Errorf("ParsePortRange(%q) = %v, want an error", in, got)
		}
	}
}

// --nodeport-addresses: every local address but loopback and link-local by
// default, those inside the CIDRs, or none besides the InternalIPs with
// primary.
func TestConfigNodePortAddresses(t *testing.T) {
	fakeCgroup(t)
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	dir := t.TempDir()
	addrs := []string{"198.18.0.11", "10.1.2.3", "fd00:198:18::11", "127.0.0.1", "::1", "fe80::1", "169.254.1.1", "::ffff:10.1.2.4"}
	for _, tc := range []struct {
		flag string
		want []string
	}{
		{"", []string{"198.18.0.11", "10.1.2.3", "fd00:198:18::11", "::ffff:10.1.2.4"}},
		{"--nodeport-addresses=10.0.0.0/8,fd00::/8", []string{"10.1.2.3", "fd00:198:18::11", "::ffff:10.1.2.4"}},
		{"--nodeport-addresses=primary", nil},
	} {
		args := []string{"--node-name=node1", "--manifests=" + dir, "--cgroup-root=/sys/fs/cgroup/unified/sluice-ag-x"}
		if tc.flag != "" {
			args = append(args, tc.flag)
		}
		c, err := parse(t, args...)
		if err != nil {
			t.Fatalf("%s: %v", tc.flag, err)
		}
		var got []string
		for _, a := range addrs {
			if c.nodePortAddress(netip.MustParseAddr(a)) {
				got = append(got, a)
			}
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("%q: NodePort addresses %v, want %v", tc.flag, got, tc.want)
		}
	}
}

// An address announced again (new flags, lifetimes) and deleted once is
// gone; one on two links stays until both lose it.
func TestLinkAddrs(t *testing.T) {
	a, b := netip.MustParseAddr("198.18.0.240"), netip.MustParseAddr("fd00:198:18::240")
	s := linkAddrs{}
	s.update(2, a, true)
	s.update(2, a, true) // RTM_NEWADDR again: DAD done, lifetime refreshed
	s.update(3, b, true)
	s.update(4, b, true)
	if got := s.list(); !slices.Equal(got, []netip.Addr{a, b}) {
		t.Errorf("list %v, want [%s %s]", got, a, b)
	}
	s.update(2, a, false)
	s.update(3, b, false)
	if got := s.list(); !slices.Equal(got, []netip.Addr{b}) {
		t.Errorf("after deletes: list %v, want [%s] (still on link 4)", got, b)
	}
}
