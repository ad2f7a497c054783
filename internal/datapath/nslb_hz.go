package datapath

import (
	"bufio"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// KernelHZ returns CONFIG_HZ from /proc/config.gz or /boot/config-$(uname
// -r): the datapath's CT clock is jiffies / HZ seconds. Without either (no
// IKCONFIG_PROC, and no host /boot: a container without the mount, a test
// VM) it measures the jiffies' rate (estimateHZ).
func KernelHZ() (uint32, error) {
	var uts unix.Utsname
	if err := unix.Uname(&uts); err != nil {
		return 0, fmt.Errorf("uname: %w", err)
	}
	release := unix.ByteSliceToString(uts.Release[:])
	var errs []error
	for _, path := range []string{"/proc/config.gz", "/boot/config-" + release} {
		hz, err := hzFromFile(path)
		if err == nil {
			return hz, nil
		}
		errs = append(errs, err)
	}
	hz, err := estimateHZ(hzInterval)
	if err == nil {
		return hz, nil
	}
	return 0, fmt.Errorf("find CONFIG_HZ: %w", errors.Join(append(errs, err)...))
}

// hzValues are the values CONFIG_HZ takes (kernel/Kconfig.hz).
var hzValues = []uint32{100, 250, 300, 1000}

// hzInterval is how long estimateHZ watches the jiffies: at HZ 100, 20
// jiffies, so one jiffy of reading skew is 5%, half the gap to the next
// value.
const hzInterval = 200 * time.Millisecond

// jiffiesSources are files that show the jiffies: schedstat's timestamp
// (CONFIG_SCHEDSTATS) and timer_list's per-CPU line (root only).
var jiffiesSources = []struct{ path, prefix string }{
	{"/proc/schedstat", "timestamp "},
	{"/proc/timer_list", "jiffies: "},
}

// estimateHZ reads the jiffies twice, interval apart, and returns the
// CONFIG_HZ value nearest to their rate, as Cilium probes HZ.
func estimateHZ(interval time.Duration) (uint32, error) {
	var errs []error
	for _, src := range jiffiesSources {
		j0, err := readJiffies(src.path, src.prefix)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		t0 := time.Now()
		time.Sleep(interval)
		j1, err := readJiffies(src.path, src.prefix)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		return nearestHZ(float64(j1-j0)/time.Since(t0).Seconds(), src.path)
	}
	return 0, fmt.Errorf("estimate HZ: %w", errors.Join(errs...))
}

// readJiffies returns the number on the first line of path that starts
// with prefix.
func readJiffies(path, prefix string) (uint64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	return parseJiffies(f, path, prefix)
}

func parseJiffies(r io.Reader, name, prefix string) (uint64, error) {
	s := bufio.NewScanner(r)
	for s.Scan() {
		if v, ok := strings.CutPrefix(s.Text(), prefix); ok {
			j, err := strconv.ParseUint(strings.TrimSpace(v), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("%s: bad %q line: %w", name, strings.TrimSpace(prefix), err)
			}
			return j, nil
		}
	}
	if err := s.Err(); err != nil {
		return 0, fmt.Errorf("read %s: %w", name, err)
	}
	return 0, fmt.Errorf("%s: no %q line", name, strings.TrimSpace(prefix))
}

// nearestHZ is the CONFIG_HZ value nearest to rate jiffies a second, if
// within 10% of it (250 and 300 are 20% apart).
func nearestHZ(rate float64, source string) (uint32, error) {
	best := hzValues[0]
	for _, hz := range hzValues[1:] {
		if math.Abs(rate-float64(hz)) < math.Abs(rate-float64(best)) {
			best = hz
		}
	}
	if math.Abs(rate-float64(best)) > float64(best)/10 {
		return 0, fmt.Errorf("%s: jiffies advance %.0f a second, no CONFIG_HZ value (%v) within 10%%", source, rate, hzValues)
	}
	return best, nil
}

func hzFromFile(path string) (uint32, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	var r io.Reader = f
	if strings.HasSuffix(path, ".gz") {
		gz, err := gzip.NewReader(f)
		if err != nil {
			return 0, fmt.Errorf("%s: %w", path, err)
		}
		defer gz.Close()
		r = gz
	}
	return parseHZ(r, path)
}

// parseHZ finds the CONFIG_HZ=N line of a kernel config.
func parseHZ(r io.Reader, name string) (uint32, error) {
	s := bufio.NewScanner(r)
	for s.Scan() {
		v, ok := strings.CutPrefix(s.Text(), "CONFIG_HZ=")
		if !ok {
			continue
		}
		hz, err := strconv.ParseUint(v, 10, 32)
		if err != nil || hz == 0 {
			return 0, fmt.Errorf("%s: bad CONFIG_HZ=%q", name, v)
		}
		return uint32(hz), nil
	}
	if err := s.Err(); err != nil {
		return 0, fmt.Errorf("read %s: %w", name, err)
	}
	return 0, fmt.Errorf("%s: no CONFIG_HZ", name)
}
