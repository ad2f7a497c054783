package bandwidth

import (
	"testing"

	"github.com/cilium/ebpf"

	"github.com/sluice-dataplane/sluice/internal/bpftest"
)

// TestBTFLayout: the Go mirrors of the map values match bpf/lib/edt.h byte
// for byte in both objects (they share the pinned maps).
func TestBTFLayout(t *testing.T) {
	tc, err := loadTcedt()
	if err != nil {
		t.Fatal(err)
	}
	sock, err := loadSockedt()
	if err != nil {
		t.Fatal(err)
	}
	bpftest.CheckLayouts(t, map[string]*ebpf.CollectionSpec{"tc_edt": tc, "sock_edt": sock},
		[]bpftest.Struct{
			{C: "bw_key", Go: bwKey{}},
			{C: "bw_limit", Go: bwLimit{}},
			{C: "bw_state", Go: bwState{}},
			{C: "bw_addr_val", Go: bwAddrVal{}},
		},
		[]bpftest.Map{
			{Name: LimitsMapName, Key: bwKey{}, Value: bwLimit{}},
			{Name: StateMapName, Key: bwKey{}, Value: bwState{}},
			{Name: AddrMapName, Key: [16]byte{}, Value: bwAddrVal{}},
		})
}
