package agent

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/cilium/ebpf"

	"github.com/sluice-dataplane/sluice/internal/lbmap"
)

// The datapath's flow hash (a new flow's backend slot and first nat port)
// is keyed with ns_config's HashKey, so that a client cannot pick source
// ports that all land on one backend or one nat port. The key is drawn
// once per boot: ns_config is pinned under --bpf-root (bpffs starts empty
// at boot), and a restarted agent keeps the key it finds there, so the
// flows of a connection that spans the restart hash as before.

// hashKeyDraws bounds the draws of a nonzero key: crypto/rand gives 0
// once in 2^32 draws.
const hashKeyDraws = 8

// chooseHashKey keeps pinned, the key of the pinned ns_config, when it
// has one (nonzero); else it draws a nonzero key.
func chooseHashKey(pinned uint32, draw func() (uint32, error)) (uint32, error) {
	if pinned != 0 {
		return pinned, nil
	}
	for range hashKeyDraws {
		k, err := draw()
		if err != nil {
			return 0, fmt.Errorf("draw the flow hash key: %w", err)
		}
		if k != 0 {
			return k, nil
		}
	}
	return 0, fmt.Errorf("draw the flow hash key: %d draws gave 0", hashKeyDraws)
}

// randomHashKey draws a key from crypto/rand.
func randomHashKey() (uint32, error) {
	var b [4]byte
	if _, err := rand.Read(b[:]); err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint32(b[:]), nil
}

// pinnedHashKey reads the key of the ns_config pinned under bpfRoot; 0
// with no error when nothing is pinned there.
func pinnedHashKey(bpfRoot string) (uint32, error) {
	path := filepath.Join(bpfRoot, lbmap.NSConfigMapName)
	m, err := ebpf.LoadPinnedMap(path, nil)
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("open pinned %s: %w", path, err)
	}
	defer m.Close()
	var c lbmap.NSConfig
	if err := m.Lookup(uint32(0), &c); err != nil {
		return 0, fmt.Errorf("read pinned %s: %w", path, err)
	}
	return c.HashKey, nil
}
