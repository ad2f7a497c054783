package api

import (
	"context"
	"errors"
)

// PathBPFBandwidth is `sluice bpf bandwidth list`.
const PathBPFBandwidth = "/v1/bpf/bandwidth"

// BandwidthManager is the status of the bandwidth manager, like the
// BandwidthManager line of `cilium status`.
type BandwidthManager struct {
	Enabled bool `json:"enabled"`
	// Mechanism is "EDT with BPF" or the fallback, Reason why the
	// fallback (e.g. "kernel lacks sch_fq").
	Mechanism string `json:"mechanism,omitempty"`
	Reason    string `json:"reason,omitempty"`
	BBR       bool   `json:"bbr"`
	// Devices are where EDT stamps (mq+fq on each).
	Devices []string `json:"devices,omitempty"`
	// Line is the one-line summary: "EDT with BPF [BBR] [eth0]".
	Line string `json:"line"`
	// Pods is how many Pods have a limit installed; Invalid how many have
	// a bad annotation (unlimited, listed under Skipped).
	Pods    int `json:"pods"`
	Invalid int `json:"invalid"`
	// Sysctls are the server settings --enable-bbr applied in the
	// agent's network namespace, as "name=value".
	Sysctls []string `json:"sysctls,omitempty"`
}

// BPFBandwidth is `sluice bpf bandwidth list`: a row per limited Pod and
// direction.
type BPFBandwidth struct {
	Entries []BandwidthEntry `json:"entries"`
}

// BandwidthEntry is one direction of one Pod's limit, with the datapath's
// counters.
type BandwidthEntry struct {
	Pod       string   `json:"pod"` // namespace/name
	ID        uint32   `json:"id"`  // the aggregate
	Direction string   `json:"direction"`
	Rate      string   `json:"rate"` // as the annotation: 50M
	BitsPerS  uint64   `json:"bitsPerSecond"`
	Veth      string   `json:"veth"`
	Addresses []string `json:"addresses,omitempty"`
	Packets   uint64   `json:"packets"`
	Bytes     uint64   `json:"bytes"`
	Drops     uint64   `json:"drops"`
	Marks     uint64   `json:"ecnMarks"`
}

// BandwidthProvider is implemented by an agent with the bandwidth manager.
type BandwidthProvider interface {
	BPFBandwidth(ctx context.Context) (*BPFBandwidth, error)
}

// errNoBandwidth answers an agent that has no bandwidth manager to ask.
var errNoBandwidth = errors.New("this agent has no bandwidth manager")

// BPFBandwidth returns the bandwidth manager's limits and counters.
func (c *Client) BPFBandwidth(ctx context.Context) (*BPFBandwidth, error) {
	var d BPFBandwidth
	return &d, c.get(ctx, PathBPFBandwidth, &d)
}
