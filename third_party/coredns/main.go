// Command coredns is CoreDNS with the plugins the lab's cluster DNS uses,
// built from CoreDNS's Go module (scripts/coredns-build.sh): the
// kubernetes plugin answers the cluster domain from the apiserver, hosts
// and file answer it in manifests mode, forward, cache, health, ready,
// prometheus, loop and reload as in a cluster's default Corefile.
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/file"
	_ "github.com/coredns/coredns/plugin/forward"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/hosts"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/loop"
	_ "github.com/coredns/coredns/plugin/metrics"
	_ "github.com/coredns/coredns/plugin/ready"
	_ "github.com/coredns/coredns/plugin/reload"
	_ "github.com/coredns/coredns/plugin/whoami"
)

// The plugins in the order CoreDNS's plugin.cfg runs them.
func init() {
	dnsserver.Directives = []string{
		"reload", "health", "ready", "prometheus", "errors", "log", "loadbalance", "cache",
		"hosts", "file", "kubernetes", "loop", "forward", "whoami",
	}
}

func main() { coremain.Run() }
