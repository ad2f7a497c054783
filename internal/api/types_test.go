package api

import (
	"strings"
	"testing"
)

// TestStatusServing: an agent serves once it has synced and attached what
// it runs; each missing step is named (the chart's readiness, sluice
// status --ready).
func TestStatusServing(t *testing.T) {
	attached := []AttachPoint{{Hook: "connect4"}}
	devices := []Device{{Name: "eth0"}}
	for _, tc := range []struct {
		name string
		st   Status
		want string // "" ready, else part of the error
	}{
		{"starting", Status{}, "no sync yet"},
		{"synced, socket LB not attached", Status{Sync: SyncState{Total: 1}, SocketLB: SocketLB{Enabled: true}}, "socket LB"},
		{"socket LB attached, devices not", Status{Sync: SyncState{Total: 1}, SocketLB: SocketLB{Enabled: true, AttachPoints: attached},
			NorthSouth: &NorthSouth{Enabled: true}}, "tc/XDP"},
		{"all attached", Status{Sync: SyncState{Total: 1}, SocketLB: SocketLB{Enabled: true, AttachPoints: attached},
			NorthSouth: &NorthSouth{Enabled: true, Devices: devices}}, ""},
		{"no socket LB, no devices", Status{Sync: SyncState{Total: 3}}, ""},
	} {
		err := tc.st.Serving()
		if (tc.want == "") != (err == nil) || err != nil && !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		}
	}
}
