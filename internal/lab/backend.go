package lab

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"strconv"
	"time"
)

// EchoReply is the echo backend's HTTP answer: who answered and the client
// address it saw (the source address after any NAT on the way).
type EchoReply struct {
	Pod    string `json:"pod"`
	Client string `json:"client"`
}

// BackendConfig configures the echo backend a pod runs.
type BackendConfig struct {
	Name      string // pod name to answer with
	HTTPAddr  string // ":8080"; dual-stack
	UDPAddr   string // ":9000"; dual-stack
	ReadyFile string // created once both sockets listen; optional
}

// RunBackend serves HTTP and UDP echo until ctx ends. HTTP answers an
// EchoReply as JSON; UDP answers every datagram with the pod name.
func RunBackend(ctx context.Context, cfg BackendConfig) error {
	if cfg.Name == "" {
		return errors.New("backend: --name is required")
	}
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", cfg.HTTPAddr)
	if err != nil {
		return fmt.Errorf("backend: listen http %s: %w", cfg.HTTPAddr, err)
	}
	pc, err := lc.ListenPacket(ctx, "udp", cfg.UDPAddr)
	if err != nil {
		ln.Close()
		return fmt.Errorf("backend: listen udp %s: %w", cfg.UDPAddr, err)
	}
	srv := &http.Server{
		Handler:           echoHandler(cfg.Name),
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       echoIdleTimeout,
	}
	errc := make(chan error, 2)
	go func() { errc <- srv.Serve(ln) }()
	go func() { errc <- serveUDPEcho(pc, []byte(cfg.Name)) }()
	if cfg.ReadyFile != "" {
		if err := os.WriteFile(cfg.ReadyFile, nil, 0o644); err != nil {
			return fmt.Errorf("backend: ready file: %w", err)
		}
	}
	select {
	case <-ctx.Done():
	case err = <-errc:
	}
	pc.Close()
	sctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = srv.Shutdown(sctx)
	if err != nil && !errors.Is(err, http.ErrServerClosed) && !errors.Is(err, net.ErrClosed) {
		return fmt.Errorf("backend %s: %w", cfg.Name, err)
	}
	return nil
}

// echoIdleTimeout is how long the echo backend keeps an idle keep-alive
// connection: a hold probe that holds longer sees every connection closed
// by the backend, not by the path.
const echoIdleTimeout = 2 * time.Minute

// echoHandler answers every request with an EchoReply as JSON.
func echoHandler(name string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(EchoReply{Pod: name, Client: r.RemoteAddr})
	})
}

func serveUDPEcho(pc net.PacketConn, reply []byte) error {
	buf := make([]byte, 64<<10)
	for {
		n, addr, err := pc.ReadFrom(buf)
		if err != nil {
			return err
		}
		// A lost reply is the client's timeout to report, not ours.
		_, _ = pc.WriteTo(udpEchoReply(reply, buf[:n]), addr)
	}
}

// udpSizePrefix starts a datagram that asks for a reply of a given size:
// "sluice-size=N;" (the probe's --reply-size). The reply is then the pod's
// name, a newline and padding to N bytes: a datagram larger than the MTU
// comes back in fragments.
const udpSizePrefix = "sluice-size="

// maxUDPReply bounds a requested reply (an IPv6 UDP datagram's payload).
const maxUDPReply = 65000

// udpEchoReply is the reply to req: name, or name padded to the size req
// asks for.
func udpEchoReply(name, req []byte) []byte {
	rest, ok := bytes.CutPrefix(req, []byte(udpSizePrefix))
	if !ok {
		return name
	}
	num, _, ok := bytes.Cut(rest, []byte(";"))
	size, err := strconv.Atoi(string(num))
	if !ok || err != nil || size <= len(name)+1 || size > maxUDPReply {
		return name
	}
	out := make([]byte, size)
	copy(out, name)
	out[len(name)] = '\n'
	for i := len(name) + 1; i < size; i++ {
		out[i] = 'x'
	}
	return out
}
