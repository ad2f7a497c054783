package vmtest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"syscall"
)

// Debian's kernel image packages: linux-image-<release>-unsigned holds
// /boot/vmlinuz-<release> and /lib/modules/<release>. The -unsigned package is
// the same kernel as the signed one without the Secure Boot signature, which
// QEMU does not need. Debian 12 ships 6.1 (linux-image-6.1.0-N-amd64) and, in
// bookworm-security, 6.12 (linux-image-6.12.N+deb12-amd64): both reach a
// fresh Debian 12 machine through its default apt sources.
const (
	packagePrefix = "linux-image-"
	packageSuffix = "-unsigned"
	// Flavour is the Debian kernel flavour booted: the generic one users run.
	Flavour = "amd64"
)

// DefaultCacheRoot is where kernels are cached, beside scripts/k8s-build.sh's
// cache; $SLUICE_CACHE overrides it.
const DefaultCacheRoot = "/var/cache/sluice"

// CacheRoot returns $SLUICE_CACHE or DefaultCacheRoot.
func CacheRoot() string {
	if d := os.Getenv("SLUICE_CACHE"); d != "" {
		return d
	}
	return DefaultCacheRoot
}

// Spec names a kernel: a series ("6.1", "latest 6.12") resolves to the newest
// release apt knows, a release ("6.1.0-56-amd64", "6.12.117+deb12") names
// one.
type Spec struct {
	// Series is "major.minor" when the newest release of a series is asked for.
	Series string
	// Release is a concrete release with the flavour, as uname -r prints it.
	Release string
}

func (s Spec) String() string {
	if s.Release != "" {
		return s.Release
	}
	return "latest " + s.Series
}

var (
	seriesRe  = regexp.MustCompile(`^[0-9]+\.[0-9]+$`)
	releaseRe = regexp.MustCompile(`^([0-9]+\.[0-9]+\.[0-9]+-[0-9]+|[0-9]+\.[0-9]+\.[0-9]+\+deb[0-9]+)(-` + Flavour + `)?$`)
)

// ParseSpec reads a kernel as a user writes it: "6.1", "latest 6.1",
// "6.1.0-56", "6.1.0-56-amd64", "6.12.117+deb12", "6.12.117+deb12-amd64".
func ParseSpec(s string) (Spec, error) {
	in := strings.TrimSpace(s)
	if rest, ok := strings.CutPrefix(in, "latest"); ok {
		rest = strings.TrimSpace(rest)
		if !seriesRe.MatchString(rest) {
			return Spec{}, fmt.Errorf("kernel %q: want \"latest MAJOR.MINOR\" such as \"latest 6.1\"", s)
		}
		return Spec{Series: rest}, nil
	}
	if seriesRe.MatchString(in) {
		return Spec{Series: in}, nil
	}
	m := releaseRe.FindStringSubmatch(in)
	if m == nil {
		return Spec{}, fmt.Errorf("kernel %q: want a series (6.1, latest 6.12) or a Debian release (6.1.0-56-amd64, 6.12.117+deb12-amd64)", s)
	}
	return Spec{Release: m[1] + "-" + Flavour}, nil
}

// PackageName is the Debian package that holds release.
func PackageName(release string) string {
	return packagePrefix + release + packageSuffix
}

// packageSearchPattern is the apt-cache search --names-only regexp for every
// release of a series: 6.1 is numbered 6.1.0-ABI, later series 6.12.N+debV.
func packageSearchPattern(series string) string {
	return "^" + regexp.QuoteMeta(packagePrefix+series) + `\.[0-9].*-` + Flavour + regexp.QuoteMeta(packageSuffix) + "$"
}

// ParseSearch picks the releases of series out of `apt-cache search
// --names-only` output ("name - description" per line), newest first.
func ParseSearch(out, series string) []string {
	var releases []string
	seen := map[string]bool{}
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		name, _, _ := strings.Cut(sc.Text(), " ")
		rel, ok := strings.CutPrefix(name, packagePrefix)
		if !ok {
			continue
		}
		rel, ok = strings.CutSuffix(rel, packageSuffix)
		if !ok || !releaseRe.MatchString(rel) || !strings.HasSuffix(rel, "-"+Flavour) {
			continue
		}
		if !strings.HasPrefix(rel, series+".") || seen[rel] {
			continue
		}
		seen[rel] = true
		releases = append(releases, rel)
	}
	sort.Slice(releases, func(i, j int) bool { return CompareReleases(releases[i], releases[j]) > 0 })
	return releases
}

// CompareReleases orders releases by their numbers in turn (6.1.0-56 after
// 6.1.0-9, 6.12.117 after 6.12.9): -1, 0 or 1.
func CompareReleases(a, b string) int {
	na, nb := releaseNumbers(a), releaseNumbers(b)
	for i := 0; i < len(na) && i < len(nb); i++ {
		if na[i] != nb[i] {
			if na[i] < nb[i] {
				return -1
			}
			return 1
		}
	}
	switch {
	case len(na) < len(nb):
		return -1
	case len(na) > len(nb):
		return 1
	}
	return strings.Compare(a, b)
}

var numberRe = regexp.MustCompile(`[0-9]+`)

func releaseNumbers(s string) []int {
	var ns []int
	for _, m := range numberRe.FindAllString(s, -1) {
		n, err := strconv.Atoi(m)
		if err != nil {
			n = 0
		}
		ns = append(ns, n)
	}
	return ns
}

// Resolve turns a series into its newest release apt knows. When apt's lists
// hold none (a fresh machine), it runs apt-get update once and asks again.
func Resolve(ctx context.Context, spec Spec) (string, error) {
	if spec.Release != "" {
		return spec.Release, nil
	}
	search := func() (string, error) {
		out, err := exec.CommandContext(ctx, "apt-cache", "search", "--names-only", packageSearchPattern(spec.Series)).Output()
		if err != nil {
			return "", fmt.Errorf("apt-cache search for kernel %s: %w", spec, err)
		}
		return string(out), nil
	}
	out, err := search()
	if err != nil {
		return "", err
	}
	if rels := ParseSearch(out, spec.Series); len(rels) > 0 {
		return rels[0], nil
	}
	if out, err := exec.CommandContext(ctx, "apt-get", "update", "-qq").CombinedOutput(); err != nil {
		return "", fmt.Errorf("no %s* package in apt's lists, and apt-get update failed: %w: %s",
			PackageName(spec.Series), err, strings.TrimSpace(string(out)))
	}
	if out, err = search(); err != nil {
		return "", err
	}
	if rels := ParseSearch(out, spec.Series); len(rels) > 0 {
		return rels[0], nil
	}
	return "", fmt.Errorf("kernel %s: apt knows no package %s (a Debian 12 machine has 6.1, and 6.12 from bookworm-security)",
		spec, PackageName(spec.Series+".*-"+Flavour))
}

// Kernel is one Debian kernel unpacked in the cache.
type Kernel struct {
	Release string // as uname -r prints it
	Package string // Debian package name
	Version string // Debian package version
	Dir     string // the unpacked package: boot/, lib/modules/<Release>/
}

// Vmlinuz is the kernel image.
func (k Kernel) Vmlinuz() string { return filepath.Join(k.Dir, "boot", "vmlinuz-"+k.Release) }

// ModulesDir is /lib/modules/<release> of the package.
func (k Kernel) ModulesDir() string { return filepath.Join(k.Dir, "lib", "modules", k.Release) }

// readyFile marks a complete unpack; it holds "package version".
const readyFile = ".sluice-ready"

// Fetch returns release from the cache under root, downloading (apt-get
// download) and unpacking (dpkg-deb -x, depmod) it first when missing.
// Concurrent callers wait for one download. progress gets one line a step.
func Fetch(ctx context.Context, root, release string, progress func(string)) (Kernel, error) {
	if !releaseRe.MatchString(release) || !strings.HasSuffix(release, "-"+Flavour) {
		return Kernel{}, fmt.Errorf("kernel release %q: not a Debian release such as 6.1.0-56-amd64", release)
	}
	k := Kernel{Release: release, Package: PackageName(release), Dir: filepath.Join(root, "kernels", release)}
	if v, ok := readReady(k.Dir); ok {
		k.Version = v
		return k, nil
	}
	if err := os.MkdirAll(filepath.Dir(k.Dir), 0o755); err != nil {
		return Kernel{}, fmt.Errorf("kernel cache %s (run as root or set SLUICE_CACHE): %w", root, err)
	}
	lock, err := os.OpenFile(k.Dir+".lock", os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return Kernel{}, fmt.Errorf("kernel cache lock: %w", err)
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return Kernel{}, fmt.Errorf("kernel cache lock %s: %w", lock.Name(), err)
	}
	if v, ok := readReady(k.Dir); ok { // another caller fetched it meanwhile
		k.Version = v
		return k, nil
	}
	if err := os.RemoveAll(k.Dir); err != nil { // a partial unpack of a crashed run
		return Kernel{}, fmt.Errorf("remove partial %s: %w", k.Dir, err)
	}
	dl, err := os.MkdirTemp(filepath.Dir(k.Dir), ".download-")
	if err != nil {
		return Kernel{}, fmt.Errorf("kernel download dir: %w", err)
	}
	defer os.RemoveAll(dl)
	// apt drops privileges to _apt for downloads, which cannot write a
	// root-only directory; the directory is ours and removed anyway.
	_ = os.Chmod(dl, 0o777)

	progress(fmt.Sprintf("downloading %s (apt-get download)", k.Package))
	cmd := exec.CommandContext(ctx, "apt-get", "download", "-qq", k.Package)
	cmd.Dir = dl
	if out, err := cmd.CombinedOutput(); err != nil {
		return Kernel{}, fmt.Errorf("apt-get download %s: %w: %s (is apt's list current? apt-get update)",
			k.Package, err, strings.TrimSpace(string(out)))
	}
	debs, _ := filepath.Glob(filepath.Join(dl, "*.deb"))
	if len(debs) != 1 {
		return Kernel{}, fmt.Errorf("apt-get download %s left %d .deb files in %s, want 1", k.Package, len(debs), dl)
	}
	ver, err := exec.CommandContext(ctx, "dpkg-deb", "-f", debs[0], "Version").Output()
	if err != nil {
		return Kernel{}, fmt.Errorf("dpkg-deb -f %s Version: %w", debs[0], err)
	}
	k.Version = strings.TrimSpace(string(ver))

	progress(fmt.Sprintf("unpacking %s %s into %s", k.Package, k.Version, k.Dir))
	tmp := filepath.Join(dl, "root")
	if out, err := exec.CommandContext(ctx, "dpkg-deb", "-x", debs[0], tmp).CombinedOutput(); err != nil {
		return Kernel{}, fmt.Errorf("dpkg-deb -x %s: %w: %s", debs[0], err, strings.TrimSpace(string(out)))
	}
	// Debian's postinst runs depmod; modprobe in the guest needs its output.
	if out, err := exec.CommandContext(ctx, "depmod", "-b", tmp, release).CombinedOutput(); err != nil {
		return Kernel{}, fmt.Errorf("depmod -b %s %s (kmod; scripts/deps.sh installs it): %w: %s",
			tmp, release, err, strings.TrimSpace(string(out)))
	}
	kt := Kernel{Release: release, Dir: tmp}
	for _, p := range []string{kt.Vmlinuz(), filepath.Join(kt.ModulesDir(), "modules.dep")} {
		if _, err := os.Stat(p); err != nil {
			return Kernel{}, fmt.Errorf("package %s %s: %w", k.Package, k.Version, err)
		}
	}
	if err := os.WriteFile(filepath.Join(tmp, readyFile), []byte(k.Package+" "+k.Version+"\n"), 0o644); err != nil {
		return Kernel{}, err
	}
	if err := os.Rename(tmp, k.Dir); err != nil {
		return Kernel{}, fmt.Errorf("move unpacked kernel to %s: %w", k.Dir, err)
	}
	return k, nil
}

// readReady reports a complete unpack in dir and its package version.
func readReady(dir string) (string, bool) {
	b, err := os.ReadFile(filepath.Join(dir, readyFile))
	if err != nil {
		return "", false
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return "", false
	}
	return f[1], true
}

// ErrNoKernel wraps every failure to resolve or fetch a kernel package.
var ErrNoKernel = errors.New("kernel package unavailable")

// Get resolves spec and fetches it: the one call most users need.
func Get(ctx context.Context, spec string, progress func(string)) (Kernel, error) {
	s, err := ParseSpec(spec)
	if err != nil {
		return Kernel{}, err
	}
	rel, err := Resolve(ctx, s)
	if err != nil {
		return Kernel{}, fmt.Errorf("%w: %w", ErrNoKernel, err)
	}
	if s.Release == "" {
		progress(fmt.Sprintf("%s is %s", s, rel))
	}
	k, err := Fetch(ctx, CacheRoot(), rel, progress)
	if err != nil {
		return Kernel{}, fmt.Errorf("%w: %w", ErrNoKernel, err)
	}
	return k, nil
}
