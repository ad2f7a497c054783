package agent

import (
	"errors"
	"testing"

	"github.com/sluice-dataplane/sluice/internal/datapath"
)

// The XDP object is loaded where a device may run XDP: native or generic,
// best-effort unless every device is a veth (a device that cannot be
// resolved or inspected leaves the verdict to AttachDevices, which
// reports it), never with acceleration disabled or without devices.
func TestXDPWanted(t *testing.T) {
	// Ifindex 1: a veth; 2: not; 3: cannot be inspected.
	devices := map[string]int{"veth0": 1, "veth1": 1, "eth0": 2, "gone0": 3}
	xdpResolveDevices = func(names []string) ([]datapath.Device, error) {
		var out []datapath.Device
		for _, n := range names {
			i, ok := devices[n]
			if !ok {
				return nil, errors.New("no such device " + n)
			}
			out = append(out, datapath.Device{Name: n, Ifindex: i})
		}
		return out, nil
	}
	xdpIsVeth = func(ifindex int) (bool, error) {
		if ifindex == 3 {
			return false, errors.New("gone")
		}
		return ifindex == 1, nil
	}
	t.Cleanup(func() { xdpResolveDevices, xdpIsVeth = resolveDevices, datapath.IsVeth })
	for _, tc := range []struct {
		accel   string
		generic bool
		devices []string
		want    bool
	}{
		{"disabled", false, []string{"eth0"}, false},
		{"native", false, []string{"veth0"}, true},
		{"native", false, nil, false},
		{"best-effort", false, nil, false},
		{"best-effort", true, []string{"veth0"}, true}, // generic: tests only
		{"best-effort", false, []string{"veth0", "veth1"}, false},
		{"best-effort", false, []string{"veth0", "eth0"}, true},
		{"best-effort", false, []string{"veth0", "gone0"}, true},
		{"best-effort", false, []string{"nosuch0"}, true},
	} {
		cfg := &Config{LBAcceleration: tc.accel, XDPGeneric: tc.generic, Devices: tc.devices}
		if got := xdpWanted(cfg); got != tc.want {
			t.Errorf("--lb-acceleration %s, generic %t, devices %v: %t, want %t", tc.accel, tc.generic, tc.devices, got, tc.want)
		}
	}
}
