package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"path/filepath"
	"time"
)

// Provider answers the API's queries; the agent implements it.
type Provider interface {
	Status(ctx context.Context) (*Status, error)
	Services(ctx context.Context) ([]Service, error)
	BPFLB(ctx context.Context) (*BPFLB, error)
	BPFCT(ctx context.Context) (*BPFCT, error)
	BPFNAT(ctx context.Context) (*BPFNAT, error)
}

// Handler returns the API's HTTP handler.
func Handler(p Provider) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+PathHealthz, func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET "+PathStatus, func(w http.ResponseWriter, r *http.Request) {
		v, err := p.Status(r.Context())
		reply(w, v, err)
	})
	mux.HandleFunc("GET "+PathServices, func(w http.ResponseWriter, r *http.Request) {
		v, err := p.Services(r.Context())
		reply(w, v, err)
	})
	mux.HandleFunc("GET "+PathBPFLB, func(w http.ResponseWriter, r *http.Request) {
		v, err := p.BPFLB(r.Context())
		reply(w, v, err)
	})
	mux.HandleFunc("GET "+PathBPFCT, func(w http.ResponseWriter, r *http.Request) {
		v, err := p.BPFCT(r.Context())
		reply(w, v, err)
	})
	mux.HandleFunc("GET "+PathBPFNAT, func(w http.ResponseWriter, r *http.Request) {
		v, err := p.BPFNAT(r.Context())
		reply(w, v, err)
	})
	mux.HandleFunc("GET "+PathMonitor, serveMonitor(p))
	if mp, ok := p.(MetricsProvider); ok {
		mux.Handle("GET "+PathMetrics, mp.MetricsHandler())
	}
	mux.HandleFunc("GET "+PathBPFBandwidth, func(w http.ResponseWriter, r *http.Request) {
		bp, ok := p.(BandwidthProvider)
		if !ok {
			reply(w, nil, errNoBandwidth)
			return
		}
		v, err := bp.BPFBandwidth(r.Context())
		reply(w, v, err)
	})
	// Go's profiles (heap, goroutines, CPU) for an agent that uses more
	// than it should: the socket is root's alone, and a profile costs
	// nothing until it is asked for.
	mux.HandleFunc("GET /debug/pprof/", pprof.Index)
	mux.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
	return mux
}

// errorBody is what a failed request returns.
type errorBody struct {
	Error string `json:"error"`
}

func reply(w http.ResponseWriter, v any, err error) {
	w.Header().Set("Content-Type", "application/json")
	if err != nil {
		w.WriteHeader(http.StatusInternalServerError)
		v = errorBody{Error: err.Error()}
	}
	if err := json.NewEncoder(w).Encode(v); err != nil {
		slog.Debug("api: write reply", "err", err)
	}
}

// Serve serves p on ln until ctx is done. Closing a unix listener removes
// its socket file.
func Serve(ctx context.Context, ln net.Listener, p Provider) error {
	srv := &http.Server{Handler: Handler(p), ReadHeaderTimeout: 5 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		<-ctx.Done()
		shutCtx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(shutCtx)
	}()
	err := srv.Serve(ln)
	<-done
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return fmt.Errorf("serve api on %s: %w", ln.Addr(), err)
}

// Listen creates the unix socket at path, with its directory. A stale socket
// left by a crashed agent is replaced; a live one (another agent answering)
// is an error.
func Listen(path string) (net.Listener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		return nil, fmt.Errorf("create api socket directory: %w", err)
	}
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode()&os.ModeSocket == 0 {
			return nil, fmt.Errorf("api socket %s exists and is not a socket", path)
		}
		if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
			c.Close()
			return nil, fmt.Errorf("api socket %s is in use by another process", path)
		}
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("remove stale api socket: %w", err)
		}
	}
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("listen on api socket: %w", err)
	}
	// Root's tools only: the API shows cluster topology.
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		return nil, fmt.Errorf("chmod api socket: %w", err)
	}
	return ln, nil
}
