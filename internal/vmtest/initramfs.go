package vmtest

import (
	"bufio"
	"debug/elf"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
)

// The initramfs is what the guest needs before the host's filesystem is
// mounted: the init (a sluice binary, with its ELF interpreter and shared
// libraries), the modules that mount 9p and the control port, and the run's
// configuration. Everything else comes from the host over 9p.

// stage1Modules mount the host's filesystem and open the control port. On
// 6.1 virtio itself is a module; where one is built in (6.12: virtio_pci,
// virtio_console) it is skipped.
var stage1Modules = []string{"virtio_pci", "virtio_console", "9pnet_virtio", "9p", "overlay"}

// Paths inside the initramfs.
const (
	initPath        = "/init"
	guestConfigPath = "/sluice-vm.json"
	initrdModules   = "/modules"
)

// guestConfig is the run's configuration, written into the initramfs as
// JSON and read by the guest's init.
type guestConfig struct {
	Release  string   `json:"release"`
	Modules  []string `json:"modules"` // initramfs paths, in load order
	Argv     []string `json:"argv"`
	Dir      string   `json:"dir"`
	Env      []string `json:"env"`
	Hostname string   `json:"hostname"`
	// HostTag and ModulesTag name the 9p shares (QEMU mount_tag).
	HostTag    string `json:"host_tag"`
	ModulesTag string `json:"modules_tag"`
	// Port is the virtio-serial port name of the control channel.
	Port string `json:"port"`
	// NICs is how many network cards the guest must see before the
	// command starts (Config.NICs; their driver is loaded then).
	NICs int `json:"nics,omitempty"`
}

// moduleName is how the kernel names a module file: basename without .ko
// and compression, dashes as underscores.
func moduleName(file string) string {
	b := path.Base(file)
	if i := strings.Index(b, ".ko"); i >= 0 {
		b = b[:i]
	}
	return strings.ReplaceAll(b, "-", "_")
}

// ModuleClosure returns the module files (relative to the modules dir) that
// loading roots needs, each after its dependencies, from depmod's
// modules.dep and the kernel's modules.builtin. A built-in root is skipped;
// a root that is neither is an error.
func ModuleClosure(modulesDep, modulesBuiltin io.Reader, roots []string) ([]string, error) {
	deps := map[string][]string{}
	files := map[string]string{}
	sc := bufio.NewScanner(modulesDep)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		mod, rest, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		files[moduleName(mod)] = mod
		deps[mod] = strings.Fields(rest)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("modules.dep: %w", err)
	}
	builtin := map[string]bool{}
	sc = bufio.NewScanner(modulesBuiltin)
	for sc.Scan() {
		if l := strings.TrimSpace(sc.Text()); l != "" {
			builtin[moduleName(l)] = true
		}
	}
	var order []string
	done := map[string]bool{}
	var visit func(file string)
	visit = func(file string) {
		if done[file] {
			return
		}
		done[file] = true
		// modules.dep lists the dependencies of the dependencies too, the
		// deepest last; visiting from the end loads the deepest first.
		ds := deps[file]
		for i := len(ds) - 1; i >= 0; i-- {
			visit(ds[i])
		}
		order = append(order, file)
	}
	for _, r := range roots {
		name := moduleName(r)
		if f, ok := files[name]; ok {
			visit(f)
			continue
		}
		if !builtin[name] {
			return nil, fmt.Errorf("module %s: neither in modules.dep nor built in", r)
		}
	}
	return order, nil
}

// libDirs are where Debian keeps shared libraries (ld.so.conf.d on amd64).
var libDirs = []string{"/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib64", "/usr/lib64", "/lib", "/usr/lib"}

// ELFDeps returns the ELF interpreter and every shared library a binary
// needs, transitively, as host paths; a static binary needs none.
func ELFDeps(bin string) ([]string, error) {
	var out []string
	seen := map[string]bool{}
	var walk func(file string) error
	walk = func(file string) error {
		f, err := elf.Open(file)
		if err != nil {
			return fmt.Errorf("read ELF %s: %w", file, err)
		}
		defer f.Close()
		for _, p := range f.Progs {
			if p.Type != elf.PT_INTERP {
				continue
			}
			b, err := io.ReadAll(p.Open())
			if err != nil {
				return fmt.Errorf("ELF interpreter of %s: %w", file, err)
			}
			interp := strings.TrimRight(string(b), "\x00")
			if !seen[interp] {
				seen[interp] = true
				out = append(out, interp)
			}
		}
		libs, err := f.ImportedLibraries()
		if err != nil {
			return fmt.Errorf("shared libraries of %s: %w", file, err)
		}
		for _, lib := range libs {
			p, err := findLib(lib)
			if err != nil {
				return fmt.Errorf("%s needs %s: %w", file, lib, err)
			}
			if seen[p] {
				continue
			}
			seen[p] = true
			out = append(out, p)
			if err := walk(p); err != nil {
				return err
			}
		}
		return nil
	}
	if err := walk(bin); err != nil {
		return nil, err
	}
	sort.Strings(out)
	return out, nil
}

func findLib(name string) (string, error) {
	for _, d := range libDirs {
		p := filepath.Join(d, name)
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("not found in %s", strings.Join(libDirs, ", "))
}

// cpioWriter writes a "newc" cpio archive, the format the kernel unpacks
// into its initial root (Documentation/driver-api/early-userspace).
type cpioWriter struct {
	w    io.Writer
	ino  uint32
	dirs map[string]bool
	err  error
}

func newCPIO(w io.Writer) *cpioWriter {
	return &cpioWriter{w: w, ino: 1, dirs: map[string]bool{"/": true}}
}

func (c *cpioWriter) header(name string, mode uint32, size int64) {
	c.headerDev(name, mode, size, 0, 0)
}

func (c *cpioWriter) headerDev(name string, mode uint32, size int64, rdevMajor, rdevMinor uint32) {
	if c.err != nil {
		return
	}
	name = strings.TrimPrefix(name, "/")
	c.ino++
	// magic, ino, mode, uid, gid, nlink, mtime, filesize, devmajor,
	// devminor, rdevmajor, rdevminor, namesize (with the NUL), check.
	hdr := fmt.Sprintf("070701%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X",
		c.ino, mode, 0, 0, 1, 0, size, 0, 0, rdevMajor, rdevMinor, len(name)+1, 0)
	c.write([]byte(hdr + name + "\x00"))
	c.pad(int64(len(hdr) + len(name) + 1))
}

func (c *cpioWriter) write(b []byte) {
	if c.err == nil {
		_, c.err = c.w.Write(b)
	}
}

func (c *cpioWriter) pad(n int64) {
	if r := n % 4; r != 0 {
		c.write(make([]byte, 4-r))
	}
}

// mkdirAll writes every missing parent directory of p (and p).
func (c *cpioWriter) mkdirAll(p string) {
	p = path.Clean("/" + p)
	if c.dirs[p] {
		return
	}
	c.mkdirAll(path.Dir(p))
	c.dirs[p] = true
	c.header(p, 0o040755, 0)
}

// charDev writes a character device node.
func (c *cpioWriter) charDev(p string, major, minor uint32) {
	c.mkdirAll(path.Dir(p))
	c.headerDev(p, 0o020600, 0, major, minor)
}

// file writes a regular file with mode, its parents first.
func (c *cpioWriter) file(p string, mode os.FileMode, size int64, r io.Reader) {
	c.mkdirAll(path.Dir(p))
	c.header(p, 0o100000|uint32(mode.Perm()), size)
	if c.err != nil {
		return
	}
	n, err := io.Copy(c.w, io.LimitReader(r, size))
	if err == nil && n != size {
		err = fmt.Errorf("%s: wrote %d of %d bytes", p, n, size)
	}
	if err != nil {
		c.err = err
		return
	}
	c.pad(size)
}

// hostFile copies a host file (following symlinks) to p.
func (c *cpioWriter) hostFile(p, host string) {
	if c.err != nil {
		return
	}
	f, err := os.Open(host)
	if err != nil {
		c.err = err
		return
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		c.err = err
		return
	}
	c.file(p, st.Mode(), st.Size(), f)
}

func (c *cpioWriter) close() error {
	c.header("TRAILER!!!", 0, 0)
	return c.err
}

// writeInitramfs writes the initramfs for one run to dst: init (the host
// binary at /init, with its libraries), the stage-1 modules of k, and cfg.
func writeInitramfs(dst, initBin string, k Kernel, cfg guestConfig) error {
	dep, err := os.Open(filepath.Join(k.ModulesDir(), "modules.dep"))
	if err != nil {
		return err
	}
	defer dep.Close()
	builtin, err := os.Open(filepath.Join(k.ModulesDir(), "modules.builtin"))
	if err != nil {
		return err
	}
	defer builtin.Close()
	mods, err := ModuleClosure(dep, builtin, stage1Modules)
	if err != nil {
		return fmt.Errorf("kernel %s: %w", k.Release, err)
	}
	libs, err := ELFDeps(initBin)
	if err != nil {
		return fmt.Errorf("init binary: %w", err)
	}

	f, err := os.Create(dst)
	if err != nil {
		return err
	}
	defer f.Close()
	c := newCPIO(f)
	// The kernel opens /dev/console for init's stdin, stdout and stderr
	// before devtmpfs is mounted.
	c.charDev("/dev/console", 5, 1)
	c.hostFile(initPath, initBin)
	for _, l := range libs {
		c.hostFile(l, l)
	}
	cfg.Modules = nil
	for _, m := range mods {
		p := path.Join(initrdModules, m)
		c.hostFile(p, filepath.Join(k.ModulesDir(), m))
		cfg.Modules = append(cfg.Modules, p)
	}
	b, err := json.Marshal(cfg)
	if err != nil {
		return err
	}
	c.file(guestConfigPath, 0o644, int64(len(b)), strings.NewReader(string(b)))
	for _, d := range []string{"/dev", "/proc", "/sys", "/host", "/modules-share", "/rw", "/newroot"} {
		c.mkdirAll(d)
	}
	if err := c.close(); err != nil {
		return fmt.Errorf("write initramfs %s: %w", dst, err)
	}
	return f.Close()
}
