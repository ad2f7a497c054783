package api

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// FuzzAPIRequest writes arbitrary bytes to the local API's socket, as any
// root process could, and reads what the server (Serve, the agent's own
// http.Server settings) answers. Seeds: every request the CLI sends, and
// malformed ones. Invariants: the answer comes within a bound and is HTTP
// (every response parses); no handler panics (net/http would log it and
// drop the connection) and nothing answers 500; a 200 is only for a GET or
// HEAD of one of the API's paths and carries that path's JSON; any other
// request gets a redirect to the clean path, or a 4xx (or 501/505 from
// net/http for what it does not speak) with a body saying why.
func FuzzAPIRequest(f *testing.F) {
	for _, path := range []string{PathHealthz, PathStatus, PathServices, PathBPFLB, PathBPFCT, PathBPFNAT} {
		f.Add([]byte("GET " + path + " HTTP/1.1\r\nHost: sluice-agent\r\nUser-Agent: Go-http-client/1.1\r\nAccept-Encoding: gzip\r\n\r\n"))
	}
	for _, raw := range []string{
		"POST /v1/status HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello",
		"GET /v1/../v1/status?x=%zz HTTP/1.1\r\nHost: x\r\n\r\n",
		"GET //v1/bpf/ct HTTP/1.0\r\n\r\n",
		"HEAD /v1/services HTTP/1.1\r\nHost: x\r\nConnection: keep-alive\r\n\r\nGET /healthz HTTP/1.1\r\nHost: x\r\n\r\n",
		"GET /v1/status HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
		"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03",
		"GET /\x00 HTTP/1.1\r\n\r\n",
	} {
		f.Add([]byte(raw))
	}
	sock := serveFuzz(f)
	panics := watchServerLog(f)
	f.Fuzz(func(t *testing.T, raw []byte) {
		c, err := net.Dial("unix", sock)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		// The bound: the server must answer and close once the request
		// is complete or the client is done writing.
		if err := c.SetDeadline(time.Now().Add(5 * time.Second)); err != nil {
			t.Fatal(err)
		}
		go func() {
			_, _ = c.Write(raw)
			_ = c.(*net.UnixConn).CloseWrite()
		}()
		answer, err := io.ReadAll(c)
		// A server that refuses a request and hangs up before reading
		// the rest of it leaves unread bytes in its socket: the kernel
		// reports that to the reader as a reset, after the answer. A
		// reset with an answer in hand is the end of that answer.
		if errors.Is(err, syscall.ECONNRESET) && len(answer) > 0 {
			err = nil
		}
		if err != nil {
			t.Fatalf("no complete answer within 5s to %q: %v (read %q)", raw, err, answer)
		}
		if p := panics(); p != "" {
			t.Fatalf("request %q: the server logged %s", raw, p)
		}
		reqs := parseRequests(raw)
		br := bufio.NewReader(bytes.NewReader(answer))
		for i := 0; ; i++ {
			if _, err := br.Peek(1); err == io.EOF {
				break
			}
			var req *http.Request
			if i < len(reqs) {
				req = reqs[i]
			}
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatalf("request %q: answer %d does not parse: %v\nanswer %q", raw, i, err, answer)
			}
			body, err := io.ReadAll(resp.Body)
			// An answer to HEAD has no body whatever its Content-Length;
			// net/http's own refusals (before a handler) do. Without
			// the request in hand here, a short body ends the reading.
			head := req != nil && req.Method == http.MethodHead
			if err != nil && !head {
				t.Fatalf("request %q: answer %d body: %v", raw, i, err)
			}
			if req != nil {
				checkAnswer(t, req, resp, body)
			} else if resp.StatusCode >= 500 && resp.StatusCode != http.StatusNotImplemented &&
				resp.StatusCode != http.StatusHTTPVersionNotSupported {
				t.Fatalf("request %q: answer %d is %s", raw, i, resp.Status)
			}
			if head {
				break // the next answer's bytes may be in body
			}
		}
	})
}

// parseRequests reads the requests of raw as net/http does, up to the
// first that does not parse.
func parseRequests(raw []byte) []*http.Request {
	var out []*http.Request
	br := bufio.NewReader(bytes.NewReader(raw))
	for {
		req, err := http.ReadRequest(br)
		if err != nil {
			return out
		}
		if _, err := io.Copy(io.Discard, req.Body); err != nil {
			return append(out, req)
		}
		out = append(out, req)
	}
}

// apiReplies are the types each path's JSON decodes into.
var apiReplies = map[string]func() any{
	PathStatus: func() any { return new(Status) }, PathServices: func() any { return new([]Service) },
	PathBPFLB: func() any { return new(BPFLB) }, PathBPFCT: func() any { return new(BPFCT) },
	PathBPFNAT: func() any { return new(BPFNAT) },
}

// checkAnswer checks the response to a request that parses.
func checkAnswer(t *testing.T, req *http.Request, resp *http.Response, body []byte) {
	t.Helper()
	getOrHead := req.Method == http.MethodGet || req.Method == http.MethodHead
	path := req.URL.Path
	_, isAPI := apiReplies[path]
	known := isAPI || path == PathHealthz
	switch {
	case resp.StatusCode == http.StatusOK:
		if !getOrHead || !known {
			t.Fatalf("%s %s: 200 for something the API does not serve", req.Method, req.URL)
		}
		if isAPI && req.Method == http.MethodGet {
			dec := json.NewDecoder(bytes.NewReader(body))
			dec.DisallowUnknownFields()
			if err := dec.Decode(apiReplies[path]()); err != nil {
				t.Fatalf("%s %s: the JSON does not decode: %v\n%s", req.Method, req.URL, err, body)
			}
		}
	case resp.StatusCode >= 300 && resp.StatusCode < 400:
		if resp.Header.Get("Location") == "" {
			t.Fatalf("%s %s: %s without a Location", req.Method, req.URL, resp.Status)
		}
	case resp.StatusCode >= 400 && resp.StatusCode < 500:
		// ServeMux answers the asterisk form ("OPTIONS * HTTP/1.1") with
		// a bare 400.
		if len(body) == 0 && req.Method != http.MethodHead && req.RequestURI != "*" {
			t.Fatalf("%s %s: %s without a body saying why", req.Method, req.URL, resp.Status)
		}
	case resp.StatusCode == http.StatusNotImplemented, resp.StatusCode == http.StatusHTTPVersionNotSupported:
	default:
		t.Fatalf("%s %s: %s", req.Method, req.URL, resp.Status)
	}
}

// serveFuzz serves a fakeProvider on a socket until the fuzz target ends.
func serveFuzz(f *testing.F) string {
	f.Helper()
	p := &fakeProvider{
		status:   &Status{NodeName: "node1", Version: "v1"},
		services: []Service{{ID: 1, Name: "default/web", Type: "ClusterIP", Frontend: "198.19.0.10:80/TCP"}},
		lb:       &BPFLB{NodeIPs: []string{"198.18.0.11"}},
		ct:       &BPFCT{Now: 100},
		nat:      &BPFNAT{Now: 100},
	}
	sock := filepath.Join(f.TempDir(), "sluice.sock")
	ln, err := Listen(sock)
	if err != nil {
		f.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Serve(ctx, ln, p) }()
	f.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			f.Errorf("Serve: %v", err)
		}
	})
	return sock
}

// watchServerLog catches what net/http logs (Serve's server has no logger
// of its own): a recovered handler panic. It returns a function that gives
// and clears the first such line.
func watchServerLog(f *testing.F) func() string {
	var mu sync.Mutex
	var first string
	old := log.Writer()
	log.SetOutput(writerFunc(func(p []byte) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		if s := string(p); first == "" && strings.Contains(s, "panic") {
			first = s
		}
		return len(p), nil
	}))
	f.Cleanup(func() { log.SetOutput(old) })
	return func() string {
		mu.Lock()
		defer mu.Unlock()
		s := first
		first = ""
		return s
	}
}

type writerFunc func([]byte) (int, error)

func (w writerFunc) Write(p []byte) (int, error) { return w(p) }
