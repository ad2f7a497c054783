package bench

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// napiThreads returns the kernel threads that run a device's NAPI poll in
// threaded mode: their comm is "napi/<device>-<napi id>".
func napiThreads(dev string) (map[int]bool, error) {
	comms, err := filepath.Glob("/proc/[0-9]*/comm")
	if err != nil {
		return nil, err
	}
	pids := map[int]bool{}
	for _, path := range comms {
		comm, err := os.ReadFile(path)
		if err != nil {
			continue // gone meanwhile
		}
		if strings.HasPrefix(string(comm), "napi/"+dev+"-") {
			pid, err := strconv.Atoi(filepath.Base(filepath.Dir(path)))
			if err == nil {
				pids[pid] = true
			}
		}
	}
	return pids, nil
}

// pinNewNAPIThreads pins to cpu the NAPI threads of dev that were not in
// before: those of this namespace's device, made by the XDP attach that
// created its NAPI. Another namespace's device of the same name keeps its
// threads as they were.
func pinNewNAPIThreads(dev string, before map[int]bool, cpu int) (int, error) {
	now, err := napiThreads(dev)
	if err != nil {
		return 0, err
	}
	var set unix.CPUSet
	set.Set(cpu)
	pinned := 0
	for pid := range now {
		if before[pid] {
			continue
		}
		if err := unix.SchedSetaffinity(pid, &set); err != nil {
			return pinned, fmt.Errorf("pin NAPI thread %d of %s to CPU %d: %w", pid, dev, cpu, err)
		}
		pinned++
	}
	return pinned, nil
}
