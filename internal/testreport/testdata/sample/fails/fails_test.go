package fails

import (
	"fmt"
	"testing"
)

func TestFails(t *testing.T) {
	t.Run("good", func(t *testing.T) { t.Log("a passing subtest's log: not the failure's") })
	t.Run("bad", func(t *testing.T) {
		fmt.Println("output of the failing subtest")
		t.Error("want 1, got 2\nand a second line")
	})
}

func TestPasses(t *testing.T) {}
