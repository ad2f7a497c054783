package agent

import (
	"slices"
	"testing"

	"github.com/sluice-dataplane/sluice/internal/lbmap"
)

func TestServiceFlags(t *testing.T) {
	tests := []struct {
		name    string
		flags   uint16
		timeout uint32
		want    []string
	}{
		{"none", 0, 0, nil},
		{"nodeport wildcard", lbmap.SvcFlagNodePort | lbmap.SvcFlagWildcard, 0, []string{"nodeport", "wildcard"}},
		{"affinity shows its timeout", lbmap.SvcFlagAffinity, 60, []string{"affinity=60s"}},
		{"maglev and source ranges", lbmap.SvcFlagLoadBalancer | lbmap.SvcFlagMaglev | lbmap.SvcFlagSourceRanges, 0,
			[]string{"loadbalancer", "maglev", "source-ranges"}},
		{"hostport", lbmap.SvcFlagHostPort | lbmap.SvcFlagETPLocal, 0, []string{"etp=Local", "hostport"}},
		{"unknown bits in hex", lbmap.SvcFlagETPLocal | 1<<12, 0, []string{"etp=Local", "0x1000"}},
	}
	for _, tt := range tests {
		if got := serviceFlags(tt.flags, tt.timeout); !slices.Equal(got, tt.want) {
			t.Errorf("%s: serviceFlags(%#x, %d) = %q, want %q", tt.name, tt.flags, tt.timeout, got, tt.want)
		}
	}
}
