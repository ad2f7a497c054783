package scaleset

import (
	"net/netip"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
)

func TestUnreachableDistinct(t *testing.T) {
	cidrs := map[string]netip.Prefix{"node1": netip.MustParsePrefix("198.18.1.0/24"), "node2": netip.MustParsePrefix("198.18.2.0/24")}
	seen := map[netip.AddrPort]int{}
	const n, m = 10000, 10
	for i := range n {
		eps, port, err := Unreachable(i, m, cidrs)
		if err != nil {
			t.Fatalf("Unreachable(%d): %v", i, err)
		}
		for _, ep := range eps {
			ap := netip.AddrPortFrom(ep.Addr, uint16(port))
			if prev, dup := seen[ap]; dup {
				t.Fatalf("Service %d and %d share backend %s", prev, i, ap)
			}
			seen[ap] = i
			cidr := cidrs[ep.NodeName]
			if !cidr.Contains(ep.Addr) || ep.Addr.As4()[3] < 100 || ep.Addr.As4()[3] > 249 {
				t.Fatalf("Service %d: backend %s on %s outside %s .100-.249", i, ep.Addr, ep.NodeName, cidr)
			}
		}
	}
	if len(seen) != n*m {
		t.Errorf("%d distinct backends, want %d", len(seen), n*m)
	}
}

func TestConfig(t *testing.T) {
	c := DefaultConfig()
	if err := c.Validate(10000); err != nil {
		t.Fatal(err)
	}
	if err := c.Validate(MaxServices + 1); err == nil {
		t.Errorf("Validate(%d) passed, want an error", MaxServices+1)
	}
	if got := c.ClusterIP(300).String(); got != "198.19.65.44" {
		t.Errorf("ClusterIP(300) = %s, want 198.19.65.44", got)
	}
	if got := c.ClusterIP(MaxServices - 1).String(); got != "198.19.127.255" {
		t.Errorf("ClusterIP(last) = %s, want 198.19.127.255", got)
	}
	now := time.Date(2026, 11, 22, 6, 0, 0, 123456789, time.UTC)
	s := c.Slice(3, 8080, []Endpoint{{Addr: netip.MustParseAddr("198.18.1.2"), NodeName: "node1", PodName: "p"}}, now)
	if got, err := time.Parse(time.RFC3339Nano, s.Annotations[corev1.EndpointsLastChangeTriggerTime]); err != nil || !got.Equal(now) {
		t.Errorf("trigger time %v (%v), want %v", got, err, now)
	}
	if s.Labels["kubernetes.io/service-name"] != "scale-3" || len(s.Endpoints) != 1 || *s.Ports[0].Port != 8080 {
		t.Errorf("slice %+v", s)
	}
	SetTriggerTime(s, time.Time{})
	if _, ok := s.Annotations[corev1.EndpointsLastChangeTriggerTime]; ok {
		t.Errorf("trigger time left after clearing: %v", s.Annotations)
	}
}
