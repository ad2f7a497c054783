package pass

import (
	"fmt"
	"testing"
)

func TestPlain(t *testing.T) { t.Log("a log line of a passing test") }

func TestTable(t *testing.T) {
	for _, name := range []string{"one", "two"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
		})
	}
}

func Example_hello() {
	fmt.Println("hello")
	// Output: hello
}
