package loadbalancer

import (
	"errors"
	"reflect"
	"testing"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestSliceValidation: a Slice's errors name the address as the
// EndpointSlice wrote it (a v4-mapped address in an IPv6 slice, an
// unparsable one, none), and a Slice made without NewSlice is refused,
// not a panic.
func TestSliceValidation(t *testing.T) {
	meta := metav1.ObjectMeta{Namespace: "ns", Name: "web-1"}
	for _, c := range []struct {
		name   string
		family discoveryv1.AddressType
		addrs  []string
		field  string
		value  string
	}{
		{"v4-mapped in an IPv6 slice", discoveryv1.AddressTypeIPv6, []string{"::ffff:198.18.1.10"}, "endpoints[0].addresses[0]", "::ffff:198.18.1.10"},
		{"IPv6 in an IPv4 slice", discoveryv1.AddressTypeIPv4, []string{"FD00::10"}, "endpoints[0].addresses[0]", "FD00::10"},
		{"not an address", discoveryv1.AddressTypeIPv4, []string{"pod.example"}, "endpoints[0].addresses[0]", "pod.example"},
		{"empty", discoveryv1.AddressTypeIPv4, []string{""}, "endpoints[0].addresses[0]", ""},
		{"none", discoveryv1.AddressTypeIPv4, nil, "endpoints[0].addresses", ""},
	} {
		s := NewSlice(&discoveryv1.EndpointSlice{ObjectMeta: meta, AddressType: c.family,
			Endpoints: []discoveryv1.Endpoint{{Addresses: c.addrs}}})
		var fe *FieldError
		if err := validateEndpointSlice(s); !errors.As(err, &fe) || fe.Field != c.field || fe.Value != c.value {
			t.Errorf("%s: %v, want a field error at %s naming %q", c.name, err, c.field, c.value)
		}
	}
	handmade := &Slice{ObjectMeta: meta, AddressType: discoveryv1.AddressTypeIPv4, Endpoints: []Endpoint{{Ready: true}}}
	var fe *FieldError
	if err := validateEndpointSlice(handmade); !errors.As(err, &fe) || fe.Field != "endpoints[0].addresses" {
		t.Errorf("an endpoint without an address: %v, want it refused", err)
	}
}

// TestSliceDeepCopy: DeepCopyObject's copy equals its source (an empty
// port list stays empty, not nil) and shares nothing that can change.
func TestSliceDeepCopy(t *testing.T) {
	s := NewSlice(&discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "ns", Name: "web-1", Labels: map[string]string{discoveryv1.LabelServiceName: "web"}},
		AddressType: discoveryv1.AddressTypeIPv4, Ports: []discoveryv1.EndpointPort{},
		Endpoints: []discoveryv1.Endpoint{{Addresses: []string{"10.0.0.1"},
			Hints: &discoveryv1.EndpointHints{ForZones: []discoveryv1.ForZone{{Name: "a"}}}}},
	})
	c := s.DeepCopyObject().(*Slice)
	if !reflect.DeepEqual(c, s) || c.Service != "web" {
		t.Fatalf("copy %+v, want %+v", c, s)
	}
	c.Endpoints[0].rare.zones[0] = "b"
	c.Labels["x"] = "y"
	if s.Endpoints[0].Zones()[0] != "a" || s.Labels["x"] != "" {
		t.Error("the copy shares the source's zones or labels")
	}
}
