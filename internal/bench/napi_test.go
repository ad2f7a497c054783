package bench

import (
	"bytes"
	"testing"

	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// The napi-get request carries a generic netlink header whose reserved
// field is zero (the kernel answers EINVAL to anything else) and the
// ifindex filter.
func TestNAPIGetRequestHeader(t *testing.T) {
	b := napiGetRequest(0x14, 7).Serialize()
	if len(b) != unix.SizeofNlMsghdr+nl.SizeofGenlmsg+8 {
		t.Fatalf("request is %d bytes: %x", len(b), b)
	}
	if got, want := b[unix.SizeofNlMsghdr:unix.SizeofNlMsghdr+nl.SizeofGenlmsg], []byte{netdevCmdNAPIGet, 1, 0, 0}; !bytes.Equal(got, want) {
		t.Fatalf("generic netlink header %x, want %x", got, want)
	}
	attr := b[unix.SizeofNlMsghdr+nl.SizeofGenlmsg:]
	if want := []byte{8, 0, netdevANAPIIfindex, 0, 7, 0, 0, 0}; !bytes.Equal(attr, want) {
		t.Fatalf("ifindex attribute %x, want %x", attr, want)
	}
}
