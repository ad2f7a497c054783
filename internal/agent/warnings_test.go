package agent

import (
	"testing"
	"time"

	"github.com/sluice-dataplane/sluice/internal/api"
)

func TestWarningsSetOnceClearOnce(t *testing.T) {
	var ws warnings
	t0 := time.Unix(100, 0)
	w := api.Warning{Subsystem: "bpffs", Message: "private", Fix: "mount the host's"}
	if !ws.set("bpffs", w, t0) {
		t.Fatal("first set: want reported as new")
	}
	if ws.set("bpffs", w, t0.Add(time.Second)) {
		t.Fatal("same warning again: want not reported (logged once)")
	}
	w2 := w
	w2.Message = "private, still"
	if !ws.set("bpffs", w2, t0.Add(2*time.Second)) {
		t.Fatal("changed message: want reported")
	}
	if got := ws.list(); len(got) != 1 || got[0].Message != w2.Message || !got[0].Since.Equal(t0) {
		t.Fatalf("list = %+v, want one warning with the new message since %v", got, t0)
	}
	ws.set("xdp/eth0", api.Warning{Subsystem: "xdp", Message: "veth"}, t0)
	if got := ws.list(); len(got) != 2 || got[0].Subsystem != "bpffs" || got[1].Subsystem != "xdp" {
		t.Fatalf("list = %+v, want bpffs then xdp", got)
	}
	if !ws.clear("bpffs") || ws.clear("bpffs") {
		t.Fatal("clear: want true once, then false")
	}
}
