// Package image builds the container images the kubelet lab runs, from
// binaries on this machine, with go-containerregistry: no registry is
// reachable here, so the images are written as archives (`docker save`
// layout, which `ctr images import` reads) and imported into each node's
// containerd.
//
// Two images: sluice's own (sluice-agent and sluice, static, with a static
// busybox for the chart's bpffs-mounting init container and for `kubectl
// exec`), and the pause image every pod sandbox runs, compiled from
// Kubernetes' own build/pause/linux/pause.c by scripts/k8s-build.sh.
package image

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"slices"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// File is one entry of an image layer: a regular file copied from Src, a
// symlink to Link, or (neither) a directory.
type File struct {
	Path string // absolute, in the image
	Src  string
	Link string
	Mode int64 // permission bits; 0: 0755 for binaries and dirs
}

// Spec describes an image of one layer.
type Spec struct {
	Files      []File
	Entrypoint []string
	Cmd        []string
	Env        []string
	// Created is the image's creation time (and every file's mtime): fixed,
	// so the same inputs give the same digest.
	Created time.Time
}

// Build returns the image spec describes.
func Build(spec Spec) (v1.Image, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	dirs := map[string]bool{}
	mkdirs := func(p string) error {
		var parents []string
		for d := path.Dir(p); d != "/" && d != "." && !dirs[d]; d = path.Dir(d) {
			parents = append(parents, d)
		}
		slices.Reverse(parents)
		for _, d := range parents {
			dirs[d] = true
			if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d[1:] + "/", Mode: 0o755, ModTime: spec.Created}); err != nil {
				return err
			}
		}
		return nil
	}
	for _, f := range spec.Files {
		if !path.IsAbs(f.Path) || path.Clean(f.Path) != f.Path {
			return nil, fmt.Errorf("image file %q: want a clean absolute path", f.Path)
		}
		if err := mkdirs(f.Path); err != nil {
			return nil, err
		}
		mode := f.Mode
		if mode == 0 {
			mode = 0o755
		}
		hdr := &tar.Header{Name: f.Path[1:], Mode: mode, ModTime: spec.Created}
		switch {
		case f.Link != "":
			hdr.Typeflag, hdr.Linkname = tar.TypeSymlink, f.Link
			if err := tw.WriteHeader(hdr); err != nil {
				return nil, err
			}
		case f.Src != "":
			data, err := os.ReadFile(f.Src)
			if err != nil {
				return nil, fmt.Errorf("image file %s: %w", f.Path, err)
			}
			hdr.Typeflag, hdr.Size = tar.TypeReg, int64(len(data))
			if err := tw.WriteHeader(hdr); err != nil {
				return nil, err
			}
			if _, err := tw.Write(data); err != nil {
				return nil, err
			}
		default:
			dirs[f.Path] = true
			hdr.Typeflag, hdr.Name = tar.TypeDir, hdr.Name+"/"
			if err := tw.WriteHeader(hdr); err != nil {
				return nil, err
			}
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	layerData := buf.Bytes()
	// The fastest gzip: the archive goes to a local containerd, and the
	// default level took ~100 s for sluice's binaries on 2 busy cores.
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerData)), nil
	}, tarball.WithCompressionLevel(gzip.BestSpeed))
	if err != nil {
		return nil, fmt.Errorf("image layer: %w", err)
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		return nil, err
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cfg = cfg.DeepCopy()
	cfg.Architecture, cfg.OS = "amd64", "linux"
	cfg.Created = v1.Time{Time: spec.Created}
	cfg.Config.Entrypoint, cfg.Config.Cmd = spec.Entrypoint, spec.Cmd
	cfg.Config.Env = spec.Env
	return mutate.ConfigFile(img, cfg)
}

// Write writes img as an archive `ctr images import` reads, tagged ref.
func Write(file, ref string, img v1.Image) error {
	tag, err := name.NewTag(ref)
	if err != nil {
		return fmt.Errorf("image name %q: %w", ref, err)
	}
	if err := tarball.WriteToFile(file, tag, img); err != nil {
		return fmt.Errorf("write image %s to %s: %w", ref, file, err)
	}
	return nil
}

// ErrNotStatic says a binary needs a dynamic loader, which the images do
// not carry.
var ErrNotStatic = errors.New("not a static binary (build with CGO_ENABLED=0, as ./scripts/build.sh does)")

// CheckStatic returns ErrNotStatic, wrapped with the path, when the ELF
// file at p has a program interpreter.
func CheckStatic(p string) error {
	f, err := elf.Open(p)
	if err != nil {
		return fmt.Errorf("%s: %w", p, err)
	}
	defer f.Close()
	for _, prog := range f.Progs {
		if prog.Type == elf.PT_INTERP {
			return fmt.Errorf("%s: %w", p, ErrNotStatic)
		}
	}
	return nil
}
