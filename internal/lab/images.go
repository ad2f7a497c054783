package lab

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/sluice-dataplane/sluice/internal/controlplane"
	"github.com/sluice-dataplane/sluice/internal/image"
)

// ChartImageRepository and ChartAppVersion are the image the Helm chart
// runs by default (deploy/charts/sluice: image.repository, appVersion; a
// unit test keeps them equal): the kubelet lab imports sluice's image under
// that name, so `helm install` needs no image values.
const (
	ChartImageRepository = "ghcr.io/sluice-dataplane/sluice"
	ChartAppVersion      = "0.1.0"
)

// BusyboxPath is Debian's static busybox (busybox-static): the image's
// shell for the chart's bpffs-mounting init container and for `kubectl
// exec`.
const BusyboxPath = "/bin/busybox"

// busyboxApplets are linked in /bin of sluice's image.
var busyboxApplets = []string{"sh", "cat", "ls", "mount", "umount", "stat", "sleep", "ps", "grep", "mkdir",
	"rm", "env", "echo", "test", "[", "kill", "wget", "nc", "ip", "tail", "head", "df"}

// SluiceImage finds or builds an archive of sluice's image, tagged ref,
// from binDir's sluice, sluice-agent, sluice-dns-autoscaler and sluice-lab
// (static binaries: ./scripts/build.sh builds them so), as the
// Dockerfile's, in the image cache (imageCacheDir).
func SluiceImage(binDir, ref string) (ImageArchive, error) {
	spec, err := sluiceImageSpec(binDir)
	if err != nil {
		return ImageArchive{}, err
	}
	img, _, err := cachedImage(ref, spec)
	return img, err
}

// cachedImage finds or builds the archive of spec's image, tagged ref, in
// the image cache; built says it was built now.
func cachedImage(ref string, spec image.Spec) (img ImageArchive, built bool, err error) {
	file, built, err := image.Archive(imageCacheDir(), ref, spec)
	if err != nil {
		return ImageArchive{}, false, fmt.Errorf("image %s: %w", ref, err)
	}
	return ImageArchive{Ref: ref, File: file}, built, nil
}

// sluiceImageSpec is sluice's image from binDir's binaries.
func sluiceImageSpec(binDir string) (image.Spec, error) {
	// /var/run → /run: the CLI's default API socket is /var/run/sluice/.
	files := []image.File{{Path: "/tmp", Mode: 0o1777}, {Path: "/run/sluice"}, {Path: "/var/run", Link: "/run"},
		{Path: "/sys/fs/bpf"}}
	// sluice-lab too: the lab's own workloads run its backend and probes
	// (the release image, Dockerfile, has the three others only).
	for _, b := range []string{"sluice", "sluice-agent", "sluice-dns-autoscaler", "sluice-lab"} {
		src := filepath.Join(binDir, b)
		if err := image.CheckStatic(src); err != nil {
			return image.Spec{}, fmt.Errorf("sluice image: %w", err)
		}
		files = append(files, image.File{Path: "/usr/local/bin/" + b, Src: src})
	}
	if err := image.CheckStatic(BusyboxPath); err != nil {
		return image.Spec{}, fmt.Errorf("sluice image: %w (install Debian's busybox-static: ./scripts/deps.sh does)", err)
	}
	files = append(files, image.File{Path: "/bin/busybox", Src: BusyboxPath})
	for _, a := range busyboxApplets {
		files = append(files, image.File{Path: "/bin/" + a, Link: "busybox"})
	}
	nf, err := netfilterTools()
	if err != nil {
		return image.Spec{}, fmt.Errorf("sluice image: %w", err)
	}
	files = append(files, nf...)
	return image.Spec{Files: files, Created: time.Unix(0, 0).UTC(),
		Entrypoint: []string{"/usr/local/bin/sluice-agent"},
		Env:        []string{"PATH=/usr/local/bin:/usr/sbin:/bin"}}, nil
}

// writeImage writes an archive of spec's image, tagged ref, to file.
func writeImage(ref, file string, spec image.Spec) error {
	img, err := image.Build(spec)
	if err != nil {
		return fmt.Errorf("image %s: %w", ref, err)
	}
	return image.Write(file, ref, img)
}

// xtablesModules is where Debian's iptables loads its match and target
// extensions from.
const xtablesModules = "/usr/lib/x86_64-linux-gnu/xtables"

// netfilterTools are Debian's iptables (legacy and nft, both families),
// nft and conntrack with their shared libraries and iptables' extensions,
// as the Dockerfile's image has them (apt's iptables, nftables, conntrack):
// `sluice cleanup-kube-proxy` in deploy/migrate's DaemonSet needs them.
func netfilterTools() ([]image.File, error) {
	var files []image.File
	bins := []string{"/usr/sbin/xtables-legacy-multi", "/usr/sbin/xtables-nft-multi", "/usr/sbin/nft", "/usr/sbin/conntrack"}
	libs := map[string]bool{}
	for _, b := range bins {
		if _, err := os.Stat(b); err != nil {
			return nil, fmt.Errorf("%s: %w (./scripts/deps.sh installs iptables, nftables and conntrack)", b, err)
		}
		files = append(files, image.File{Path: b, Src: b})
		deps, err := sharedLibraries(b)
		if err != nil {
			return nil, err
		}
		for _, d := range deps {
			libs[d] = true
		}
	}
	for _, fam := range []string{"iptables", "ip6tables"} {
		for _, v := range []string{"legacy", "nft"} {
			for _, suffix := range []string{"", "-save", "-restore"} {
				files = append(files, image.File{Path: "/usr/sbin/" + fam + "-" + v + suffix, Link: "xtables-" + v + "-multi"})
			}
		}
		for _, suffix := range []string{"", "-save", "-restore"} { // the default backend: nft, as Debian's
			files = append(files, image.File{Path: "/usr/sbin/" + fam + suffix, Link: "xtables-nft-multi"})
		}
	}
	mods, err := filepath.Glob(filepath.Join(xtablesModules, "*.so"))
	if err != nil || len(mods) == 0 {
		return nil, fmt.Errorf("iptables' extensions in %s: %v (found %d)", xtablesModules, err, len(mods))
	}
	for _, m := range mods {
		files = append(files, image.File{Path: m, Src: m, Mode: 0o644})
		deps, err := sharedLibraries(m) // libxt_statistic's libm, for one
		if err != nil {
			return nil, err
		}
		for _, d := range deps {
			libs[d] = true
		}
	}
	for _, l := range slices.Sorted(maps.Keys(libs)) {
		files = append(files, image.File{Path: l, Src: l, Mode: 0o755})
	}
	return files, nil
}

// staticBinaryImage writes an archive of an image, tagged ref, of one
// static binary at path, its entrypoint.
func staticBinaryImage(ref, path, bin, file string) error {
	spec, err := staticBinarySpec(ref, path, bin)
	if err != nil {
		return err
	}
	return writeImage(ref, file, spec)
}

// staticBinarySpec is the image ref of one static binary at path, its
// entrypoint.
func staticBinarySpec(ref, path, bin string) (image.Spec, error) {
	if err := image.CheckStatic(bin); err != nil {
		return image.Spec{}, fmt.Errorf("image %s: %w", ref, err)
	}
	return image.Spec{Files: []image.File{{Path: path, Src: bin}},
		Created: time.Unix(0, 0).UTC(), Entrypoint: []string{path}}, nil
}

// binDir is where the lab finds sluice's binaries: $SLUICE_BIN_DIR, else
// next to this executable.
func (c *Config) binDir() string {
	if dir := os.Getenv("SLUICE_BIN_DIR"); dir != "" {
		return dir
	}
	return filepath.Dir(c.Exe)
}

// buildImages finds or builds sluice's image (under the chart's default
// name), the pause image and CoreDNS's, for every node's containerd. The
// archives are kept in the cache's images/ (imageCacheDir), named by
// their inputs: the next lab of the same binaries builds nothing (a build
// of sluice's takes tens of seconds).
func (l *Lab) buildImages(cfg Config) error {
	bin, err := controlplane.BinDir()
	if err != nil {
		return err
	}
	dnsBin, err := CoreDNSBinary()
	if err != nil {
		return fmt.Errorf("the kubelet lab's cluster DNS: %w", err)
	}
	pauseBin := filepath.Join(bin, "pause")
	sluice, err := sluiceImageSpec(cfg.binDir())
	if err != nil {
		return err
	}
	pause, err := staticBinarySpec(PauseImage, "/pause", pauseBin)
	if err != nil {
		return err
	}
	dns, err := staticBinarySpec(CoreDNSImage, "/coredns", dnsBin)
	if err != nil {
		return err
	}
	l.Images = nil
	for _, w := range []struct {
		ref, from string
		spec      image.Spec
	}{{ChartImageRepository + ":" + ChartAppVersion, cfg.binDir(), sluice}, {PauseImage, pauseBin, pause}, {CoreDNSImage, dnsBin, dns}} {
		img, built, err := cachedImage(w.ref, w.spec)
		if err != nil {
			return err
		}
		if built {
			l.step("built image %s from %s (%s)", w.ref, w.from, img.File)
		} else {
			l.step("image %s from %s: built before (%s)", w.ref, w.from, img.File)
		}
		l.Images = append(l.Images, img)
	}
	return l.save()
}

// imageCacheDir keeps the kubelet lab's image archives:
// ${SLUICE_CACHE:-/var/cache/sluice}/images.
func imageCacheDir() string { return filepath.Join(cacheRoot(), "images") }

// cacheRoot is where the build scripts and the lab keep what they made
// once: $SLUICE_CACHE, else /var/cache/sluice.
func cacheRoot() string {
	if root := os.Getenv("SLUICE_CACHE"); root != "" {
		return root
	}
	return "/var/cache/sluice"
}
