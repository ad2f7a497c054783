package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"time"
)

// Client talks to an agent's API socket.
type Client struct {
	socket string
	http   *http.Client
}

// NewClient returns a client for the agent listening at socket.
func NewClient(socket string) *Client {
	dialer := &net.Dialer{Timeout: 2 * time.Second}
	return &Client{
		socket: socket,
		http: &http.Client{
			Timeout: 30 * time.Second,
			Transport: &http.Transport{
				DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
					return dialer.DialContext(ctx, "unix", socket)
				},
			},
		},
	}
}

// Status returns the agent's status.
func (c *Client) Status(ctx context.Context) (*Status, error) {
	var s Status
	return &s, c.get(ctx, PathStatus, &s)
}

// Services returns the installed services.
func (c *Client) Services(ctx context.Context) ([]Service, error) {
	var s []Service
	return s, c.get(ctx, PathServices, &s)
}

// BPFLB returns a dump of the load balancer maps.
func (c *Client) BPFLB(ctx context.Context) (*BPFLB, error) {
	var d BPFLB
	return &d, c.get(ctx, PathBPFLB, &d)
}

// BPFCT returns a dump of the conntrack map.
func (c *Client) BPFCT(ctx context.Context) (*BPFCT, error) {
	var d BPFCT
	return &d, c.get(ctx, PathBPFCT, &d)
}

// BPFNAT returns a dump of the SNAT map.
func (c *Client) BPFNAT(ctx context.Context) (*BPFNAT, error) {
	var d BPFNAT
	return &d, c.get(ctx, PathBPFNAT, &d)
}

// Healthz returns nil when the agent answers its health check.
func (c *Client) Healthz(ctx context.Context) error {
	return c.get(ctx, PathHealthz, nil)
}

func (c *Client) get(ctx context.Context, path string, into any) error {
	// The host is ignored: the transport always dials the socket.
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://sluice-agent"+path, nil)
	if err != nil {
		return err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("cannot reach sluice-agent at %s: %w", c.socket, unwrapURLError(err))
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return fmt.Errorf("read %s from sluice-agent at %s: %w", path, c.socket, err)
	}
	if resp.StatusCode != http.StatusOK {
		var e errorBody
		if json.Unmarshal(body, &e) == nil && e.Error != "" {
			return fmt.Errorf("sluice-agent %s: %s", path, e.Error)
		}
		return fmt.Errorf("sluice-agent %s: HTTP %s", path, resp.Status)
	}
	if into == nil {
		return nil
	}
	if err := json.Unmarshal(body, into); err != nil {
		return fmt.Errorf("decode %s from sluice-agent: %w", path, err)
	}
	return nil
}

// unwrapURLError drops net/http's `Get "http://sluice-agent/...":` prefix,
// which names a host that does not exist.
func unwrapURLError(err error) error {
	if ue, ok := errors.AsType[*url.Error](err); ok {
		return ue.Err
	}
	return err
}
