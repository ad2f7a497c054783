package datapath

import (
	"bufio"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// KernelHZ returns CONFIG_HZ from /proc/config.gz or /boot/config-$(uname
// -r): the datapath's CT clock is jiffies / HZ seconds.
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
	return 0, fmt.Errorf("find CONFIG_HZ: %w", errors.Join(errs...))
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
