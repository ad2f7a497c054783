package agent

import (
	"context"
	"errors"
	"net/netip"
	"slices"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/sluice-dataplane/sluice/internal/api"
)

// localAddressSetter is the pipeline's side of the NodePort addresses.
type localAddressSetter interface {
	SetLocalAddresses([]netip.Addr)
}

// nodePortAddress says whether a of this node's interfaces is a NodePort
// address: every local address but loopback and link-local (kube-proxy's
// default in iptables mode, `--dst-type LOCAL`), or those inside
// --nodeport-addresses' CIDRs; none with primary (the Node's InternalIPs
// are NodePort addresses in every case).
func (c *Config) nodePortAddress(a netip.Addr) bool {
	a = a.Unmap()
	if !a.IsValid() || a.IsLoopback() || a.IsLinkLocalUnicast() || a.IsMulticast() || a.IsUnspecified() {
		return false
	}
	if c.nodePortAll {
		return true
	}
	for _, p := range c.nodePortCIDRs {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// nodePortHosts are the addresses the healthCheckNodePort servers bind
// with --nodeport-addresses, as kube-proxy's: this node's addresses that
// answer NodePorts (lb_node_ips: local, not NoNodePort). Empty until the
// first sync wrote them (the servers are then retried).
func (a *Agent) nodePortHosts() []string {
	out := []string{}
	if a.dp == nil {
		return out
	}
	ips, err := a.dp.Maps().NodeIPs()
	if err != nil {
		a.log.Warn("health check servers: cannot read this node's NodePort addresses", "err", err)
		return out
	}
	for addr, ip := range ips {
		if ip.Local && !ip.NoNodePort {
			out = append(out, addr.NetIP().Unmap().String())
		}
	}
	slices.Sort(out)
	return out
}

// watchLocalAddresses keeps the pipeline's NodePort addresses those of the
// agent's network namespace, as addresses come and go. A lost
// subscription is renewed with backoff and reported once.
func (a *Agent) watchLocalAddresses(ctx context.Context, set localAddressSetter) {
	a.netlinkWatch(ctx, "nodeport-addresses", api.Warning{Subsystem: "nodeport",
		Message: "the watch of this node's addresses failed, renewed with backoff",
		Fix:     "NodePorts keep the addresses seen last and the Node's InternalIPs"},
		func(done <-chan struct{}, onErr func(error)) (func(failed <-chan error) error, error) {
			updates := make(chan netlink.AddrUpdate, 64)
			err := netlink.AddrSubscribeWithOptions(updates, done, netlink.AddrSubscribeOptions{ListExisting: true, ErrorCallback: onErr})
			return func(failed <-chan error) error { return a.localAddressEvents(ctx, updates, failed, set) }, err
		})
}

// linkAddrs is the set of NodePort addresses, by the link that holds
// each: the kernel announces an address again (RTM_NEWADDR) when its
// flags or lifetimes change, so a count would outlive its one delete.
type linkAddrs map[linkAddr]bool

type linkAddr struct {
	link int
	ip   netip.Addr
}

// update applies one address update of a NodePort address.
func (s linkAddrs) update(link int, ip netip.Addr, added bool) {
	if added {
		s[linkAddr{link, ip}] = true
	} else {
		delete(s, linkAddr{link, ip})
	}
}

// list is the addresses, sorted, each once.
func (s linkAddrs) list() []netip.Addr {
	var out []netip.Addr
	for k := range s {
		out = append(out, k.ip)
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return slices.Compact(out)
}

// localAddressEvents applies address updates until ctx ends or the
// subscription fails. A burst (the initial list) is applied once.
func (a *Agent) localAddressEvents(ctx context.Context, updates <-chan netlink.AddrUpdate, failed <-chan error, set localAddressSetter) error {
	have := linkAddrs{}
	var last []netip.Addr
	settle := time.NewTimer(time.Hour)
	settle.Stop()
	apply := func() {
		addrs := have.list()
		if slices.Equal(addrs, last) {
			return
		}
		last = addrs
		a.log.Info("NodePort addresses besides the InternalIPs", "addresses", addrs)
		set.SetLocalAddresses(addrs)
		a.changed()
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-failed:
			return err
		case <-settle.C:
			apply()
		case u, ok := <-updates:
			if !ok {
				return errors.New("the address subscription closed")
			}
			ip, ok := netip.AddrFromSlice(u.LinkAddress.IP)
			if !ok || !a.cfg.nodePortAddress(ip) {
				continue
			}
			have.update(u.LinkIndex, ip.Unmap(), u.NewAddr)
			settle.Reset(100 * time.Millisecond)
		}
	}
}
