package probetest

import "testing"

func TestAtLeast(t *testing.T) {
	for _, tc := range []struct {
		major, minor int
		release      string
		want         bool
	}{
		{6, 18, "5.7", true},
		{5, 7, "5.7", true},
		{5, 6, "5.7", false},
		{4, 19, "5.0", false},
		{6, 6, "6.6", true},
		{6, 18, "", false},
		{6, 18, "x.y", false},
	} {
		if got := atLeast(tc.major, tc.minor, tc.release); got != tc.want {
			t.Errorf("atLeast(%d, %d, %q) = %v, want %v", tc.major, tc.minor, tc.release, got, tc.want)
		}
	}
}
