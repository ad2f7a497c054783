package api

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/sluice-dataplane/sluice/internal/monitor"
)

// PathMonitor streams the datapath's events (`sluice monitor`) as JSON
// lines: the recorded ones from ?since=, then (unless follow=false) every
// new one, until the client goes away.
const PathMonitor = "/v1/monitor"

// MonitorProvider is the part of the agent that serves PathMonitor.
type MonitorProvider interface {
	Monitor(ctx context.Context, f monitor.Filter, follow bool, send func(monitor.Event) error) error
}

var errNoMonitor = errors.New("this agent serves no events")

// MonitorQuery is a PathMonitor request.
type MonitorQuery struct {
	Filter monitor.Filter
	Follow bool
}

// Values encodes q as the query string.
func (q MonitorQuery) Values() url.Values {
	v := url.Values{}
	f := q.Filter
	if len(f.Types) > 0 {
		v.Set("type", strings.Join(f.Types, ","))
	}
	if len(f.Reasons) > 0 {
		v.Set("reason", strings.Join(f.Reasons, ","))
	}
	for k, s := range map[string]string{"service": f.Service, "frontend": f.Frontend, "backend": f.Backend, "node": f.Node} {
		if s != "" {
			v.Set(k, s)
		}
	}
	if !f.Since.IsZero() {
		v.Set("since", f.Since.UTC().Format(time.RFC3339Nano))
	}
	v.Set("follow", strconv.FormatBool(q.Follow))
	return v
}

// ParseMonitorQuery decodes a PathMonitor query, naming what is wrong.
func ParseMonitorQuery(v url.Values) (MonitorQuery, error) {
	q := MonitorQuery{Follow: true}
	split := func(s string) []string {
		if s == "" {
			return nil
		}
		return strings.Split(s, ",")
	}
	q.Filter = monitor.Filter{
		Types: split(v.Get("type")), Reasons: split(v.Get("reason")),
		Service: v.Get("service"), Frontend: v.Get("frontend"), Backend: v.Get("backend"), Node: v.Get("node"),
	}
	if s := v.Get("since"); s != "" {
		t, err := time.Parse(time.RFC3339Nano, s)
		if err != nil {
			return q, fmt.Errorf("%w: since=%q: want an RFC 3339 time", monitor.ErrBadFilter, s)
		}
		q.Filter.Since = t
	}
	if s := v.Get("follow"); s != "" {
		b, err := strconv.ParseBool(s)
		if err != nil {
			return q, fmt.Errorf("%w: follow=%q: want true or false", monitor.ErrBadFilter, s)
		}
		q.Follow = b
	}
	return q, q.Filter.Check()
}

func serveMonitor(p Provider) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		mp, ok := p.(MonitorProvider)
		if !ok {
			reply(w, nil, errNoMonitor)
			return
		}
		q, err := ParseMonitorQuery(r.URL.Query())
		if err != nil {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusBadRequest)
			_ = json.NewEncoder(w).Encode(errorBody{Error: err.Error()})
			return
		}
		w.Header().Set("Content-Type", "application/x-ndjson")
		flusher, _ := w.(http.Flusher)
		enc := json.NewEncoder(w)
		started := false
		err = mp.Monitor(r.Context(), q.Filter, q.Follow, func(e monitor.Event) error {
			started = true
			if err := enc.Encode(e); err != nil {
				return err
			}
			if flusher != nil {
				flusher.Flush()
			}
			return nil
		})
		if err != nil && !started {
			reply(w, nil, err)
		}
	}
}

// Monitor streams the events q selects to fn until ctx is done, the agent
// goes away or (without Follow) the recorded ones are all sent.
func (c *Client) Monitor(ctx context.Context, q MonitorQuery, fn func(monitor.Event) error) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://sluice-agent"+PathMonitor+"?"+q.Values().Encode(), nil)
	if err != nil {
		return err
	}
	hc := *c.http
	hc.Timeout = 0 // a stream
	resp, err := hc.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("cannot reach sluice-agent at %s: %w", c.socket, unwrapURLError(err))
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		var e errorBody
		if json.Unmarshal(body, &e) == nil && e.Error != "" {
			return fmt.Errorf("sluice-agent %s: %s", PathMonitor, e.Error)
		}
		return fmt.Errorf("sluice-agent %s: HTTP %s", PathMonitor, resp.Status)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		var e monitor.Event
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			return fmt.Errorf("decode event from sluice-agent: %w", err)
		}
		if err := fn(e); err != nil {
			return err
		}
	}
	if err := sc.Err(); err != nil && ctx.Err() == nil {
		return fmt.Errorf("read events from sluice-agent at %s: %w", c.socket, err)
	}
	return nil
}

// PathMetrics serves the agent's Prometheus metrics on the API socket too,
// for tools on the node (sluice-lab metrics) whatever --metrics-addr is.
const PathMetrics = "/metrics"

// MetricsProvider is the part of the agent that serves PathMetrics.
type MetricsProvider interface {
	MetricsHandler() http.Handler
}

// Metrics scrapes the agent's metrics over the socket.
func (c *Client) Metrics(ctx context.Context) (map[string]*dto.MetricFamily, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://sluice-agent"+PathMetrics, nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("cannot reach sluice-agent at %s: %w", c.socket, unwrapURLError(err))
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("sluice-agent %s: HTTP %s", PathMetrics, resp.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return nil, fmt.Errorf("parse metrics of sluice-agent at %s: %w", c.socket, err)
	}
	return mfs, nil
}
