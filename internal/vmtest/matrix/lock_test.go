package matrix

import (
	"context"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// TestLockGivesUpWithContext: a lock held elsewhere is waited for until
// ctx ends, not for ever (an interrupted matrix must not hang in it).
func TestLockGivesUpWithContext(t *testing.T) {
	path := filepath.Join(t.TempDir(), "lock")
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	if _, err := lock(ctx, path); err == nil {
		t.Fatal("took a lock held elsewhere")
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("gave up after %v, want soon after the context's 300 ms", took)
	}
	f.Close() // released: taken at once
	unlock, err := lock(t.Context(), path)
	if err != nil {
		t.Fatalf("free lock: %v", err)
	}
	unlock()
}
