package lab

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"sync"
	"time"
)

// ProbeDNS makes Count lookups of Name as glibc's resolver makes them: a
// new UDP socket, connected to the server, the A and the AAAA query sent
// back to back from it without waiting (glibc's default, which races on
// conntrack insertion behind kube-proxy: Kubernetes' 5-second DNS
// timeouts), then both answers awaited within Timeout. Connections
// clients look up at once. Count and OK count queries (two per lookup);
// an answer that never comes is an ETIMEDOUT, which a real resolver waits
// 5 s for. Backends counts lookups by the first address of their A
// answer (for ReplicaName: the replica that answered), else the server's.
func ProbeDNS(ctx context.Context, cfg ProbeConfig) (*ProbeReport, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if cfg.Name == "" {
		return nil, errors.New("probe dns: no --name to look up")
	}
	targets, err := parseTargets(cfg.Targets)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.Budget)
	defer cancel()
	rec := newRecorder("dns", cfg)
	var mu sync.Mutex
	var wg sync.WaitGroup
	clients := max(cfg.Connections, 1)
	next := 0
	for range clients {
		wg.Go(func() {
			for {
				mu.Lock()
				i := next
				next++
				mu.Unlock()
				if i >= cfg.Count || ctx.Err() != nil {
					return
				}
				res := lookup(targets[i%len(targets)], cfg.Name, cfg.Timeout)
				mu.Lock()
				rec.r.Count += 2
				for _, a := range res.answers {
					if a.err != nil {
						rec.fail(a.err)
						continue
					}
					rec.ok(a.rtt)
				}
				if res.answered != "" {
					rec.r.Backends[res.answered]++
				}
				mu.Unlock()
				if !cfg.pace(ctx, i) {
					return
				}
			}
		})
	}
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	rec.r.Truncated = next < cfg.Count
	return rec.done(), nil
}

type dnsAnswer struct {
	rtt time.Duration
	err error
}

type lookupResult struct {
	// answered is the first address of the A answer (which replica
	// answered, for ReplicaName), else the server's address.
	answered string
	answers  [2]dnsAnswer // A, AAAA
}

// lookup is one resolver lookup: A and AAAA from one socket.
func lookup(server netip.AddrPort, name string, timeout time.Duration) lookupResult {
	var res lookupResult
	conn, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(server))
	if err != nil {
		res.answers[0].err, res.answers[1].err = err, err
		return res
	}
	defer conn.Close()

	base := uint16(rand.Uint32())
	ids := [2]uint16{base, base + 1}
	start := time.Now()
	for i, qtype := range []uint16{1, 28} {
		if _, err := conn.Write(dnsQuery(ids[i], name, qtype)); err != nil {
			res.answers[i].err = fmt.Errorf("send the %s query: %w", qtypeName(qtype), err)
		}
	}
	_ = conn.SetReadDeadline(start.Add(timeout))
	got := [2]bool{res.answers[0].err != nil, res.answers[1].err != nil}
	buf := make([]byte, 1500)
	for !got[0] || !got[1] {
		n, err := conn.Read(buf)
		if err != nil {
			for i := range got {
				if !got[i] {
					res.answers[i].err = fmt.Errorf("no answer to the %s query of %s from %s in %v: %w",
						qtypeName([]uint16{1, 28}[i]), name, server, timeout, err)
				}
			}
			break
		}
		if n < 12 || buf[2]&0x80 == 0 {
			continue
		}
		id := binary.BigEndian.Uint16(buf)
		for i := range ids {
			if id == ids[i] && !got[i] {
				got[i] = true
				res.answers[i].rtt = time.Since(start)
				if i == 0 {
					res.answered = server.Addr().String()
					if addrs, err := parseAnswerA(buf[:n], id); err == nil {
						res.answered = addrs[0].String()
					}
				}
			}
		}
	}
	return res
}

func qtypeName(t uint16) string {
	if t == 28 {
		return "AAAA"
	}
	return "A"
}
