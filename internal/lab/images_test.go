package lab

import (
	"path/filepath"
	"strings"
	"testing"
)

// TestNetfilterTools: the lab's sluice image carries what `sluice
// cleanup-kube-proxy` runs (both iptables backends and families, their
// save and restore, nft) with iptables' extensions and the libraries they
// load themselves (libxt_statistic's libm: without it iptables-legacy-save
// cannot print kube-proxy's rules).
func TestNetfilterTools(t *testing.T) {
	files, err := netfilterTools()
	if err != nil {
		t.Fatal(err)
	}
	have := map[string]string{} // path: link target or source
	for _, f := range files {
		have[f.Path] = f.Link + f.Src
	}
	for _, p := range []string{"/usr/sbin/iptables-legacy-save", "/usr/sbin/ip6tables-legacy-restore",
		"/usr/sbin/iptables-nft-save", "/usr/sbin/ip6tables-nft-restore", "/usr/sbin/iptables",
		"/usr/sbin/xtables-legacy-multi", "/usr/sbin/nft", "/usr/sbin/conntrack",
		filepath.Join(xtablesModules, "libxt_statistic.so"), filepath.Join(xtablesModules, "libxt_comment.so")} {
		if _, ok := have[p]; !ok {
			t.Errorf("the image lacks %s", p)
		}
	}
	libm := false
	for p := range have {
		libm = libm || strings.HasSuffix(p, "/libm.so.6")
	}
	if !libm {
		t.Errorf("the image lacks libm.so.6, which libxt_statistic.so loads")
	}
}
