package labcli

import (
	"slices"
	"testing"
	"time"

	"github.com/spf13/pflag"
)

// The flags a user set go into the guest's command line as they were
// given; unset ones and the skipped ones do not.
func TestGuestFlags(t *testing.T) {
	fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
	fs.StringSlice("contenders", []string{"a", "b"}, "")
	fs.IntSlice("sizes", []int{1}, "")
	fs.Bool("udp", true, "")
	fs.Duration("duration", time.Second, "")
	fs.String("guest", "", "")
	fs.String("out", "x", "")
	fs.Int("unset", 3, "")
	if err := fs.Parse([]string{"--contenders", "edt-fq,tbf-cni", "--sizes", "1,100", "--udp=false", "--duration", "3s",
		"--guest", "6.12", "--out", "/tmp/r"}); err != nil {
		t.Fatal(err)
	}
	got := guestFlags(fs, []string{"guest", "out"})
	want := []string{"--contenders=edt-fq,tbf-cni", "--duration=3s", "--sizes=1,100", "--udp=false"}
	if !slices.Equal(got, want) {
		t.Errorf("guestFlags: %q, want %q", got, want)
	}
}
