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
	for obj, spec := range map[string]*ebpf.CollectionSpec{"tc_edt": tc, "sock_edt": sock} {
		for _, s := range []struct {
			cName string
			goVal any
		}{
			{"bw_key", bwKey{}},
			{"bw_limit", bwLimit{}},
			{"bw_state", bwState{}},
			{"bw_addr_val", bwAddrVal{}},
		} {
			if err := bpftest.StructLayout(spec, s.cName, s.goVal); err != nil {
				t.Errorf("%s: %v", obj, err)
			}
		}
		for _, m := range []struct {
			name       string
			key, value any
		}{
			{LimitsMapName, bwKey{}, bwLimit{}},
			{StateMapName, bwKey{}, bwState{}},
			{AddrMapName, [16]byte{}, bwAddrVal{}},
		} {
			if err := bpftest.MapLayout(spec, m.name, m.key, m.value); err != nil {
				t.Errorf("%s: %v", obj, err)
			}
		}
	}
}
