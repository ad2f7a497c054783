package image

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"
)

// Archive returns the path of an archive of spec's image, tagged ref, in
// dir: one an earlier call made from the same inputs (every file's content,
// the spec, ref), or one built now (built true). Archives are named by a
// digest of their inputs, written under a temporary name and renamed, so
// labs building at once never read a partial one. dir keeps the newest
// keep archives (an archive is new when made or used); older ones are
// removed, never one used in the last hour. One process builds a given
// archive at a time; the others wait for it.
func Archive(dir, ref string, spec Spec) (file string, built bool, err error) {
	key, err := inputsDigest(ref, spec)
	if err != nil {
		return "", false, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", false, fmt.Errorf("image cache: %w", err)
	}
	file = filepath.Join(dir, key+".tar")
	// One build of an archive at a time: labs coming up together wait for
	// the first one's instead of each compressing the same binaries.
	lock, err := os.OpenFile(filepath.Join(dir, "."+key+".lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return "", false, fmt.Errorf("image cache: %w", err)
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return "", false, fmt.Errorf("image cache: lock %s: %w", lock.Name(), err)
	}
	if _, err := os.Stat(file); err == nil {
		now := time.Now()
		_ = os.Chtimes(file, now, now) // in use: the pruning spares it
		return file, false, nil
	}
	img, err := Build(spec)
	if err != nil {
		return "", false, err
	}
	tmp, err := os.CreateTemp(dir, "."+key+"-*")
	if err != nil {
		return "", false, fmt.Errorf("image cache: %w", err)
	}
	tmp.Close()
	defer os.Remove(tmp.Name()) // after a rename: nothing
	if err := Write(tmp.Name(), ref, img); err != nil {
		return "", false, err
	}
	if err := os.Rename(tmp.Name(), file); err != nil {
		return "", false, fmt.Errorf("image cache: %w", err)
	}
	prune(dir, cacheKeep, time.Hour)
	return file, true, nil
}

// cacheKeep is how many archives an image cache keeps: a lab's three
// images for a few builds of sluice.
const cacheKeep = 12

// prune removes the oldest archives of dir beyond keep, sparing those used
// within spare (another lab may be importing them).
func prune(dir string, keep int, spare time.Duration) {
	paths, _ := filepath.Glob(filepath.Join(dir, "*.tar"))
	type entry struct {
		path string
		used time.Time
	}
	var es []entry
	for _, p := range paths {
		if st, err := os.Stat(p); err == nil {
			es = append(es, entry{p, st.ModTime()})
		}
	}
	slices.SortFunc(es, func(a, b entry) int { return b.used.Compare(a.used) })
	for _, e := range es[min(keep, len(es)):] {
		if time.Since(e.used) > spare {
			os.Remove(e.path)
			os.Remove(filepath.Join(dir, "."+strings.TrimSuffix(filepath.Base(e.path), ".tar")+".lock"))
		}
	}
}

// inputsDigest is the hex SHA-256 of what an archive is made of: ref, the
// spec's configuration, and of each file its path, mode, link and the
// content of its source.
func inputsDigest(ref string, spec Spec) (string, error) {
	h := sha256.New()
	cfg, err := json.Marshal(struct {
		Format               int
		Ref                  string
		Entrypoint, Cmd, Env []string
		Created              time.Time
	}{archiveFormat, ref, spec.Entrypoint, spec.Cmd, spec.Env, spec.Created})
	if err != nil {
		return "", err
	}
	h.Write(cfg)
	for _, f := range spec.Files {
		fmt.Fprintf(h, "\n%q %o %q ", f.Path, f.Mode, f.Link)
		if f.Src == "" {
			continue
		}
		src, err := os.Open(f.Src)
		if err != nil {
			return "", fmt.Errorf("image file %s: %w", f.Path, err)
		}
		_, err = io.Copy(h, src)
		src.Close()
		if err != nil {
			return "", fmt.Errorf("image file %s: %w", f.Path, err)
		}
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// archiveFormat changes when Build or Write would make a different archive
// of the same inputs, so that no cache serves an archive of the old kind.
const archiveFormat = 1
