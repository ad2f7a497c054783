package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"

	"github.com/sluice-dataplane/sluice/internal/api"
	"github.com/sluice-dataplane/sluice/internal/monitor"
)

// MonitorOptions are `sluice monitor`'s filters and output.
type MonitorOptions struct {
	types, reasons                   []string
	service, frontend, backend, node string
	since                            time.Duration
	follow                           bool
}

// Node is --node: one node's events only ("": every node's).
func (o *MonitorOptions) Node() string { return o.node }

// AddFlags adds the event filters' flags to cmd.
func (o *MonitorOptions) AddFlags(cmd *cobra.Command) {
	f := cmd.Flags()
	f.StringSliceVar(&o.types, "type", nil, "event types (comma separated): "+strings.Join(monitor.Types, ", "))
	var reasons []string
	for _, r := range monitor.DropReasons {
		reasons = append(reasons, r.Name)
	}
	f.StringSliceVar(&o.reasons, "reason", nil, "drop reasons (comma separated): "+strings.Join(reasons, ", "))
	f.StringVar(&o.service, "service", "", "a Service, namespace/name (or namespace/name:port)")
	f.StringVar(&o.frontend, "frontend", "", "a frontend, ADDR:PORT or ADDR")
	f.StringVar(&o.backend, "backend", "", "a backend, ADDR:PORT or ADDR")
	f.StringVar(&o.node, "node", "", "a node's events only")
	f.DurationVar(&o.since, "since", 0, "first the events the agent kept from this long ago (e.g. 5m), then the new ones")
	f.BoolVar(&o.follow, "follow", true, "keep streaming new events (--follow=false: the kept ones, with --since, and exit)")
}

// query checks the options and builds the API query.
func (o *MonitorOptions) Query() (api.MonitorQuery, error) {
	if o.since < 0 {
		return api.MonitorQuery{}, fmt.Errorf("--since=%s: want a positive duration", o.since)
	}
	q := api.MonitorQuery{Follow: o.follow, Filter: monitor.Filter{
		Types: o.types, Reasons: o.reasons, Service: o.service, Frontend: o.frontend, Backend: o.backend, Node: o.node,
	}}
	if o.since > 0 {
		q.Filter.Since = time.Now().Add(-o.since)
	}
	if !o.follow && o.since == 0 {
		return q, errors.New("--follow=false prints the kept events only: give --since too")
	}
	return q, q.Filter.Check()
}

func monitorCommand() *cobra.Command {
	var (
		a agentOptions
		o MonitorOptions
	)
	cmd := &cobra.Command{
		Use:   "monitor",
		Short: "Stream the datapath's events: drops with their reason, new flows, socket-LB translations, conntrack",
		Long: `monitor streams events from the agent as they happen, one line each (-o json:
one JSON object a line). Drops are always recorded (the last ones are kept for
--since); new flows (service), socket-LB translations (sock) and conntrack
closes (ct-close) are written by the datapath only while a monitor asks for
them. Each CPU writes at most the agent's --monitor-rate events a second; the
rest are counted in sluice_monitor_events_suppressed_total. Ctrl-C ends it.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			q, err := o.Query()
			if err != nil {
				return err
			}
			return StreamEvents(cmd.Context(), cmd.OutOrStdout(), a.output == "json", map[string]*api.Client{"": c}, q)
		},
	}
	a.addFlags(cmd)
	o.AddFlags(cmd)
	return cmd
}

// StreamEvents prints the events of each agent (by node name) until ctx is
// done or, without Follow, each has sent its kept ones. An agent that
// fails ends the stream with its error.
func StreamEvents(ctx context.Context, w io.Writer, asJSON bool, clients map[string]*api.Client, q api.MonitorQuery) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		mu   sync.Mutex
		wg   sync.WaitGroup
		errs []error
	)
	enc := json.NewEncoder(w)
	for node, c := range clients {
		wg.Go(func() {
			err := c.Monitor(ctx, q, func(e monitor.Event) error {
				if node != "" && e.Node == "" {
					e.Node = node
				}
				mu.Lock()
				defer mu.Unlock()
				if asJSON {
					return enc.Encode(e)
				}
				_, err := fmt.Fprintln(w, e.String())
				return err
			})
			if err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
				cancel()
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// writeMonitor is `sluice status`'s Monitor lines.
func writeMonitor(line func(k, format string, args ...any), m *api.MonitorStatus) {
	if m == nil {
		return
	}
	drops := "drop events only while a monitor reads"
	if m.Drops {
		drops = "drop events always (kept for --since)"
	}
	line("Monitor", "ring %s, %d events/s per CPU, %s; %d readers, %d events read, %d suppressed",
		humanBytes(uint64(m.RingBytes)), m.Rate, drops, m.Readers, m.Events, m.Suppressed)
	if len(m.DropsByReason) > 0 {
		var parts []string
		for _, r := range sortedKeys(m.DropsByReason) {
			parts = append(parts, fmt.Sprintf("%s %d", r, m.DropsByReason[r]))
		}
		line("  Drops", "%s", strings.Join(parts, ", "))
	}
}
