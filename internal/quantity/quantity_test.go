package quantity

import (
	"errors"
	"testing"
	"time"
)

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want string // "" when refused
	}{
		{"500m", "500m"},
		{"1e3", "1e3"},
		{"1e-999999", "1e-9"},
		{"1E+000000000003", "1E+000000000003"},
		{"1e-2000000000", ""},
		{"92233720E68547077580", ""},
		{"2E6024865272343", ""},
		{"1.5e-2147483647", ""},
		{".5e1234567", ""},
	} {
		start := time.Now()
		q, err := Parse(tc.in)
		if took := time.Since(start); took > 5*time.Second {
			t.Errorf("Parse(%q) took %v", tc.in, took)
		}
		if tc.want == "" {
			var ee *ExponentError
			if !errors.As(err, &ee) || ee.Value != tc.in {
				t.Errorf("Parse(%q) = %v, %v; want an ExponentError naming it", tc.in, q.String(), err)
			}
			continue
		}
		if err != nil || q.String() != tc.want {
			t.Errorf("Parse(%q) = %v, %v; want %s", tc.in, q.String(), err, tc.want)
		}
	}
}

func TestCheck(t *testing.T) {
	for _, tc := range []struct {
		text string
		bad  string
	}{
		{"status:\n  allocatable:\n    cpu: 1e-2000000000\n", "1e-2000000000"},
		{`{"status":{"allocatable":{"cpu":"92233720E68547077580"}}}`, "92233720E68547077580"},
		{"cpu: [1e3, 4e12345678]\n", "4e12345678"},
		{"cpu: 1e-999999\nmemory: 64Mi\n", ""},
		// Not a scalar of its own: a hash or a name that merely contains
		// the shape is left alone.
		{"name: abc1e2000000000\nimage: sha256:9e1234567890123456789abcdef\n", ""},
	} {
		err := Check([]byte(tc.text))
		var ee *ExponentError
		switch {
		case tc.bad == "" && err != nil:
			t.Errorf("Check(%q) = %v; want nil", tc.text, err)
		case tc.bad != "" && (!errors.As(err, &ee) || ee.Value != tc.bad):
			t.Errorf("Check(%q) = %v; want an ExponentError naming %q", tc.text, err, tc.bad)
		}
	}
}
