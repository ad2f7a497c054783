package datapath

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

func TestParseMountinfo(t *testing.T) {
	const mountinfo = `25 30 0:23 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime shared:10 master:3 - cgroup2 cgroup2 rw
90 25 0:38 /kubepods /run/my\040cgroup rw,relatime - cgroup2 none rw
broken line
91 25 0:39 / /no/fstype rw -
`
	got, err := parseMountinfo(strings.NewReader(mountinfo))
	if err != nil {
		t.Fatal(err)
	}
	want := []mount{
		{dev: "0:23", root: "/", point: "/sys", optional: []string{"shared:7"}, fstype: "sysfs"},
		{dev: "0:38", root: "/", point: "/sys/fs/cgroup/unified", optional: []string{"shared:10", "master:3"}, fstype: "cgroup2"},
		{dev: "0:38", root: "/kubepods", point: "/run/my cgroup", optional: []string{}, fstype: "cgroup2"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("parseMountinfo =\n%+v\nwant\n%+v", got, want)
	}
}

// Mountinfo as the kernel writes it on a systemd host (every mount shared)
// and in the namespaces sluice-agent may be started in. Device numbers:
// the host's bpffs is 0:29; 0:131 and 0:140 are bpffs instances mounted
// later, in other namespaces.
const (
	hostMountinfo = `1 0 254:1 / / rw,relatime shared:1 - ext4 /dev/vda1 rw
22 1 0:21 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw
30 22 0:29 / /sys/fs/bpf rw,nosuid,nodev,noexec,relatime shared:13 - bpf bpf rw,mode=700
31 22 0:30 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 rw
`
	// ip netns exec: a copy of the host's mounts as slaves, /sys replaced
	// by a fresh sysfs (no propagation), and the agent's own bpffs on it.
	ipNetnsExecMountinfo = `2290 2289 254:1 / / rw,relatime master:1 - ext4 /dev/vda1 rw
2300 2290 0:22 / /proc rw,nosuid,nodev,noexec,relatime master:12 - proc proc rw
2315 2290 0:130 / /sys rw,relatime - sysfs sluice-test rw
2316 2315 0:131 / /sys/fs/bpf rw,relatime - bpf bpf rw,mode=700
`
	// A container with hostPath /sys/fs/bpf and mountPropagation
	// HostToContainer: the host's bpffs as a slave.
	hostToContainerMountinfo = `1830 1700 0:150 / / rw,relatime - overlay overlay rw,lowerdir=/l,upperdir=/u,workdir=/w
1840 1830 0:151 / /sys ro,nosuid,nodev,noexec,relatime - sysfs sysfs ro
1850 1840 0:29 / /sys/fs/bpf rw,nosuid,nodev,noexec,relatime master:13 - bpf bpf rw,mode=700
`
	// The same hostPath without mountPropagation (None): a private copy.
	noPropagationMountinfo = `1830 1700 0:150 / / rw,relatime - overlay overlay rw,lowerdir=/l,upperdir=/u,workdir=/w
1840 1830 0:151 / /sys ro,nosuid,nodev,noexec,relatime - sysfs sysfs ro
1850 1840 0:29 / /sys/fs/bpf rw,nosuid,nodev,noexec,relatime - bpf bpf rw,mode=700
`
	// A container whose hostPath /sys/fs/bpf is a plain sysfs directory
	// (the host has no bpffs there), with a bpffs mounted over it inside.
	containerOwnMountinfo = `1830 1700 0:150 / / rw,relatime - overlay overlay rw,lowerdir=/l,upperdir=/u,workdir=/w
1840 1830 0:151 / /sys ro,nosuid,nodev,noexec,relatime - sysfs sysfs ro
1850 1840 0:21 /fs/bpf /sys/fs/bpf rw,nosuid,nodev,noexec,relatime master:7 - sysfs sysfs rw
1870 1850 0:140 / /sys/fs/bpf rw,relatime - bpf bpf rw,mode=700
`
	// Bidirectional: the bpffs mounted in the container spread to the
	// host's /sys/fs/bpf.
	bidirectionalMountinfo = `1830 1700 0:150 / / rw,relatime - overlay overlay rw,lowerdir=/l,upperdir=/u,workdir=/w
1850 1830 0:21 /fs/bpf /sys/fs/bpf rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw
1870 1850 0:140 / /sys/fs/bpf rw,relatime shared:250 - bpf bpf rw,mode=700
`
	hostAfterBidirectionalMountinfo = hostMountinfo + `2001 30 0:140 / /sys/fs/bpf rw,relatime shared:250 - bpf bpf rw,mode=700
`
	// A bpffs mounted below /run, with a second instance stacked on the
	// host's at /sys/fs/bpf.
	stackedMountinfo = `2290 2289 254:1 / / rw,relatime master:1 - ext4 /dev/vda1 rw
2315 2290 0:21 / /sys rw,nosuid,nodev,noexec,relatime master:7 - sysfs sysfs rw
2316 2315 0:29 / /sys/fs/bpf rw,nosuid,nodev,noexec,relatime master:13 - bpf bpf rw,mode=700
2317 2316 0:131 / /sys/fs/bpf rw,relatime - bpf bpf rw,mode=700
2318 2290 0:140 / /run/sluice/bpf rw,relatime - bpf bpf rw,mode=700
`
)

func TestBPFFSScope(t *testing.T) {
	for _, tt := range []struct {
		name        string
		path, dev   string
		self, init  string
		initVisible bool
		sameNS      bool
		ownMount    bool

		want          BPFFSLifetime
		wantPoint     string
		wantHostPoint string
		wantReason    string
	}{
		{name: "host namespace (nsenter --net)", path: "/sys/fs/bpf/sluice", dev: "0:29",
			self: hostMountinfo, init: hostMountinfo, initVisible: true, sameNS: true,
			want: BPFFSHost, wantPoint: "/sys/fs/bpf", wantReason: "init mount namespace"},
		{name: "ip netns exec, own mount", path: "/sys/fs/bpf/sluice", dev: "0:131",
			self: ipNetnsExecMountinfo, init: hostMountinfo, initVisible: true, ownMount: true,
			want: BPFFSPrivate, wantPoint: "/sys/fs/bpf", wantReason: "this process mounted this bpffs (0:131)"},
		{name: "ip netns exec, mounted by a wrapper", path: "/sys/fs/bpf/sluice", dev: "0:131",
			self: ipNetnsExecMountinfo, init: hostMountinfo, initVisible: true,
			want: BPFFSPrivate, wantPoint: "/sys/fs/bpf", wantReason: "does not mount this bpffs (0:131)"},
		{name: "container with host PID, HostToContainer", path: "/sys/fs/bpf/sluice", dev: "0:29",
			self: hostToContainerMountinfo, init: hostMountinfo, initVisible: true,
			want: BPFFSHost, wantPoint: "/sys/fs/bpf", wantHostPoint: "/sys/fs/bpf", wantReason: "same bpffs (0:29)"},
		{name: "container with host PID, own mount propagated back (Bidirectional)", path: "/sys/fs/bpf/sluice", dev: "0:140",
			self: bidirectionalMountinfo, init: hostAfterBidirectionalMountinfo, initVisible: true, ownMount: true,
			want: BPFFSHost, wantPoint: "/sys/fs/bpf", wantHostPoint: "/sys/fs/bpf", wantReason: "same bpffs (0:140)"},
		{name: "container with host PID, own mount", path: "/sys/fs/bpf/sluice", dev: "0:140",
			self: containerOwnMountinfo, init: hostMountinfo, initVisible: true, ownMount: true,
			want: BPFFSPrivate, wantPoint: "/sys/fs/bpf"},
		{name: "container, HostToContainer", path: "/sys/fs/bpf/sluice", dev: "0:29",
			self: hostToContainerMountinfo,
			want: BPFFSHost, wantPoint: "/sys/fs/bpf", wantReason: "propagation (master:13)"},
		{name: "container, Bidirectional", path: "/sys/fs/bpf/sluice", dev: "0:140",
			self: bidirectionalMountinfo, ownMount: true,
			want: BPFFSHost, wantPoint: "/sys/fs/bpf", wantReason: "propagation (shared:250)"},
		{name: "container, own mount", path: "/sys/fs/bpf/sluice", dev: "0:140",
			self: containerOwnMountinfo, ownMount: true,
			want: BPFFSPrivate, wantPoint: "/sys/fs/bpf", wantReason: "no propagation"},
		{name: "container, hostPath without propagation", path: "/sys/fs/bpf/sluice", dev: "0:29",
			self: noPropagationMountinfo,
			want: BPFFSUnknown, wantPoint: "/sys/fs/bpf", wantReason: "not visible"},
		{name: "stacked over the host's", path: "/sys/fs/bpf/sluice", dev: "0:131",
			self: stackedMountinfo, init: hostMountinfo, initVisible: true, ownMount: true,
			want: BPFFSPrivate, wantPoint: "/sys/fs/bpf"},
		{name: "below /run", path: "/run/sluice/bpf/node1", dev: "0:140",
			self: stackedMountinfo, init: hostMountinfo, initVisible: true, ownMount: true,
			want: BPFFSPrivate, wantPoint: "/run/sluice/bpf"},
		{name: "a prefix is not a parent", path: "/run/sluice/bpf2", dev: "0:140",
			self: stackedMountinfo, ownMount: true,
			want: BPFFSPrivate, wantPoint: ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			v := bpffsView{path: tt.path, dev: tt.dev, initVisible: tt.initVisible, sameNS: tt.sameNS, ownMount: tt.ownMount}
			var err error
			if v.self, err = parseMountinfo(strings.NewReader(tt.self)); err != nil {
				t.Fatal(err)
			}
			if v.init, err = parseMountinfo(strings.NewReader(tt.init)); err != nil {
				t.Fatal(err)
			}
			got := v.scope()
			if got.Lifetime != tt.want || got.MountPoint != tt.wantPoint || got.HostMountPoint != tt.wantHostPoint ||
				got.Dev != tt.dev || !strings.Contains(got.Reason, tt.wantReason) {
				t.Errorf("scope of %s on %s (init visible %v, same ns %v, own mount %v) = %+v;\nwant %v at %q, host %q, reason with %q",
					tt.path, tt.dev, tt.initVisible, tt.sameNS, tt.ownMount, got, tt.want, tt.wantPoint, tt.wantHostPoint, tt.wantReason)
			}
		})
	}
}

func TestUnescapeMountinfo(t *testing.T) {
	for in, want := range map[string]string{
		`/plain`:         "/plain",
		`/a\040b`:        "/a b",
		`/tab\011x`:      "/tab\tx",
		`/back\134slash`: `/back\slash`,
		`/short\04`:      `/short\04`,
		`/notoctal\09x`:  `/notoctal\09x`,
	} {
		if got := unescapeMountinfo(in); got != want {
			t.Errorf("unescapeMountinfo(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestDefaultMapSizes(t *testing.T) {
	d := DefaultMapSizes()
	if got := (MapSizes{}).withDefaults(); got != d {
		t.Errorf("zero sizes with defaults = %+v, want %+v", got, d)
	}
	if got := (MapSizes{Services: 7}).withDefaults(); got.Services != 7 || got.Backends != d.Backends {
		t.Errorf("a set size must be kept and the rest defaulted: %+v", got)
	}
	spec, err := LoadSpec()
	if err != nil {
		t.Fatal(err)
	}
	// The object's own sizes document the defaults; keep them in step.
	for name, n := range d.byName() {
		if spec.Maps[name].MaxEntries != n {
			t.Errorf("%s: max_entries %d in bpf/lib/maps.h, default %d in Go", name, spec.Maps[name].MaxEntries, n)
		}
	}
}

func TestPrivilegedCgroupRoot(t *testing.T) {
	requireSockLB(t)
	mnt, err := Cgroup2Mount()
	if err != nil {
		t.Fatal(err)
	}
	if root, err := IsCgroupRoot(mnt); err != nil || !root {
		t.Errorf("IsCgroupRoot(%s) = %v, %v; want true", mnt, root, err)
	}
	cg := testCgroup(t)
	if root, err := IsCgroupRoot(cg); err != nil || root {
		t.Errorf("IsCgroupRoot(%s) = %v, %v; want false", cg, root, err)
	}
	if _, err := IsCgroupRoot(t.TempDir()); err == nil || !strings.Contains(err.Error(), "not on a cgroup2") {
		t.Errorf("IsCgroupRoot(tmpdir) error = %v, want not on cgroup2", err)
	}
}

func TestPrivilegedEnsureBPFFS(t *testing.T) {
	requireSockLB(t)
	// Already on bpffs: only the directory is made.
	root := testBPFRoot(t)
	dir := filepath.Join(root, "sub")
	if err := EnsureBPFFS(dir); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(dir) })
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil || st.Type != unix.BPF_FS_MAGIC {
		t.Errorf("%s: statfs type %#x, %v; want bpffs", dir, st.Type, err)
	}

	// Not on bpffs: a bpffs is mounted there.
	tmp := filepath.Join(t.TempDir(), "bpf")
	if err := EnsureBPFFS(tmp); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(tmp, 0); err != nil {
			t.Errorf("unmount %s: %v", tmp, err)
		}
	})
	if err := unix.Statfs(tmp, &st); err != nil || st.Type != unix.BPF_FS_MAGIC {
		t.Errorf("%s: statfs type %#x, %v; want bpffs", tmp, st.Type, err)
	}
}

func TestPrivilegedNetnsCookie(t *testing.T) {
	requireSockLB(t)
	a, b := newTestNetns(t), newTestNetns(t)
	ca, cb := a.cookie(t), b.cookie(t)
	if ca == 0 || cb == 0 || ca == cb {
		t.Errorf("cookies %d and %d: want two different non-zero cookies", ca, cb)
	}
	if again := a.cookie(t); again != ca {
		t.Errorf("cookie of the same netns changed: %d then %d", ca, again)
	}
}
