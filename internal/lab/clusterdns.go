package lab

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/vishvananda/netns"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// Cluster DNS in the lab: CoreDNS (built from its Go module by
// scripts/coredns-build.sh) in some of the lab's pods, behind the kube-dns
// ClusterIP Service (UDP and TCP 53), as a cluster's DNS runs. With the real
// control plane it answers the cluster domain from the apiserver through
// its kubernetes plugin; in manifests mode from a hosts file the lab
// rewrites on every apply and delete. Every pod gets a resolv.conf that
// points at the Service, under /etc/netns/<netns>/ where `ip netns exec`
// and `sluice-lab exec` bind it over /etc/resolv.conf.
//
// Replica r (1-based) runs in pod ((r-1)/nodes)+1 of node ((r-1)%nodes)+1:
// one per node first. The lab's pods all live in the default namespace, so
// the Service is kube-dns.default (a cluster's is kube-dns.kube-system;
// the lab's EndpointSlices only select pods of their own namespace).

// Cluster DNS constants.
const (
	ClusterDomain  = "cluster.local"
	ClusterDNSName = "kube-dns"
	// LabelDNS marks the pods that run a CoreDNS replica, as kube-dns's
	// selector does in a cluster.
	LabelDNS      = "k8s-app"
	labelDNSValue = "kube-dns"
	// CoreDNSReadyPort is CoreDNS's ready plugin, in each replica's pod.
	CoreDNSReadyPort = 8181
	corednsEnv       = "SLUICE_COREDNS_BIN"
	etcNetns         = "/etc/netns"
)

// ClusterDNSIPv4 is the kube-dns Service's ClusterIP.
var ClusterDNSIPv4 = netip.MustParseAddr("198.19.0.53")

// ClusterDNS is the lab's cluster DNS, in its state.
type ClusterDNS struct {
	VIP      netip.Addr `json:"vip"`
	Replicas []string   `json:"replicas"` // pods running CoreDNS
	Binary   string     `json:"binary"`
	Version  string     `json:"version"`
	Corefile string     `json:"corefile"`        // one per replica: <pod> is its name
	Hosts    string     `json:"hosts,omitempty"` // manifests mode: the zone's records
	// PIDs of the CoreDNS processes, by pod.
	PIDs map[string]int `json:"pids,omitempty"`
	// Serving are the replicas behind the Service (all, unless
	// SetClusterDNSServing chose fewer).
	Serving []string `json:"serving,omitempty"`
}

// CoreDNSBinary finds CoreDNS: $SLUICE_COREDNS_BIN, else the newest build
// in ${SLUICE_CACHE:-/var/cache/sluice}/coredns.
func CoreDNSBinary() (string, error) {
	if p := os.Getenv(corednsEnv); p != "" {
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("%s=%s: %w", corednsEnv, p, err)
		}
		return p, nil
	}
	p, root := newestCached("coredns", "coredns")
	if p == "" {
		return "", fmt.Errorf("no CoreDNS in %s/coredns: run scripts/coredns-build.sh (or set %s)", root, corednsEnv)
	}
	return p, nil
}

// newestCached returns the newest <cache>/<tool>/<version>/bin/<bin> a
// scripts/*-build.sh left (${SLUICE_CACHE:-/var/cache/sluice}), or "", and
// the cache's root.
func newestCached(tool, bin string) (path, root string) {
	root = cacheRoot()
	found, _ := filepath.Glob(filepath.Join(root, tool, "v*", "bin", bin))
	if len(found) == 0 {
		return "", root
	}
	sort.Strings(found)
	return found[len(found)-1], root
}

// dnsReplicaPods names the pods of n replicas.
func dnsReplicaPods(nodes, n int) []string {
	var out []string
	for r := 0; r < n; r++ {
		out = append(out, PodName(r%nodes+1, r/nodes+1))
	}
	return out
}

// resolvConf is a pod's /etc/resolv.conf in a cluster (kubelet's
// ClusterFirst): the Service, the search path of the pod's namespace,
// ndots 5.
func resolvConf(vip netip.Addr) string {
	return fmt.Sprintf("search %[1]s.svc.%[2]s svc.%[2]s %[2]s\nnameserver %[3]s\noptions ndots:5\n", labNamespace, ClusterDomain, vip)
}

// ReplicaName is answered by each replica with its own Pod IP: which
// replica a lookup through the Service reached.
const ReplicaName = "which.replica.lab"

// corefile is the Corefile of a replica: a cluster's default, with the
// zone from the apiserver (kubeconfig) or a hosts file, and ReplicaName
// answered with the replica's address.
func corefile(kubeconfig, hosts string, self netip.Addr) string {
	zone := fmt.Sprintf("    hosts %s %s {\n        reload 1s\n        ttl 5\n    }\n", hosts, ClusterDomain)
	if kubeconfig != "" {
		zone = fmt.Sprintf("    kubernetes %s in-addr.arpa ip6.arpa {\n        kubeconfig %s\n        pods insecure\n        fallthrough in-addr.arpa ip6.arpa\n        ttl 5\n    }\n",
			ClusterDomain, kubeconfig)
	}
	return ".:53 {\n    errors\n    ready :" + strconv.Itoa(CoreDNSReadyPort) + "\n" + zone +
		"    cache 5\n    loadbalance\n}\n" +
		"replica.lab:53 {\n    hosts {\n        " + self.String() + " " + ReplicaName + "\n    }\n}\n"
}

// hostsZone is the hosts file of manifests mode: every Service's
// ClusterIPs under <name>.<namespace>.svc.<domain>.
func hostsZone(services map[string]*corev1.Service) string {
	var lines []string
	for _, s := range services {
		ns := s.Namespace
		if ns == "" {
			ns = labNamespace
		}
		ips := s.Spec.ClusterIPs
		if len(ips) == 0 && s.Spec.ClusterIP != "" {
			ips = []string{s.Spec.ClusterIP}
		}
		for _, ip := range ips {
			if _, err := netip.ParseAddr(ip); err != nil {
				continue // None (headless) or empty
			}
			lines = append(lines, fmt.Sprintf("%s %s.%s.svc.%s", ip, s.Name, ns, ClusterDomain))
		}
	}
	sort.Strings(lines)
	return strings.Join(lines, "\n") + "\n"
}

// kubeDNSService is the Service in front of the replicas.
func kubeDNSService(vip netip.Addr) *corev1.Service {
	return &corev1.Service{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Service"},
		ObjectMeta: metav1.ObjectMeta{Name: ClusterDNSName, Namespace: labNamespace, Labels: map[string]string{LabelDNS: labelDNSValue}},
		Spec: corev1.ServiceSpec{
			Type: corev1.ServiceTypeClusterIP, ClusterIP: vip.String(), ClusterIPs: []string{vip.String()},
			Selector: map[string]string{LabelDNS: labelDNSValue},
			Ports: []corev1.ServicePort{
				{Name: "dns", Port: 53, TargetPort: intstr.FromInt32(53), Protocol: corev1.ProtocolUDP},
				{Name: "dns-tcp", Port: 53, TargetPort: intstr.FromInt32(53), Protocol: corev1.ProtocolTCP},
			},
		},
	}
}

// DNSEchoVIP and DNSEchoPort are a second Service in front of the serving
// replicas' pods, port 53 to DNSEchoPort in them, for another DNS server
// run beside CoreDNS (`bench dns --through-service`'s echo server, whose
// cost next to CoreDNS's is small enough for the dataplane's to show).
var DNSEchoVIP = netip.MustParseAddr("198.19.0.54")

const DNSEchoPort = 5353

// DNSEchoService is that Service: kube-dns's selector, so that it has the
// serving replicas as they were when it was applied (apply it after
// SetClusterDNSServing).
func DNSEchoService() *corev1.Service {
	return &corev1.Service{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Service"},
		ObjectMeta: metav1.ObjectMeta{Name: "dns-echo", Namespace: labNamespace},
		Spec: corev1.ServiceSpec{
			Type: corev1.ServiceTypeClusterIP, ClusterIP: DNSEchoVIP.String(), ClusterIPs: []string{DNSEchoVIP.String()},
			Selector: map[string]string{LabelDNS: labelDNSValue},
			Ports:    []corev1.ServicePort{{Name: "dns", Port: 53, TargetPort: intstr.FromInt32(DNSEchoPort), Protocol: corev1.ProtocolUDP}},
		},
	}
}

// startClusterDNS starts the replicas, the Service and the pods'
// resolv.conf, and waits until every replica answers.
func (l *Lab) startClusterDNS(ctx context.Context) error {
	d := l.ClusterDNS
	bin, err := CoreDNSBinary()
	if err != nil {
		return err
	}
	d.Binary = bin
	if out, err := exec.CommandContext(ctx, bin, "-version").Output(); err == nil {
		d.Version = strings.TrimSpace(strings.SplitN(string(out), "\n", 2)[0])
	}
	dir := filepath.Join(l.RunDir, "coredns")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	d.Corefile = filepath.Join(dir, "Corefile-<pod>")
	kubeconfig := ""
	if l.APIServer != nil {
		kubeconfig = l.APIServer.Kubeconfig
	} else {
		d.Hosts = filepath.Join(dir, "hosts")
	}
	for _, name := range d.Replicas {
		p, _ := l.Pod(name)
		if err := os.WriteFile(filepath.Join(dir, "Corefile-"+name), []byte(corefile(kubeconfig, d.Hosts, p.IPv4)), 0o644); err != nil {
			return err
		}
	}
	if err := l.Apply(kubeDNSService(d.VIP)); err != nil { // manifests mode: writes the hosts file too
		return fmt.Errorf("the %s Service: %w", ClusterDNSName, err)
	}
	for _, p := range l.Pods() {
		conf := filepath.Join(etcNetns, p.Netns, "resolv.conf")
		if err := os.MkdirAll(filepath.Dir(conf), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(conf, []byte(resolvConf(d.VIP)), 0o644); err != nil {
			return err
		}
	}
	d.PIDs = map[string]int{}
	for _, name := range d.Replicas {
		log := filepath.Join(dir, name+".log")
		pid, err := l.startDaemon(name, log, bin, "-conf", filepath.Join(dir, "Corefile-"+name), "-dns.port", "53")
		if err != nil {
			return fmt.Errorf("CoreDNS in %s: %w", name, err)
		}
		d.PIDs[name] = pid
	}
	if err := l.save(); err != nil {
		return err
	}
	deadline := time.Now().Add(30 * time.Second)
	for _, name := range d.Replicas {
		p, _ := l.Pod(name)
		for {
			_, err := QueryA(ctx, p.Netns, netip.AddrPortFrom(p.IPv4, 53), ClusterDNSName+"."+labNamespace+".svc."+ClusterDomain)
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("CoreDNS in %s does not answer for %s: %v: %s", name, ClusterDNSName, err,
					logTail(filepath.Join(dir, name+".log"), 10))
			}
			if err := sleepCtx(ctx, 200*time.Millisecond); err != nil {
				return err
			}
		}
	}
	return nil
}

// SetClusterDNSServing puts the first n replicas behind the kube-dns
// Service and takes the others out (their CoreDNS keeps running), as a
// scale-down's EndpointSlice change does.
func (l *Lab) SetClusterDNSServing(n int) error {
	d := l.ClusterDNS
	if d == nil {
		return errors.New("the lab runs no cluster DNS (lab up --cluster-dns N)")
	}
	if n < 0 || n > len(d.Replicas) {
		return fmt.Errorf("%d serving replicas: the lab runs %d", n, len(d.Replicas))
	}
	// The labels follow Serving (dnsLabels): the pods themselves are not
	// written, so that others may read them meanwhile.
	d.Serving = slices.Clone(d.Replicas[:n])
	if err := l.save(); err != nil {
		return err
	}
	return l.Apply(kubeDNSService(d.VIP))
}

// dnsLabels are the labels a pod carries for cluster DNS: k8s-app:
// kube-dns on the replicas behind the Service.
func (l *Lab) dnsLabels(pod string) map[string]string {
	if d := l.ClusterDNS; d != nil && slices.Contains(d.Serving, pod) {
		return map[string]string{LabelDNS: labelDNSValue}
	}
	return nil
}

// syncHosts rewrites manifests mode's hosts file from the Services.
func (l *Lab) syncHosts() error {
	if l.ClusterDNS == nil || l.ClusterDNS.Hosts == "" {
		return nil
	}
	svcs, err := readServices(l.ManifestsDir)
	if err != nil {
		return err
	}
	return writeAtomic(l.ClusterDNS.Hosts, []byte(hostsZone(svcs)))
}

// removeResolvConfs deletes the /etc/netns entries of the lab's pods
// (<prefix>nN-podM, nothing of another lab whose prefix starts alike).
func removeResolvConfs(prefix string) error {
	found, _ := filepath.Glob(filepath.Join(etcNetns, prefix+"n*-pod*"))
	pod := regexp.MustCompile("^" + regexp.QuoteMeta(prefix) + `n[0-9]+-pod[0-9]+$`)
	var errs []error
	for _, dir := range found {
		if pod.MatchString(filepath.Base(dir)) {
			errs = append(errs, os.RemoveAll(dir))
		}
	}
	return errors.Join(errs...)
}

// ResolvConf is the resolv.conf the lab gives target, or "" when it has
// none.
func (l *Lab) ResolvConf(target string) string {
	ep, ok := l.Endpoint(target)
	if !ok || l.ClusterDNS == nil {
		return ""
	}
	p := filepath.Join(etcNetns, ep.Netns, "resolv.conf")
	if _, err := os.Stat(p); err != nil {
		return ""
	}
	return p
}

// WithResolvConf wraps args so that they run with the target's resolv.conf
// bound over /etc/resolv.conf in a mount namespace of their own, as a
// pod's containers see theirs (what `ip netns exec` does, without its
// remount of /sys).
func (l *Lab) WithResolvConf(target string, args []string) []string {
	conf := l.ResolvConf(target)
	if conf == "" {
		return args
	}
	return append([]string{"unshare", "--mount", "--propagation", "private", "sh", "-c",
		`mount --bind "$0" /etc/resolv.conf && exec "$@"`, conf}, args...)
}

// QueryA sends one A query for name to server from the network namespace
// ns and returns the addresses of the answer.
func QueryA(ctx context.Context, ns string, server netip.AddrPort, name string) ([]netip.Addr, error) {
	conn, err := dialIn(ns, server)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	deadline := time.Now().Add(time.Second)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	_ = conn.SetDeadline(deadline)
	id := uint16(rand.Uint32())
	q := dnsQuery(id, name, 1)
	if _, err := conn.Write(q); err != nil {
		return nil, err
	}
	buf := make([]byte, 1500)
	n, err := conn.Read(buf)
	if err != nil {
		return nil, err
	}
	return parseAnswerA(buf[:n], id)
}

// dialIn makes a UDP socket in the namespace ns (a socket stays in the
// namespace it was made in) connected to server.
func dialIn(ns string, server netip.AddrPort) (net.Conn, error) {
	type result struct {
		c   net.Conn
		err error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread dies with the goroutine
		h, err := netns.GetFromPath(netnsPath(ns))
		if err != nil {
			ch <- result{nil, fmt.Errorf("network namespace %s: %w", ns, err)}
			return
		}
		defer h.Close()
		if err := netns.Set(h); err != nil {
			ch <- result{nil, fmt.Errorf("enter network namespace %s: %w", ns, err)}
			return
		}
		c, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(server))
		ch <- result{c, err}
	}()
	r := <-ch
	return r.c, r.err
}

// dnsQuery is a query message: header with RD, one question of qtype, IN.
func dnsQuery(id uint16, name string, qtype uint16) []byte {
	b := binary.BigEndian.AppendUint16(nil, id)
	b = append(b, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0)
	for _, label := range strings.Split(strings.TrimSuffix(name, "."), ".") {
		b = append(b, byte(len(label)))
		b = append(b, label...)
	}
	b = append(b, 0)
	b = binary.BigEndian.AppendUint16(b, qtype)
	return binary.BigEndian.AppendUint16(b, 1)
}

// parseAnswerA reads the A records of a response to the query id.
func parseAnswerA(m []byte, id uint16) ([]netip.Addr, error) {
	if len(m) < 12 || binary.BigEndian.Uint16(m) != id || m[2]&0x80 == 0 {
		return nil, errors.New("not a response to the query")
	}
	if rcode := m[3] & 0x0f; rcode != 0 {
		return nil, fmt.Errorf("rcode %d", rcode)
	}
	qd, an := int(binary.BigEndian.Uint16(m[4:])), int(binary.BigEndian.Uint16(m[6:]))
	off := 12
	skipName := func() error {
		for off < len(m) {
			l := int(m[off])
			switch {
			case l == 0:
				off++
				return nil
			case l&0xc0 == 0xc0:
				off += 2
				return nil
			}
			off += l + 1
		}
		return errors.New("truncated name")
	}
	for range qd {
		if err := skipName(); err != nil {
			return nil, err
		}
		off += 4
	}
	var out []netip.Addr
	for range an {
		if err := skipName(); err != nil {
			return nil, err
		}
		if off+10 > len(m) {
			return nil, errors.New("truncated record")
		}
		typ, rdlen := binary.BigEndian.Uint16(m[off:]), int(binary.BigEndian.Uint16(m[off+8:]))
		off += 10
		if off+rdlen > len(m) {
			return nil, errors.New("truncated record data")
		}
		if typ == 1 && rdlen == 4 {
			out = append(out, netip.AddrFrom4([4]byte(m[off:off+4])))
		}
		off += rdlen
	}
	if len(out) == 0 {
		return nil, errors.New("no A record in the answer")
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return out, nil
}
