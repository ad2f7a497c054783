package lab

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// Status is the lab as `lab status` shows it: the recorded state plus
// whether each process is alive and each agent answers /healthz.
type Status struct {
	Prefix       string           `json:"prefix"`
	Dataplane    string           `json:"dataplane"`
	ControlPlane string           `json:"controlPlane"`
	APIServer    *APIServerStatus `json:"apiServer,omitempty"`
	// LBMode, LBAcceleration and Devices are the agents' north-south flags.
	LBMode         string       `json:"lbMode,omitempty"`
	LBAcceleration string       `json:"lbAcceleration,omitempty"`
	LBAlgorithm    string       `json:"lbAlgorithm,omitempty"`
	Devices        []string     `json:"devices,omitempty"`
	Veths          VethPrep     `json:"veths"`
	ManifestsDir   string       `json:"manifestsDir"`
	CgroupRoot     string       `json:"cgroupRoot"`
	Client         Endpoint     `json:"client"`
	Nodes          []NodeStatus `json:"nodes"`
	// ClusterDNS is CoreDNS behind kube-dns, each replica asked directly
	// and the Service asked from a pod.
	ClusterDNS *ClusterDNSStatus `json:"clusterDNS,omitempty"`
	// KubeletDNS is a kubelet lab's cluster DNS: CoreDNS's Deployment and
	// the DNS autoscaler scaling it.
	KubeletDNS *KubeletDNSStatus `json:"kubeletDNS,omitempty"`
}

// ClusterDNSStatus is the cluster DNS and whether it answers.
type ClusterDNSStatus struct {
	ClusterDNS
	// Replicas answering a query for kube-dns directly, and the errors of
	// those that do not.
	Answering int               `json:"answering"`
	Errors    map[string]string `json:"errors,omitempty"`
	// ServiceError is what a query to the Service from a pod got ("":
	// answered).
	ServiceError string `json:"serviceError,omitempty"`
}

// APIServerStatus is the real control plane and whether it answers.
type APIServerStatus struct {
	APIServer
	// ServerVersion is what the apiserver says now ("" when it does not
	// answer; Error says why).
	ServerVersion string `json:"serverVersion,omitempty"`
	Error         string `json:"error,omitempty"`
}

// NodeStatus is one node with its agent or kube-proxy, and pods.
type NodeStatus struct {
	Endpoint
	// LBAcceleration is the node's own --lb-acceleration, when it differs
	// from the lab's.
	LBAcceleration string           `json:"lbAcceleration,omitempty"`
	Agent          *AgentStatus     `json:"agent,omitempty"`
	KubeProxy      *KubeProxyStatus `json:"kubeProxy,omitempty"`
	Cilium         *CiliumStatus    `json:"cilium,omitempty"`
	// Kubelet is the node's kubelet and containerd in a kubelet lab.
	Kubelet *KubeletStatus `json:"kubelet,omitempty"`
	Pods    []PodStatus    `json:"pods"`
}

// KubeProxyStatus is a kube-proxy process and whether it has synced.
type KubeProxyStatus struct {
	KubeProxy
	Alive bool `json:"alive"`
	// LastSync is kube-proxy's last full sync (Unix seconds, 0: never).
	LastSync float64 `json:"lastSync"`
	Error    string  `json:"error,omitempty"`
}

// CiliumStatus is a node's cilium-agent and its health (GET /v1/healthz).
type CiliumStatus struct {
	Cilium
	Alive   bool   `json:"alive"`
	Healthy bool   `json:"healthy"`
	Error   string `json:"error,omitempty"`
}

// AgentStatus is an agent's process and health.
type AgentStatus struct {
	Agent
	Alive   bool   `json:"alive"`
	Healthy bool   `json:"healthy"`
	Error   string `json:"error,omitempty"`
}

// PodStatus is a pod and whether its echo backend runs.
type PodStatus struct {
	Endpoint
	PID   int  `json:"pid"`
	Alive bool `json:"alive"`
}

// Status checks every process of the lab.
func (l *Lab) Status(ctx context.Context) Status {
	st := Status{Prefix: l.Prefix, Dataplane: l.Dataplane, ControlPlane: l.ControlPlane, LBMode: l.LBMode,
		LBAcceleration: l.LBAcceleration, LBAlgorithm: l.LBAlgorithm, Devices: l.Devices, Veths: l.Veths, ManifestsDir: l.ManifestsDir,
		CgroupRoot: l.CgroupRoot, Client: l.Client}
	if st.ControlPlane == "" {
		st.ControlPlane = ControlPlaneManifests // state of an older lab
	}
	if d := l.ClusterDNS; d != nil {
		cs := &ClusterDNSStatus{ClusterDNS: *d, Errors: map[string]string{}}
		name := ClusterDNSName + "." + labNamespace + ".svc." + ClusterDomain
		for _, r := range d.Replicas {
			p, _ := l.Pod(r)
			if _, err := QueryA(ctx, p.Netns, netip.AddrPortFrom(p.IPv4, 53), name); err != nil {
				cs.Errors[r] = err.Error()
			} else {
				cs.Answering++
			}
		}
		// Through the Service: from a pod's namespace and cgroup, where
		// the dataplane's socket load balancing applies.
		if pods := l.Pods(); len(pods) > 0 {
			r, err := l.Probe(ctx, pods[len(pods)-1].Name, "dns", "--addr", netip.AddrPortFrom(d.VIP, 53).String(), "--name", name,
				"--count", "1", "--timeout", "1s")
			switch {
			case err != nil:
				cs.ServiceError = err.Error()
			case r.OK != r.Count:
				cs.ServiceError = r.FirstError
			}
		}
		st.ClusterDNS = cs
	}
	if slices.ContainsFunc(l.Nodes, func(n Node) bool { return n.Kubelet != nil }) {
		ks := l.kubeletDNSStatus(ctx)
		st.KubeletDNS = &ks
		if st.Dataplane == DataplaneNone {
			st.Dataplane = l.kubeletDataplane(ctx)
		}
	}
	if l.APIServer != nil {
		as := &APIServerStatus{APIServer: *l.APIServer}
		if v, err := l.apiServerVersion(); err != nil {
			as.Error = err.Error()
		} else {
			as.ServerVersion = v
		}
		st.APIServer = as
	}
	for _, n := range l.Nodes {
		ns := NodeStatus{Endpoint: n.Endpoint, LBAcceleration: n.LBAcceleration, Pods: []PodStatus{}}
		if n.Agent != nil {
			as := &AgentStatus{Agent: *n.Agent, Alive: ProcessAlive(n.Agent.PID)}
			if err := agentHealth(ctx, n.Agent.Socket); err != nil {
				as.Error = err.Error()
			} else {
				as.Healthy = true
			}
			ns.Agent = as
		}
		if n.KubeProxy != nil {
			ks := &KubeProxyStatus{KubeProxy: *n.KubeProxy, Alive: ProcessAlive(n.KubeProxy.PID)}
			if v, err := l.metricValue(ctx, n, syncedMetric); err != nil {
				ks.Error = err.Error()
			} else {
				ks.LastSync = v
			}
			ns.KubeProxy = ks
		}
		if c := n.Cilium; c != nil {
			cs := &CiliumStatus{Cilium: *c, Alive: ProcessAlive(c.PID)}
			if err := ciliumHealth(ctx, c.Socket); err != nil {
				cs.Error = err.Error()
			} else {
				cs.Healthy = true
			}
			ns.Cilium = cs
		}
		for _, p := range n.Pods {
			ns.Pods = append(ns.Pods, PodStatus{Endpoint: p.Endpoint, PID: p.PID, Alive: ProcessAlive(p.PID)})
		}
		if k := n.Kubelet; k != nil {
			ns.Kubelet = &KubeletStatus{Kubelet: *k, KubeletAlive: ProcessAlive(k.KubeletPID),
				ContainerdAlive: ProcessAlive(k.ContainerdPID), Ready: l.nodeReady(ctx, n.Name)}
		}
		st.Nodes = append(st.Nodes, ns)
	}
	return st
}

// KubeletStatus is a kubelet node's processes and its Node's Ready
// condition.
type KubeletStatus struct {
	Kubelet
	KubeletAlive    bool   `json:"kubeletAlive"`
	ContainerdAlive bool   `json:"containerdAlive"`
	Ready           string `json:"ready"` // the Node's Ready condition, or why it is unknown
}

// Print writes the status as a table, or as JSON when asJSON.
func (st Status) Print(w io.Writer, asJSON bool) error {
	if asJSON {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(st)
	}
	switch a := st.APIServer; {
	case a == nil:
		fmt.Fprintf(w, "Lab %s, dataplane %s, control plane %s (%s)\n", strings.TrimSuffix(st.Prefix, "-"),
			st.Dataplane, st.ControlPlane, st.ManifestsDir)
	case a.Error != "":
		fmt.Fprintf(w, "Lab %s, dataplane %s, control plane %s: kube-apiserver %s at %s NOT ANSWERING: %s\n",
			strings.TrimSuffix(st.Prefix, "-"), st.Dataplane, st.ControlPlane, a.Version, a.URL, a.Error)
	default:
		fmt.Fprintf(w, "Lab %s, dataplane %s, control plane %s: kube-apiserver %s at %s (netns %s, kubeconfig %s)\n",
			strings.TrimSuffix(st.Prefix, "-"), st.Dataplane, st.ControlPlane, a.ServerVersion, a.URL, a.Netns, a.Kubeconfig)
	}
	if st.LBMode != "" {
		var own []string
		for _, n := range st.Nodes {
			if n.LBAcceleration != "" {
				own = append(own, n.Name+": "+n.LBAcceleration)
			}
		}
		accel := st.LBAcceleration
		if len(own) > 0 {
			accel += " (" + strings.Join(own, ", ") + ")"
		}
		alg := ""
		if st.LBAlgorithm != "" {
			alg = ", lb-algorithm " + st.LBAlgorithm
		}
		fmt.Fprintf(w, "North-south: lb-mode %s%s, lb-acceleration %s on %s\n", st.LBMode, alg, accel, strings.Join(st.Devices, ","))
	}
	if d := st.ClusterDNS; d != nil {
		svc := "answers"
		if d.ServiceError != "" {
			svc = "NOT ANSWERING: " + d.ServiceError
		}
		fmt.Fprintf(w, "Cluster DNS: %s, %d replicas (%d answering: %s) behind %s %s, UDP and TCP 53: %s\n", d.Version, len(d.Replicas),
			d.Answering, strings.Join(d.Replicas, ", "), ClusterDNSName, d.VIP, svc)
		for _, r := range d.Replicas {
			if e := d.Errors[r]; e != "" {
				fmt.Fprintf(w, "  CoreDNS in %s: %s\n", r, e)
			}
		}
	}
	if d := st.KubeletDNS; d != nil {
		fmt.Fprintf(w, "Cluster DNS: %s\n", d)
	}
	if st.Veths.Checksums != "" { // state of an older lab: not recorded
		fmt.Fprintf(w, "Veths: %s\n", st.Veths)
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tKIND\tIPV4\tIPV6\tPROCESS\tSTATE")
	addr := func(a netip.Addr) string {
		if !a.IsValid() {
			return "-"
		}
		return a.String()
	}
	fmt.Fprintf(tw, "%s\tclient\t%s\t%s\t-\t-\n", st.Client.Name, addr(st.Client.IPv4), addr(st.Client.IPv6))
	if a := st.APIServer; a != nil {
		state := "ready"
		if a.Error != "" {
			state = "not answering"
		}
		fmt.Fprintf(tw, "cp\tcontrol-plane\t%s\t%s\tapiserver pid %d, etcd pid %d\t%s\n",
			ControlPlaneIPv4, ControlPlaneIPv6, a.APIServerPID, a.EtcdPID, state)
	}
	for _, n := range st.Nodes {
		proc, state := "-", "no agent"
		if k := n.KubeProxy; k != nil {
			mode := k.Mode
			if k.Backend != "" {
				mode += "/" + k.Backend
			}
			proc = "kube-proxy pid " + strconv.Itoa(k.PID) + " (" + mode + ")"
			switch {
			case !k.Alive:
				state = "not running"
			case k.LastSync > 0:
				state = "synced " + time.Unix(int64(k.LastSync), 0).UTC().Format(time.TimeOnly) + " UTC"
			case k.Error != "":
				state = "metrics: " + k.Error
			default:
				state = "not synced yet"
			}
		}
		if a := n.Agent; a != nil {
			proc = "agent pid " + strconv.Itoa(a.PID)
			switch {
			case a.Healthy:
				state = "healthy (" + a.Socket + ")"
			case !a.Alive:
				state = "not running"
			default:
				state = "unhealthy: " + a.Error
			}
		}
		if c := n.Cilium; c != nil {
			proc = fmt.Sprintf("cilium-agent pid %d (lb-mode %s, acceleration %s)", c.PID, c.Mode, c.Acceleration)
			switch {
			case c.Healthy:
				state = "healthy (" + c.Socket + ")"
			case !c.Alive:
				state = "not running (" + c.Log + ")"
			default:
				state = "unhealthy: " + c.Error
			}
		}
		if k := n.Kubelet; k != nil {
			proc = fmt.Sprintf("kubelet pid %d, containerd pid %d", k.KubeletPID, k.ContainerdPID)
			switch {
			case !k.KubeletAlive || !k.ContainerdAlive:
				state = "not running (" + k.KubeletLog + ")"
			default:
				state = "Ready " + k.Ready
			}
		}
		fmt.Fprintf(tw, "%s\tnode\t%s\t%s\t%s\t%s\n", n.Name, addr(n.IPv4), addr(n.IPv6), proc, state)
		for _, p := range n.Pods {
			state := "running"
			if !p.Alive {
				state = "not running"
			}
			fmt.Fprintf(tw, "%s\tpod\t%s\t%s\techo pid %d\t%s\n", p.Name, addr(p.IPv4), addr(p.IPv6), p.PID, state)
		}
	}
	return tw.Flush()
}
