package image

import (
	"archive/tar"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// TestBuildAndWrite builds an image of a file, a symlink and a directory,
// writes it as an archive and reads it back: same digest, the files with
// their modes and content, the parents created, the entrypoint kept.
func TestBuildAndWrite(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "tool")
	if err := os.WriteFile(src, []byte("#!/bin/sh\necho hi\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	img, err := Build(Spec{Files: []File{
		{Path: "/usr/local/bin/tool", Src: src},
		{Path: "/bin/sh", Link: "busybox"},
		{Path: "/tmp", Mode: 0o1777},
	}, Entrypoint: []string{"/usr/local/bin/tool"}, Env: []string{"PATH=/bin"}, Created: time.Unix(0, 0).UTC()})
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, "image.tar")
	if err := Write(file, "example.org/tool:1", img); err != nil {
		t.Fatal(err)
	}
	tag, _ := name.NewTag("example.org/tool:1")
	back, err := tarball.ImageFromPath(file, &tag)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := img.Digest()
	got, err := back.Digest()
	if err != nil || got != want {
		t.Fatalf("digest read back %v (%v), want %v", got, err, want)
	}
	cfg, err := back.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.Config.Entrypoint) != 1 || cfg.Config.Entrypoint[0] != "/usr/local/bin/tool" || cfg.OS != "linux" {
		t.Errorf("config: entrypoint %v, os %q", cfg.Config.Entrypoint, cfg.OS)
	}
	layers, err := back.Layers()
	if err != nil || len(layers) != 1 {
		t.Fatalf("layers: %d, %v", len(layers), err)
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	entries := map[string]*tar.Header{}
	content := map[string]string{}
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		entries[h.Name] = h
		data, _ := io.ReadAll(tr)
		content[h.Name] = string(data)
	}
	for _, d := range []string{"usr/", "usr/local/", "usr/local/bin/", "bin/", "tmp/"} {
		if h := entries[d]; h == nil || h.Typeflag != tar.TypeDir {
			t.Errorf("directory %s missing from the layer", d)
		}
	}
	if h := entries["usr/local/bin/tool"]; h == nil || h.Mode != 0o755 || content[h.Name] != "#!/bin/sh\necho hi\n" {
		t.Errorf("file usr/local/bin/tool: %+v %q", h, content["usr/local/bin/tool"])
	}
	if h := entries["bin/sh"]; h == nil || h.Typeflag != tar.TypeSymlink || h.Linkname != "busybox" {
		t.Errorf("symlink bin/sh: %+v", h)
	}
	if h := entries["tmp/"]; h == nil || h.Mode != 0o1777 {
		t.Errorf("tmp mode: %+v", h)
	}
}

func TestBuildRejectsRelativePaths(t *testing.T) {
	for _, p := range []string{"bin/sh", "/bin/../sh", ""} {
		if _, err := Build(Spec{Files: []File{{Path: p}}}); err == nil {
			t.Errorf("path %q accepted", p)
		}
	}
}

// TestCheckStatic: this test binary links statically only with cgo off;
// a dynamic ELF is told apart by its program interpreter.
func TestCheckStatic(t *testing.T) {
	for _, p := range []string{"/bin/ls", "/usr/bin/ls"} {
		if _, err := os.Stat(p); err != nil {
			continue
		}
		if err := CheckStatic(p); !errors.Is(err, ErrNotStatic) {
			t.Errorf("CheckStatic(%s) = %v, want ErrNotStatic (Debian's ls is dynamic)", p, err)
		}
		break
	}
	if _, err := os.Stat("/bin/busybox"); err == nil { // Debian's busybox-static
		if err := CheckStatic("/bin/busybox"); err != nil {
			t.Errorf("CheckStatic(/bin/busybox) = %v, want nil", err)
		}
	}
	if err := CheckStatic("/etc/hostname"); err == nil || errors.Is(err, ErrNotStatic) {
		t.Errorf("CheckStatic of a text file = %v, want an ELF error", err)
	}
}
