package lab

import (
	"strings"
	"testing"
)

func TestConfigNorthSouthDefaultsAndValidation(t *testing.T) {
	for _, tt := range []struct {
		name             string
		mode, accel      string
		wantMode, wantAc string
		wantErr          string // substring; "" for none
	}{
		{"defaults", "", "", LBModeSNAT, AccelerationBestEffort, ""},
		{"dsr native", LBModeDSR, AccelerationNative, LBModeDSR, AccelerationNative, ""},
		{"hybrid disabled", LBModeHybrid, AccelerationDisabled, LBModeHybrid, AccelerationDisabled, ""},
		{"unknown mode", "nat", "", "", "", `lb-mode "nat"`},
		{"unknown acceleration", "", "generic", "", "", `lb-acceleration "generic"`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := Config{Nodes: 1, LBMode: tt.mode, LBAcceleration: tt.accel, Exe: "/bin/true", AgentBin: "/bin/true"}
			err := c.setDefaults()
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("setDefaults(lb-mode %q, lb-acceleration %q) = %v, want an error naming %s", tt.mode, tt.accel, err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("setDefaults(lb-mode %q, lb-acceleration %q): %v", tt.mode, tt.accel, err)
			}
			if c.LBMode != tt.wantMode || c.LBAcceleration != tt.wantAc {
				t.Errorf("setDefaults(lb-mode %q, lb-acceleration %q) = %q, %q; want %q, %q",
					tt.mode, tt.accel, c.LBMode, c.LBAcceleration, tt.wantMode, tt.wantAc)
			}
		})
	}
}
