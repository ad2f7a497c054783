// Package controlplane runs a real Kubernetes control plane for the lab and
// its tests: Debian's etcd and the kube-apiserver that scripts/k8s-build.sh
// builds from the pinned k8s.io/kubernetes release, optionally inside a
// network namespace. See README.md.
package controlplane

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// Version is the Kubernetes release pinned in third_party/k8s/go.mod (a
// unit test keeps the two equal).
const Version = "v1.33.13"

// ServiceCIDRs are the apiserver's --service-cluster-ip-range: the lab's
// ClusterIP ranges (BRIEF section 3).
var ServiceCIDRs = []netip.Prefix{
	netip.MustParsePrefix("198.19.0.0/17"),
	netip.MustParsePrefix("fd00:198:19::/108"),
}

// ErrNotBuilt says kube-apiserver or kube-proxy is not where BinDir looks.
var ErrNotBuilt = errors.New("kube-apiserver and kube-proxy are not built (run ./scripts/k8s-build.sh)")

// ErrNoEtcd says etcd is not installed.
var ErrNoEtcd = errors.New("etcd is not installed (run ./scripts/etcd.sh)")

// BinDir returns the directory holding kube-apiserver and kube-proxy:
// $SLUICE_K8S_BIN_DIR, else ${SLUICE_CACHE:-/var/cache/sluice}/k8s/<Version>/bin,
// what scripts/k8s-build.sh fills.
func BinDir() (string, error) {
	dir := os.Getenv("SLUICE_K8S_BIN_DIR")
	if dir == "" {
		cache := os.Getenv("SLUICE_CACHE")
		if cache == "" {
			cache = "/var/cache/sluice"
		}
		dir = filepath.Join(cache, "k8s", Version, "bin")
	}
	for _, b := range []string{"kube-apiserver", "kube-proxy"} {
		p := filepath.Join(dir, b)
		st, err := os.Stat(p)
		if err != nil {
			return "", fmt.Errorf("%w: %v", ErrNotBuilt, err)
		}
		if st.IsDir() || st.Mode().Perm()&0o111 == 0 {
			return "", fmt.Errorf("%w: %s is not an executable file", ErrNotBuilt, p)
		}
	}
	return dir, nil
}

// EtcdBin returns the etcd binary: etcd in $PATH, else /usr/bin/etcd (where
// Debian's etcd-server puts it).
func EtcdBin() (string, error) {
	if p, err := exec.LookPath("etcd"); err == nil {
		return p, nil
	}
	const p = "/usr/bin/etcd"
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("%w: %v", ErrNoEtcd, err)
	}
	return p, nil
}

// Options configures Start.
type Options struct {
	// Dir is the state dir: etcd data, certificates, tokens, kubeconfig and
	// logs (required; created when missing).
	Dir string
	// NetNS is the path of a network namespace (/run/netns/X) to run etcd
	// and the apiserver in; "" runs them in the caller's.
	NetNS string
	// Address is the listen address of both (default 127.0.0.1).
	Address netip.Addr
	// APIPort is the apiserver's secure port (default 6443).
	APIPort int
	// EtcdPort is etcd's client port (default 2379); its peer port is one
	// above.
	EtcdPort int
	// Cgroup, when set, is a cgroup v2 directory etcd and the apiserver are
	// started in (CLONE_INTO_CGROUP), so a benchmark can account for them.
	Cgroup string
	// Progress receives one line per step; nil discards them.
	Progress io.Writer
	// Controllers also runs kube-controller-manager and kube-scheduler,
	// with the ServiceAccount admission plugin on, as a cluster whose
	// nodes run a kubelet needs (DaemonSets, Deployments, EndpointSlices
	// of selector Services, service-account tokens): the kubelet lab.
	Controllers bool
	// Nodes are the kubelets' node names: each gets a static token as
	// system:node:NAME in system:nodes (the Node authorizer's user) and
	// a kubeconfig from NodeKubeconfig.
	Nodes []string
}

func (o *Options) setDefaults() error {
	if o.Dir == "" {
		return errors.New("control plane: Options.Dir is required")
	}
	if !o.Address.IsValid() {
		o.Address = netip.AddrFrom4([4]byte{127, 0, 0, 1})
	}
	if o.APIPort == 0 {
		o.APIPort = 6443
	}
	if o.EtcdPort == 0 {
		o.EtcdPort = 2379
	}
	for _, p := range []struct {
		name string
		v    int
	}{{"APIPort", o.APIPort}, {"EtcdPort", o.EtcdPort}, {"EtcdPort+1 (peer)", o.EtcdPort + 1}} {
		if p.v < 1 || p.v > 65535 {
			return fmt.Errorf("control plane: %s %d: want 1..65535", p.name, p.v)
		}
	}
	if o.APIPort == o.EtcdPort || o.APIPort == o.EtcdPort+1 {
		return fmt.Errorf("control plane: APIPort %d collides with etcd's ports %d and %d", o.APIPort, o.EtcdPort, o.EtcdPort+1)
	}
	if o.NetNS != "" {
		if _, err := os.Stat(o.NetNS); err != nil {
			return fmt.Errorf("control plane: NetNS %q: %w", o.NetNS, err)
		}
	}
	if o.Progress == nil {
		o.Progress = io.Discard
	}
	return nil
}

// State is what the state dir's controlplane.json records, so that another
// process (a later `sluice-lab down`) can reach or stop the control plane.
type State struct {
	Dir          string     `json:"dir"`
	NetNS        string     `json:"netns,omitempty"`
	Address      netip.Addr `json:"address"`
	APIPort      int        `json:"apiPort"`
	EtcdPort     int        `json:"etcdPort"`
	Version      string     `json:"version"`
	EtcdPID      int        `json:"etcdPid"`
	APIServerPID int        `json:"apiserverPid"`
	// ControllerManagerPID and SchedulerPID are set with Options.Controllers.
	ControllerManagerPID int    `json:"controllerManagerPid,omitempty"`
	SchedulerPID         int    `json:"schedulerPid,omitempty"`
	EtcdLog              string `json:"etcdLog"`
	APIServerLog         string `json:"apiserverLog"`
	// ControllerManagerLog and SchedulerLog are set with Options.Controllers.
	ControllerManagerLog string `json:"controllerManagerLog,omitempty"`
	SchedulerLog         string `json:"schedulerLog,omitempty"`
	Kubeconfig           string `json:"kubeconfig"`
}

const stateFile = "controlplane.json"

// ControlPlane is a running etcd and kube-apiserver.
type ControlPlane struct {
	st    State
	token string
	caPEM []byte

	mu       sync.Mutex
	children map[int]chan struct{} // started here: closed when reaped
	stopped  bool

	restOnce sync.Once
	rest     *rest.Config
	client   kubernetes.Interface
	clientEr error
}

func (c *ControlPlane) step(w io.Writer, format string, args ...any) {
	fmt.Fprintf(w, "==> control plane: "+format+"\n", args...)
}

// Start starts etcd and kube-apiserver and returns once the apiserver's
// /readyz says ok. On failure it stops what it started and the error
// carries the tail of the failing process's log.
func Start(ctx context.Context, o Options) (*ControlPlane, error) {
	if err := o.setDefaults(); err != nil {
		return nil, err
	}
	bin, err := BinDir()
	if err != nil {
		return nil, err
	}
	etcdBin, err := EtcdBin()
	if err != nil {
		return nil, err
	}
	dir, err := filepath.Abs(o.Dir)
	if err != nil {
		return nil, fmt.Errorf("control plane: dir %q: %w", o.Dir, err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("control plane: create %s: %w", dir, err)
	}
	c := &ControlPlane{
		st: State{Dir: dir, NetNS: o.NetNS, Address: o.Address, APIPort: o.APIPort, EtcdPort: o.EtcdPort,
			Version: Version, EtcdLog: filepath.Join(dir, "etcd.log"), APIServerLog: filepath.Join(dir, "apiserver.log"),
			Kubeconfig: filepath.Join(dir, kubeconfigFile)},
		children: map[int]chan struct{}{},
	}
	if err := c.start(ctx, o, bin, etcdBin); err != nil {
		if serr := c.Stop(); serr != nil {
			err = errors.Join(err, fmt.Errorf("stop: %w", serr))
		}
		return nil, err
	}
	return c, nil
}

func (c *ControlPlane) start(ctx context.Context, o Options, bin, etcdBin string) error {
	dir := c.st.Dir
	c.step(o.Progress, "writing CA, serving certificate, service-account keys and token to %s", dir)
	creds, err := writeCredentials(dir, o.Address, o.Nodes)
	if err != nil {
		return err
	}
	c.token, c.caPEM = creds.token, creds.caPEM
	if err := c.writeKubeconfig(); err != nil {
		return err
	}
	if err := c.save(); err != nil {
		return err
	}

	etcdURL := "http://" + netip.AddrPortFrom(o.Address, uint16(o.EtcdPort)).String()
	peerURL := "http://" + netip.AddrPortFrom(o.Address, uint16(o.EtcdPort+1)).String()
	dataDir := filepath.Join(dir, "etcd")
	if err := os.MkdirAll(dataDir, 0o700); err != nil {
		return fmt.Errorf("control plane: create %s: %w", dataDir, err)
	}
	c.step(o.Progress, "starting etcd on %s (%s, data in memory)", etcdURL, etcdBin)
	// The lab's etcd keeps its data on a tmpfs of its own mount namespace:
	// the state is disposable, and on a loaded machine (parallel lab tests,
	// a TCG guest) a disk's fsync took etcd past its 7 s request timeout,
	// which kube-apiserver's start-up hooks treat as fatal. The tmpfs
	// lives and dies with the process: nothing to unmount on any exit.
	pid, err := c.startProcess(o, c.st.EtcdLog, "unshare", "--mount", "--propagation=private", "--",
		"sh", "-c", `mount -t tmpfs -o mode=0700 sluice-etcd "$0" && exec "$@"`, dataDir,
		etcdBin,
		"--name=sluice",
		"--data-dir="+dataDir,
		// A request times out after 5 s + 2 election timeouts: 15 s
		// rides out a starved CPU. One member: no election to slow.
		"--heartbeat-interval=500", "--election-timeout=5000",
		"--listen-client-urls="+etcdURL,
		"--advertise-client-urls="+etcdURL,
		"--listen-peer-urls="+peerURL,
		"--initial-advertise-peer-urls="+peerURL,
		"--initial-cluster=sluice="+peerURL,
		"--logger=zap", "--log-level=warn",
		// 10,000 Services with their EndpointSlices and revisions fit
		// many times over; the default 2 GiB quota would too, but an alarm
		// mid-benchmark is worse than disk use.
		"--quota-backend-bytes="+strconv.FormatInt(8<<30, 10),
		// Snapshot (and free the raft log in memory) every 10,000
		// entries instead of 100,000: bulk creates stay light on RAM.
		"--snapshot-count=10000",
	)
	if err != nil {
		return err
	}
	c.st.EtcdPID = pid
	if err := c.save(); err != nil {
		return err
	}

	apiURL := "https://" + netip.AddrPortFrom(o.Address, uint16(o.APIPort)).String()
	cidrs := make([]string, len(ServiceCIDRs))
	for i, p := range ServiceCIDRs {
		cidrs[i] = p.String()
	}
	c.step(o.Progress, "starting kube-apiserver %s on %s", Version, apiURL)
	pid, err = c.startProcess(o, c.st.APIServerLog, filepath.Join(bin, "kube-apiserver"),
		"--etcd-servers="+etcdURL,
		"--bind-address="+o.Address.String(),
		"--advertise-address="+o.Address.String(),
		"--secure-port="+strconv.Itoa(o.APIPort),
		"--tls-cert-file="+filepath.Join(dir, servingCertFile),
		"--tls-private-key-file="+filepath.Join(dir, servingKeyFile),
		"--cert-dir="+filepath.Join(dir, "certs"),
		"--token-auth-file="+filepath.Join(dir, tokensFile),
		// Node: kubelets (system:node:NAME) reach only their own node's
		// objects, as in kubeadm's clusters.
		"--authorization-mode=Node,RBAC",
		// Kubelets register with their node name as Hostname, which
		// nothing resolves: exec and logs go to the InternalIP.
		"--kubelet-preferred-address-types=InternalIP,Hostname",
		// As every cluster that runs kube-proxy (a privileged DaemonSet);
		// deploy/'s dry runs include the chart's privileged bpffs mounter.
		"--allow-privileged=true",
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file="+filepath.Join(dir, saPubFile),
		"--service-account-signing-key-file="+filepath.Join(dir, saKeyFile),
		"--service-cluster-ip-range="+strings.Join(cidrs, ","),
		admission(o.Controllers),
		"--profiling=false",
		// Benchmarks create 10,000 Services and their slices as fast as the
		// client can; the admin is exempt from priority and fairness, and
		// these raise the plain in-flight limits other clients hit.
		"--max-requests-inflight=1000",
		"--max-mutating-requests-inflight=500",
	)
	if err != nil {
		return err
	}
	c.st.APIServerPID = pid
	if err := c.save(); err != nil {
		return err
	}

	start := time.Now()
	if err := c.waitReady(ctx, apiServerReadyWithin); err != nil {
		return err
	}
	c.step(o.Progress, "kube-apiserver is ready after %.1fs (%s, kubeconfig %s)", time.Since(start).Seconds(),
		apiURL, c.st.Kubeconfig)
	if o.Controllers {
		return c.startControllers(o, bin)
	}
	return nil
}

// admission is the apiserver's admission flag: without a controller-manager
// nothing creates the "default" ServiceAccount every Pod would need, so the
// plugin is off; with one it is on, as in every real cluster, and Pods get
// their projected service-account token.
func admission(controllers bool) string {
	if controllers {
		return "--enable-admission-plugins=ServiceAccount,NodeRestriction"
	}
	return "--disable-admission-plugins=ServiceAccount"
}

// startControllers runs kube-controller-manager (DaemonSets, ReplicaSets,
// EndpointSlices, service accounts, the root CA ConfigMap, garbage
// collection, node lifecycle; no node IPAM: the lab's CNI has its own
// ranges) and kube-scheduler, both as the admin, without leader election.
func (c *ControlPlane) startControllers(o Options, bin string) error {
	dir := c.st.Dir
	c.st.ControllerManagerLog = filepath.Join(dir, "controller-manager.log")
	c.st.SchedulerLog = filepath.Join(dir, "scheduler.log")
	c.step(o.Progress, "starting kube-controller-manager and kube-scheduler %s", Version)
	pid, err := c.startProcess(o, c.st.ControllerManagerLog, filepath.Join(bin, "kube-controller-manager"),
		"--kubeconfig="+c.st.Kubeconfig,
		"--authentication-kubeconfig="+c.st.Kubeconfig,
		"--authorization-kubeconfig="+c.st.Kubeconfig,
		"--bind-address="+o.Address.String(),
		"--leader-elect=false",
		"--use-service-account-credentials=false",
		"--service-account-private-key-file="+filepath.Join(dir, saKeyFile),
		"--root-ca-file="+filepath.Join(dir, caCertFile),
		"--controllers=*,-nodeipam,-cloud-node-lifecycle,-service-lb-controller,-route",
		"--cluster-name=sluice-lab",
		"--profiling=false",
	)
	if err != nil {
		return err
	}
	c.st.ControllerManagerPID = pid
	if err := c.save(); err != nil {
		return err
	}
	pid, err = c.startProcess(o, c.st.SchedulerLog, filepath.Join(bin, "kube-scheduler"),
		"--kubeconfig="+c.st.Kubeconfig,
		"--authentication-kubeconfig="+c.st.Kubeconfig,
		"--authorization-kubeconfig="+c.st.Kubeconfig,
		"--bind-address="+o.Address.String(),
		"--leader-elect=false",
		"--profiling=false",
	)
	if err != nil {
		return err
	}
	c.st.SchedulerPID = pid
	return c.save()
}

// NodeKubeconfig writes (once) and returns the path of a kubeconfig for
// node's kubelet: the node's static token (Options.Nodes), the lab CA.
func (c *ControlPlane) NodeKubeconfig(node string) (string, error) {
	tokens, err := os.ReadFile(filepath.Join(c.st.Dir, tokensFile))
	if err != nil {
		return "", fmt.Errorf("control plane tokens: %w", err)
	}
	user := nodeUser(node)
	var token string
	for _, line := range strings.Split(string(tokens), "\n") {
		f := strings.Split(line, ",")
		if len(f) >= 2 && f[1] == user {
			token = f[0]
		}
	}
	if token == "" {
		return "", fmt.Errorf("control plane has no credentials for node %q (not in Options.Nodes when it started)", node)
	}
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["lab"] = &clientcmdapi.Cluster{Server: c.URL(), CertificateAuthorityData: c.caPEM}
	cfg.AuthInfos[user] = &clientcmdapi.AuthInfo{Token: token}
	cfg.Contexts["lab"] = &clientcmdapi.Context{Cluster: "lab", AuthInfo: user}
	cfg.CurrentContext = "lab"
	path := filepath.Join(c.st.Dir, "kubeconfig-"+node)
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		return "", fmt.Errorf("write %s: %w", path, err)
	}
	return path, os.Chmod(path, 0o600)
}

// CACert is the path of the lab CA's certificate.
func (c *ControlPlane) CACert() string { return filepath.Join(c.st.Dir, caCertFile) }

// startProcess starts a daemon in the netns (entered with nsenter, as the
// lab does) and cgroup of o, in its own process group so that a Ctrl-C in
// the terminal reaches only the caller, which then stops it in order.
func (c *ControlPlane) startProcess(o Options, log, bin string, args ...string) (int, error) {
	CloseInheritedOnExec()
	out, err := os.OpenFile(log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return 0, fmt.Errorf("open log: %w", err)
	}
	defer out.Close()
	argv := append([]string{bin}, args...)
	if o.NetNS != "" {
		argv = append([]string{"nsenter", "--net=" + o.NetNS, "--"}, argv...)
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if o.Cgroup != "" {
		fd, err := syscall.Open(o.Cgroup, syscall.O_RDONLY|syscall.O_DIRECTORY|syscall.O_CLOEXEC, 0)
		if err != nil {
			return 0, fmt.Errorf("open cgroup %s: %w", o.Cgroup, err)
		}
		defer syscall.Close(fd)
		cmd.SysProcAttr.UseCgroupFD, cmd.SysProcAttr.CgroupFD = true, fd
	}
	if err := cmd.Start(); err != nil {
		return 0, fmt.Errorf("start %s: %w", filepath.Base(bin), err)
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(done)
	}()
	c.mu.Lock()
	c.children[cmd.Process.Pid] = done
	c.mu.Unlock()
	return cmd.Process.Pid, nil
}

var cloexecOnce sync.Once

// CloseInheritedOnExec marks every descriptor above stderr close-on-exec.
// Go's own are already; the others came from the caller (a `flock LOCK
// sluice-lab up` passes its lock descriptor) and would otherwise live on in
// every daemon, holding the lock until the lab is down. Linux 5.11
// (close_range with CLOSE_RANGE_CLOEXEC); older kernels keep the leak.
func CloseInheritedOnExec() {
	cloexecOnce.Do(func() { _ = unix.CloseRange(3, ^uint(0), unix.CLOSE_RANGE_CLOEXEC) })
}

// apiServerReadyWithin bounds kube-apiserver's start: a few seconds on a
// host, but its RBAC bootstrap alone took over a minute in a TCG guest
// (the kernel matrix's ipvs suite) while the host was busy.
const apiServerReadyWithin = 3 * time.Minute

// waitReady polls /readyz until it says ok and the Service
// default/kubernetes exists, a process exits or the timeout
// passes.
func (c *ControlPlane) waitReady(ctx context.Context, timeout time.Duration) error {
	cs, err := c.clientset()
	if err != nil {
		return err
	}
	deadline := time.Now().Add(timeout)
	var last error
	for {
		if !ProcessAlive(c.st.EtcdPID) {
			return fmt.Errorf("etcd exited; log %s:\n%s", c.st.EtcdLog, logTail(c.st.EtcdLog, 30))
		}
		if !ProcessAlive(c.st.APIServerPID) {
			return fmt.Errorf("kube-apiserver exited; log %s:\n%s", c.st.APIServerLog, logTail(c.st.APIServerLog, 30))
		}
		rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		body, err := cs.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(rctx)
		cancel()
		if err == nil && string(body) == "ok" {
			// The bootstrap controller creates default/kubernetes just
			// after /readyz turns ok; with it, ClusterIP allocation works.
			rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			_, err = cs.CoreV1().Services("default").Get(rctx, "kubernetes", metav1.GetOptions{})
			cancel()
			if err == nil {
				return nil
			}
			body = []byte("ok, but service default/kubernetes: " + err.Error())
		}
		if err == nil {
			err = fmt.Errorf("/readyz: %q", body)
		}
		last = err
		if time.Now().After(deadline) {
			return fmt.Errorf("kube-apiserver not ready after %s (%v); log %s:\n%s", timeout, last,
				c.st.APIServerLog, logTail(c.st.APIServerLog, 30))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// Attach returns the control plane recorded in dir by an earlier Start,
// possibly in another process, to reach it or stop it.
func Attach(dir string) (*ControlPlane, error) {
	data, err := os.ReadFile(filepath.Join(dir, stateFile))
	if err != nil {
		return nil, fmt.Errorf("control plane in %s: %w", dir, err)
	}
	c := &ControlPlane{children: map[int]chan struct{}{}}
	if err := json.Unmarshal(data, &c.st); err != nil {
		return nil, fmt.Errorf("decode %s: %w", filepath.Join(dir, stateFile), err)
	}
	if c.caPEM, err = os.ReadFile(filepath.Join(dir, caCertFile)); err != nil {
		return nil, fmt.Errorf("control plane in %s: %w", dir, err)
	}
	tokens, err := os.ReadFile(filepath.Join(dir, tokensFile))
	if err != nil {
		return nil, fmt.Errorf("control plane in %s: %w", dir, err)
	}
	c.token, _, _ = strings.Cut(string(tokens), ",")
	return c, nil
}

// State returns what controlplane.json records.
func (c *ControlPlane) State() State { return c.st }

// URL is the apiserver's address, https://Address:APIPort.
func (c *ControlPlane) URL() string {
	return "https://" + netip.AddrPortFrom(c.st.Address, uint16(c.st.APIPort)).String()
}

// Kubeconfig returns the path of an admin kubeconfig (static token, the
// lab CA, server URL()) for processes inside the netns or on the fabric.
func (c *ControlPlane) Kubeconfig() string { return c.st.Kubeconfig }

// Token is the admin's bearer token.
func (c *ControlPlane) Token() string { return c.token }

func (c *ControlPlane) writeKubeconfig() error {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["lab"] = &clientcmdapi.Cluster{Server: c.URL(), CertificateAuthorityData: c.caPEM}
	cfg.AuthInfos[Admin] = &clientcmdapi.AuthInfo{Token: c.token}
	cfg.Contexts["lab"] = &clientcmdapi.Context{Cluster: "lab", AuthInfo: Admin}
	cfg.CurrentContext = "lab"
	if err := clientcmd.WriteToFile(*cfg, c.st.Kubeconfig); err != nil {
		return fmt.Errorf("write kubeconfig: %w", err)
	}
	return os.Chmod(c.st.Kubeconfig, 0o600)
}

func (c *ControlPlane) save() error {
	data, err := json.MarshalIndent(c.st, "", "  ")
	if err != nil {
		return fmt.Errorf("encode control plane state: %w", err)
	}
	path := filepath.Join(c.st.Dir, stateFile)
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, append(data, '\n'), 0o600); err != nil {
		return fmt.Errorf("write %s: %w", tmp, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

// RESTConfig returns a client configuration usable from this process even
// when the apiserver runs in another network namespace: each connection's
// socket is created inside that namespace. QPS and burst are high enough
// for benchmarks that create thousands of objects.
func (c *ControlPlane) RESTConfig() *rest.Config {
	c.restOnce.Do(func() {
		cfg := &rest.Config{
			Host:            c.URL(),
			BearerToken:     c.token,
			TLSClientConfig: rest.TLSClientConfig{CAData: c.caPEM},
			QPS:             500,
			Burst:           1000,
			UserAgent:       "sluice",
			// Protobuf, as kube's own components talk: a fraction of
			// JSON's CPU on both sides when objects come by the thousand.
			ContentConfig: rest.ContentConfig{
				AcceptContentTypes: "application/vnd.kubernetes.protobuf,application/json",
				ContentType:        "application/vnd.kubernetes.protobuf",
			},
			Timeout: 60 * time.Second,
		}
		if c.st.NetNS != "" {
			cfg.Dial = NetnsDialer(c.st.NetNS)
		}
		c.rest = cfg
	})
	return rest.CopyConfig(c.rest)
}

// Client returns a clientset built from RESTConfig. It panics only if
// client-go rejects a configuration RESTConfig built, which is a bug here.
func (c *ControlPlane) Client() kubernetes.Interface {
	cs, err := c.clientset()
	if err != nil {
		panic(err)
	}
	return cs
}

func (c *ControlPlane) clientset() (kubernetes.Interface, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.client == nil && c.clientEr == nil {
		c.client, c.clientEr = kubernetes.NewForConfig(c.RESTConfig())
		if c.clientEr != nil {
			c.clientEr = fmt.Errorf("control plane client: %w", c.clientEr)
		}
	}
	return c.client, c.clientEr
}

// ServerVersion asks the apiserver for its version (gitVersion).
func (c *ControlPlane) ServerVersion() (string, error) {
	cs, err := c.clientset()
	if err != nil {
		return "", err
	}
	v, err := cs.Discovery().ServerVersion()
	if err != nil {
		return "", fmt.Errorf("control plane %s: version: %w", c.URL(), err)
	}
	return v.GitVersion, nil
}

// NetnsDialer dials from a socket created inside the namespace at path:
// the dialing goroutine locks its OS thread, switches it into the
// namespace, dials (the whole connect runs on that thread), and switches
// back. A thread that cannot switch back stays locked, so Go retires it
// instead of running other goroutines in the wrong namespace.
func NetnsDialer(path string) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		target, err := netns.GetFromPath(path)
		if err != nil {
			return nil, fmt.Errorf("open netns %s: %w", path, err)
		}
		defer target.Close()
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			return nil, fmt.Errorf("current netns: %w", err)
		}
		defer orig.Close()
		if err := netns.Set(target); err != nil {
			runtime.UnlockOSThread()
			return nil, fmt.Errorf("enter netns %s: %w", path, err)
		}
		var d net.Dialer
		conn, derr := d.DialContext(ctx, network, addr)
		if err := netns.Set(orig); err != nil {
			// Leave the thread locked: it dies with this goroutine.
			if conn != nil {
				conn.Close()
			}
			return nil, fmt.Errorf("leave netns %s: %w", path, err)
		}
		runtime.UnlockOSThread()
		if derr != nil {
			return nil, fmt.Errorf("dial %s in netns %s: %w", addr, path, derr)
		}
		return conn, nil
	}
}

// Stop stops the scheduler and controller-manager, then the apiserver, then etcd (SIGTERM, SIGKILL after 10 s each).
// It is safe to call more than once and on an attached control plane; the
// state dir stays (its logs explain a failure) for the caller to remove.
func (c *ControlPlane) Stop() error {
	c.mu.Lock()
	if c.stopped {
		c.mu.Unlock()
		return nil
	}
	c.stopped = true
	c.mu.Unlock()
	var errs []error
	for _, p := range []struct {
		name string
		pid  int
		bin  string
	}{{"kube-scheduler", c.st.SchedulerPID, "kube-scheduler"},
		{"kube-controller-manager", c.st.ControllerManagerPID, "kube-controller-manager"},
		{"kube-apiserver", c.st.APIServerPID, "kube-apiserver"}, {"etcd", c.st.EtcdPID, "etcd"}} {
		if p.pid <= 0 {
			continue
		}
		if err := c.stopProcess(p.pid, p.bin, 10*time.Second); err != nil {
			errs = append(errs, fmt.Errorf("stop %s (pid %d): %w", p.name, p.pid, err))
		}
	}
	return errors.Join(errs...)
}

func (c *ControlPlane) stopProcess(pid int, bin string, timeout time.Duration) error {
	c.mu.Lock()
	done, mine := c.children[pid]
	c.mu.Unlock()
	// A pid recorded by another process may since belong to something
	// else: only signal it if it still runs our binary from this dir.
	if !mine && !ours(pid, bin, c.st.Dir) {
		return nil
	}
	_ = syscall.Kill(pid, syscall.SIGTERM)
	gone := func() bool {
		if mine {
			select {
			case <-done:
				return true
			default:
				return false
			}
		}
		return !ProcessAlive(pid)
	}
	deadline := time.Now().Add(timeout)
	for !gone() {
		if time.Now().After(deadline) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
			// An apiserver with 10,000 Services' worth of heap (GiBs) takes
			// seconds to exit once killed, while the kernel frees it.
			deadline = time.Now().Add(30 * time.Second)
			for !gone() {
				if time.Now().After(deadline) {
					return errors.New("still running after SIGKILL")
				}
				time.Sleep(20 * time.Millisecond)
			}
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return nil
}

// ours reports whether pid runs bin with an argument naming dir.
func ours(pid int, bin, dir string) bool {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil || !ProcessAlive(pid) {
		return false
	}
	args := strings.Split(strings.TrimRight(string(data), "\x00"), "\x00")
	return len(args) > 0 && filepath.Base(args[0]) == bin && bytes.Contains(data, []byte(dir))
}

// ProcessAlive reports whether pid exists and is not a zombie.
func ProcessAlive(pid int) bool {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	s := string(data)
	if i := strings.LastIndexByte(s, ')'); i >= 0 && i+2 < len(s) {
		return s[i+2] != 'Z'
	}
	return true
}

// logTail returns the last n lines of a log file, for error messages.
func logTail(path string, n int) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	lines := strings.Split(strings.TrimRight(string(bytes.ToValidUTF8(data, []byte("?"))), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
