package bench

import (
	"bytes"
	"testing"

	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// The napi-get request carries a generic netlink header whose reserved
// field is zero: 6.18 answers EINVAL to anything else.
func TestNAPIGetRequestHeader(t *testing.T) {
	req := nl.NewNetlinkRequest(0x14, unix.NLM_F_DUMP)
	req.AddData(genlHeader{cmd: netdevCmdNAPIGet, version: 1})
	req.AddData(nl.NewRtAttr(netdevANAPIIfindex, nl.Uint32Attr(7)))
	b := req.Serialize()
	if len(b) != unix.SizeofNlMsghdr+nl.SizeofGenlmsg+8 {
		t.Fatalf("request is %d bytes: %x", len(b), b)
	}
	if got, want := b[unix.SizeofNlMsghdr:unix.SizeofNlMsghdr+nl.SizeofGenlmsg], []byte{netdevCmdNAPIGet, 1, 0, 0}; !bytes.Equal(got, want) {
		t.Fatalf("generic netlink header %x, want %x", got, want)
	}
}
