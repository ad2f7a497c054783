package image

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// TestArchiveCached: the same inputs give the archive built the first
// time; a changed file's content, or another ref, gives a new one; each is
// an archive of its inputs.
func TestArchiveCached(t *testing.T) {
	dir, cache := t.TempDir(), t.TempDir()
	src := filepath.Join(dir, "tool")
	if err := os.WriteFile(src, []byte("one"), 0o755); err != nil {
		t.Fatal(err)
	}
	spec := Spec{Files: []File{{Path: "/tool", Src: src}}, Entrypoint: []string{"/tool"}, Created: time.Unix(0, 0).UTC()}
	first, built, err := Archive(cache, "example.org/tool:1", spec)
	if err != nil || !built {
		t.Fatalf("first: %s built %v, %v; want built", first, built, err)
	}
	again, built, err := Archive(cache, "example.org/tool:1", spec)
	if err != nil || built || again != first {
		t.Fatalf("same inputs: %s built %v, %v; want %s from the cache", again, built, err, first)
	}
	otherRef, built, err := Archive(cache, "example.org/tool:2", spec)
	if err != nil || !built || otherRef == first {
		t.Fatalf("another ref: %s built %v, %v; want a new archive", otherRef, built, err)
	}
	if err := os.WriteFile(src, []byte("two"), 0o755); err != nil {
		t.Fatal(err)
	}
	changed, built, err := Archive(cache, "example.org/tool:1", spec)
	if err != nil || !built || changed == first {
		t.Fatalf("changed content: %s built %v, %v; want a new archive", changed, built, err)
	}
	tag, _ := name.NewTag("example.org/tool:1")
	for _, file := range []string{first, changed} {
		img, err := tarball.ImageFromPath(file, &tag)
		if err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		if _, err := img.Digest(); err != nil {
			t.Fatalf("%s: %v", file, err)
		}
	}
	left, _ := filepath.Glob(filepath.Join(cache, ".*-*"))
	if len(left) != 0 {
		t.Errorf("temporary files left in the cache: %v", left)
	}
}

// TestPruneKeepsNewestAndRecent: beyond keep, the oldest archives go, but
// never one used within the spare time.
func TestPruneKeepsNewestAndRecent(t *testing.T) {
	dir := t.TempDir()
	now := time.Now()
	ages := map[string]time.Duration{"a": 5 * time.Hour, "b": 4 * time.Hour, "c": 3 * time.Hour, "d": 30 * time.Minute, "e": time.Minute}
	for n, age := range ages {
		p := filepath.Join(dir, n+".tar")
		if err := os.WriteFile(p, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(p, now.Add(-age), now.Add(-age)); err != nil {
			t.Fatal(err)
		}
	}
	prune(dir, 1, time.Hour)
	for n := range ages {
		_, err := os.Stat(filepath.Join(dir, n+".tar"))
		if kept, want := err == nil, ages[n] < time.Hour; kept != want {
			t.Errorf("%s (used %v ago): kept %v, want %v", n, ages[n], kept, want)
		}
	}
}
