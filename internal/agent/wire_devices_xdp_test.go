package agent

import "testing"

// The XDP object is loaded where a device may run XDP: native or generic,
// best-effort unless every device is a veth (a device that cannot be
// resolved leaves the verdict to AttachDevices, which reports it), and
// never with acceleration disabled.
func TestXDPWanted(t *testing.T) {
	for _, tc := range []struct {
		accel   string
		generic bool
		devices []string
		want    bool
	}{
		{"disabled", false, []string{"eth0"}, false},
		{"native", false, []string{"eth0"}, true},
		{"best-effort", true, []string{"eth0"}, true},
		{"best-effort", false, []string{"sluice-no-such-device"}, true},
		{"best-effort", false, nil, true},
	} {
		cfg := &Config{LBAcceleration: tc.accel, XDPGeneric: tc.generic, Devices: tc.devices}
		if got := xdpWanted(cfg); got != tc.want {
			t.Errorf("--lb-acceleration %s, generic %t, devices %v: %t, want %t", tc.accel, tc.generic, tc.devices, got, tc.want)
		}
	}
}
