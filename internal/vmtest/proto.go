package vmtest

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
	"time"
)

// The control channel is one virtio-serial port. The guest sends frames
// (kind byte, big-endian uint32 length, payload): the command's stdout and
// stderr, and events. One port keeps them in order, so every byte of output
// arrives before the exit event; the host answers the exit event with an
// ack, after which the guest powers off.
const (
	frameStdout byte = 'o'
	frameStderr byte = 'e'
	frameEvent  byte = 'v'
	ackByte     byte = 'a'

	maxFrame = 1 << 20
)

// frameWriter writes frames from several goroutines.
type frameWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (f *frameWriter) frame(kind byte, p []byte) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	for len(p) > 0 || kind == frameEvent {
		n := min(len(p), maxFrame)
		hdr := [5]byte{kind}
		binary.BigEndian.PutUint32(hdr[1:], uint32(n))
		if _, err := f.w.Write(append(hdr[:], p[:n]...)); err != nil {
			return err
		}
		p = p[n:]
		if kind == frameEvent {
			break
		}
	}
	return nil
}

// stream is an io.Writer that sends what it is given as frames of one kind.
type stream struct {
	f    *frameWriter
	kind byte
}

func (s stream) Write(p []byte) (int, error) {
	if err := s.f.frame(s.kind, p); err != nil {
		return 0, err
	}
	return len(p), nil
}

// readFrame reads one frame.
func readFrame(r io.Reader) (byte, []byte, error) {
	var hdr [5]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return 0, nil, err
	}
	n := binary.BigEndian.Uint32(hdr[1:])
	if n > maxFrame {
		return 0, nil, fmt.Errorf("control frame of %d bytes (limit %d): the stream is out of step", n, maxFrame)
	}
	switch hdr[0] {
	case frameStdout, frameStderr, frameEvent:
	default:
		return 0, nil, fmt.Errorf("control frame of unknown kind %q", hdr[0])
	}
	p := make([]byte, n)
	if _, err := io.ReadFull(r, p); err != nil {
		return 0, nil, fmt.Errorf("control frame cut short: %w", err)
	}
	return hdr[0], p, nil
}

// Event is one step the guest reports, with the guest's uptime then.
type Event struct {
	Kind   string        // "stage", "start", "exit" or "error"
	Stage  string        // for "stage": what is done (modules, root)
	Code   int           // for "exit": the command's exit status
	Msg    string        // for "error"
	Uptime time.Duration // guest's /proc/uptime
}

func (e Event) String() string {
	up := strconv.FormatFloat(e.Uptime.Seconds(), 'f', 2, 64)
	switch e.Kind {
	case "stage":
		return "stage " + up + " " + e.Stage
	case "exit":
		return "exit " + up + " " + strconv.Itoa(e.Code)
	case "error":
		return "error " + up + " " + e.Msg
	}
	return e.Kind + " " + up
}

// ParseEvent reads an event as Event.String writes it.
func ParseEvent(s string) (Event, error) {
	f := strings.SplitN(s, " ", 3)
	if len(f) < 2 {
		return Event{}, fmt.Errorf("event %q: want KIND UPTIME [ARG]", s)
	}
	secs, err := strconv.ParseFloat(f[1], 64)
	if err != nil || secs < 0 {
		return Event{}, fmt.Errorf("event %q: uptime %q is not seconds", s, f[1])
	}
	e := Event{Kind: f[0], Uptime: time.Duration(secs * float64(time.Second))}
	arg := ""
	if len(f) == 3 {
		arg = f[2]
	}
	switch e.Kind {
	case "start":
	case "stage":
		if arg == "" {
			return Event{}, fmt.Errorf("event %q: stage without a name", s)
		}
		e.Stage = arg
	case "exit":
		if e.Code, err = strconv.Atoi(arg); err != nil {
			return Event{}, fmt.Errorf("event %q: exit status %q: %w", s, arg, err)
		}
	case "error":
		e.Msg = arg
	default:
		return Event{}, fmt.Errorf("event %q: unknown kind %q", s, e.Kind)
	}
	return e, nil
}

// errNoExit is returned when the control channel ends without an exit event.
var errNoExit = errors.New("the guest's control channel closed before the command's exit status arrived")
