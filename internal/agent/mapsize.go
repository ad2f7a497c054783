package agent

import (
	"fmt"
	"log/slog"

	"github.com/sluice-dataplane/sluice/internal/datapath"
)

// chooseMapSizes sizes the LB, conntrack and SNAT maps from the node's
// memory and --bpf-map-dynamic-size-ratio, explicit --bpf-*-max flags
// winning, and logs once what it chose and why.
func chooseMapSizes(cfg *Config, log *slog.Logger) (datapath.ChosenSizes, error) {
	in := datapath.MapSizing{Ratio: cfg.MapSizeRatio, Services: cfg.LBMapMax, CT: cfg.CTMapMax, NAT: cfg.NATMapMax}
	mem, err := datapath.MemTotal()
	if err != nil && cfg.MapSizeRatio > 0 {
		return datapath.ChosenSizes{}, fmt.Errorf("--bpf-map-dynamic-size-ratio=%v: %w; "+
			"set it to 0 for the fixed sizes, or give --bpf-lb-map-max, --bpf-ct-global-max and --bpf-nat-global-max", cfg.MapSizeRatio, err)
	}
	in.MemTotal = mem // only logged when the ratio is 0
	c := datapath.SizeMaps(in)
	c.LB.Events = cfg.MonitorBufferSize
	args := []any{"memTotal", mib(in.MemTotal), "ratio", cfg.MapSizeRatio, "budget", mib(c.Budget)}
	for _, m := range c.Maps {
		args = append(args, m.Name, mapSizeSource(m, cfg.MapSizeRatio))
	}
	log.Info("BPF map sizes (docs/maps.md)", args...)
	return c, nil
}

// mapSizeSource says how many entries a map got and where the number came
// from, for the log: "291840 (ratio)", "1048576 (--bpf-lb-map-max)".
func mapSizeSource(m datapath.SizedMap, ratio float64) string {
	from := m.From
	switch {
	case m.From == datapath.FromFlag:
		from = "--" + m.Flag
	case m.From == datapath.FromFloor && ratio == 0:
		from = "fixed, --bpf-map-dynamic-size-ratio=0"
	case m.From == datapath.FromFloor:
		from = "floor"
	case m.From == datapath.FromRatio:
		from = "MemTotal × ratio"
	case m.From == datapath.FromServices:
		from = "as lb_services"
	}
	return fmt.Sprintf("%d (%s)", m.Entries, from)
}

func mib(b uint64) string {
	return fmt.Sprintf("%.1fMiB", float64(b)/(1<<20))
}
