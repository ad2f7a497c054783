package bandwidth

import (
	"errors"
	"strings"
	"testing"
)

func TestDecide(t *testing.T) {
	noFQ := errors.New(`sch_fq: no such file or directory`)
	for _, tc := range []struct {
		name    string
		facts   Facts
		opts    Options
		mode    Mode
		line    string
		wantErr string
	}{
		{"fq and devices", Facts{Release: "6.12.117+deb12-amd64"}, Options{Devices: []string{"eth0"}},
			ModeEDT, "EDT with BPF [eth0]", ""},
		{"BBR", Facts{Release: "6.1.0-56-amd64"}, Options{BBR: true, Devices: []string{"eth0"}},
			ModeEDT, "EDT with BPF [BBR] [eth0]", ""},
		{"no fq", Facts{Release: "6.18.44", FQ: noFQ}, Options{Devices: []string{"fab0"}},
			ModePolice, "TCP pacing with a BPF policer, TBF for ingress (kernel lacks sch_fq) [fab0]", ""},
		{"no devices", Facts{Release: "6.12.1"}, Options{},
			ModePolice, "TCP pacing with a BPF policer, TBF for ingress (no --devices for fq)", ""},
		{"BBR on 5.18", Facts{Release: "5.18.0"}, Options{BBR: true, Devices: []string{"eth0"}}, ModeEDT, "EDT with BPF [BBR] [eth0]", ""},
		{"BBR on 5.15", Facts{Release: "5.15.0-91-generic"}, Options{BBR: true}, 0, "",
			"--enable-bbr: kernel 5.15.0-91-generic is older than 5.18"},
		{"BBR on 4.19", Facts{Release: "4.19.0"}, Options{BBR: true}, 0, "", "older than 5.18"},
		{"release unreadable", Facts{Release: "linux"}, Options{BBR: true}, 0, "", `kernel release "linux"`},
	} {
		d, err := Decide(tc.facts, tc.opts)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("%s: %+v, %v; want an error with %q", tc.name, d, err, tc.wantErr)
			}
			continue
		}
		if err != nil || d.Mode != tc.mode || d.StatusLine(tc.opts.Devices) != tc.line {
			t.Errorf("%s: mode %d line %q err %v; want %d %q", tc.name, d.Mode, d.StatusLine(tc.opts.Devices), err, tc.mode, tc.line)
		}
	}
}
