package bandwidth

import (
	"errors"
	"strings"
	"testing"
)

// The kubelet's and the bandwidth CNI plugin's reading: a Quantity in bits
// per second, decimal suffixes (k, M, G) and binary ones (Ki, Mi).
func TestParseRate(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    Rate
		wantErr string
	}{
		{"50M", 50_000_000, ""},
		{"1G", 1_000_000_000, ""},
		{"500k", 500_000, ""},
		{"10Mi", 10 * 1024 * 1024, ""},
		{"1.5M", 1_500_000, ""},
		{" 2M ", 2_000_000, ""},
		{"1k", 1000, ""},    // the lowest
		{"100G", 100e9, ""}, // the highest
		{"1500.5", 1501, ""},
		{"fast", 0, `"fast" is not a quantity`},
		{"", 0, `"" is not a quantity`},
		{"50 M", 0, "is not a quantity"},
		{"-1M", 0, `"-1M" is negative`},
		{"999", 0, `"999" is below 1k bit/s`},
		{"0", 0, "below 1k"},
		{"100001M", 0, `"100001M" is above 100G bit/s`},
		{"1E", 0, "above 100G"},
		// ParseQuantity never returns on these (kubernetes#141203).
		{"1e-2000000000", 0, `"1e-2000000000": exponent out of range`},
		{"92233720E68547077580", 0, "exponent out of range"},
	} {
		got, err := ParseRate(tc.in)
		switch {
		case tc.wantErr == "" && (err != nil || got != tc.want):
			t.Errorf("ParseRate(%q) = %d, %v; want %d", tc.in, got, err, tc.want)
		case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
			t.Errorf("ParseRate(%q) = %d, %v; want an error with %q", tc.in, got, err, tc.wantErr)
		}
	}
}

func TestRateUnits(t *testing.T) {
	for _, tc := range []struct {
		r     Rate
		bytes uint64
		str   string
	}{
		{50_000_000, 6_250_000, "50M"}, {1000, 125, "1k"}, {1_500_000, 187_500, "1500k"}, {100e9, 12_500_000_000, "100G"}, {1001, 125, "1001"},
	} {
		if b, s := tc.r.BytesPerSecond(), tc.r.String(); b != tc.bytes || s != tc.str {
			t.Errorf("Rate(%d): %d bytes/s %q, want %d %q", uint64(tc.r), b, s, tc.bytes, tc.str)
		}
	}
}

// A bad value leaves the whole Pod unlimited and names the annotation and
// its value; a missing annotation is no limit.
func TestPodLimits(t *testing.T) {
	for _, tc := range []struct {
		name    string
		ann     map[string]string
		want    Limits
		badVals []string
	}{
		{"none", nil, Limits{}, nil},
		{"egress", map[string]string{EgressAnnotation: "50M"}, Limits{Egress: 50e6}, nil},
		{"both", map[string]string{EgressAnnotation: "50M", IngressAnnotation: "1G", "other": "x"}, Limits{Egress: 50e6, Ingress: 1e9}, nil},
		{"bad egress", map[string]string{EgressAnnotation: "fast", IngressAnnotation: "1G"}, Limits{}, []string{EgressAnnotation + "=fast"}},
		{"both bad", map[string]string{EgressAnnotation: "-1M", IngressAnnotation: "200G"},
			Limits{}, []string{EgressAnnotation + "=-1M", IngressAnnotation + "=200G"}},
	} {
		got, err := PodLimits(tc.ann)
		if got != tc.want {
			t.Errorf("%s: limits %+v, want %+v", tc.name, got, tc.want)
		}
		if (err != nil) != (len(tc.badVals) > 0) {
			t.Errorf("%s: error %v, want bad %v", tc.name, err, tc.badVals)
			continue
		}
		if err == nil {
			continue
		}
		if got := annotationValues(err); got != strings.Join(tc.badVals, ", ") {
			t.Errorf("%s: bad values %q, want %q", tc.name, got, strings.Join(tc.badVals, ", "))
		}
		var ae *AnnotationError
		if !errors.As(err, &ae) || !strings.Contains(err.Error(), ae.Annotation) {
			t.Errorf("%s: %v does not name the annotation", tc.name, err)
		}
	}
}
