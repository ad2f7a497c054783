package tune

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/sluice-dataplane/sluice/internal/api"
)

func TestPendingNamesUnknownItem(t *testing.T) {
	items := []Item{{ID: "big-tcp", CanApply: true}, {ID: "dsr", Possible: true, Flags: []string{"--lb-mode=dsr"}}, {ID: "xdp", Applied: true}}
	if _, err := Pending(items, []string{"bigtcp"}); err == nil || !strings.Contains(err.Error(), `"bigtcp"`) || !strings.Contains(err.Error(), "big-tcp") {
		t.Errorf("Pending(bigtcp) = %v, want an error naming it and the known items", err)
	}
	got, err := Pending(items, nil)
	if err != nil || len(got) != 2 || got[0].ID != "big-tcp" || got[1].ID != "dsr" {
		t.Errorf("Pending(all) = %v, %v; want big-tcp and dsr", got, err)
	}
}

func TestNotrackRuleset(t *testing.T) {
	r := notrackRuleset([]netip.Prefix{netip.MustParsePrefix("198.18.1.0/24"), netip.MustParsePrefix("198.18.2.0/24"), netip.MustParsePrefix("fd00:198:18:1::/64")})
	for _, want := range []string{"table inet sluice_tune", "hook prerouting priority raw", "hook output priority raw",
		"ip saddr { 198.18.1.0/24, 198.18.2.0/24 } ip daddr { 198.18.1.0/24, 198.18.2.0/24 } notrack",
		"ip6 saddr { fd00:198:18:1::/64 } ip6 daddr { fd00:198:18:1::/64 } notrack"} {
		if !strings.Contains(r, want) {
			t.Errorf("ruleset lacks %q:\n%s", want, r)
		}
	}
}

func TestNormalizeFile(t *testing.T) {
	for in, want := range map[string]string{"none voluntary (full) lazy\n": "full", "performance\n": "performance", "0-1\n": "0-1"} {
		if got := normalizeFile("x", in); got != want {
			t.Errorf("normalizeFile(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestPrintAgentFlags(t *testing.T) {
	var b strings.Builder
	printAgentFlags(&b, []Item{
		{ID: "dsr", Possible: true, Flags: []string{"--lb-mode=dsr"}},
		{ID: "bbr", Possible: true, Flags: []string{"--enable-bandwidth-manager", "--enable-bbr"}},
		{ID: "bm", Possible: true, Flags: []string{"--enable-bandwidth-manager"}},
		{ID: "xdp", Possible: false, Flags: []string{"--lb-acceleration=native"}},
		{ID: "kpr", Possible: true, Flags: []string{"--devices=<the node's external devices>"}},
	})
	out := b.String()
	for _, want := range []string{"sluice-agent --lb-mode=dsr --enable-bandwidth-manager --enable-bbr --devices=<the node's external devices>",
		`"enable-bandwidth-manager":"true"`, `"enable-bbr":"true"`, `"lb-mode":"dsr"`, "rollout restart daemonset/sluice"} {
		if !strings.Contains(out, want) {
			t.Errorf("agent flags output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "lb-acceleration") || strings.Contains(out, `"devices"`) {
		t.Errorf("agent flags output has what is impossible here or a placeholder in the patch:\n%s", out)
	}
}

// BIG TCP is not offered where the agent runs DSR: its outer header cannot
// carry an aggregate over 64 KiB.
func TestBigTCPNotWithDSR(t *testing.T) {
	for _, mode := range []string{"dsr", "hybrid"} {
		e := &env{major: 6, minor: 12, release: "6.12.0", agents: []*api.Status{{NorthSouth: &api.NorthSouth{Enabled: true, Mode: mode}}}}
		it := bigTCP(e)
		if it.Possible || len(it.Changes) > 0 || !strings.Contains(it.Why, "DSR") {
			t.Errorf("mode %s: possible %t, %d changes, why %q; want not possible, no change, DSR named", mode, it.Possible, len(it.Changes), it.Why)
		}
	}
}
