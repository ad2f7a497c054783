package mainfail

import (
	"fmt"
	"os"
	"testing"
)

func TestMain(m *testing.M) {
	code := m.Run()
	fmt.Println("mainfail: teardown failed: lab down: device busy")
	if code == 0 {
		code = 1
	}
	os.Exit(code)
}

func TestFine(t *testing.T) {}
