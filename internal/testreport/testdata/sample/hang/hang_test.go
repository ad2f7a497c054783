package hang

import (
	"testing"
	"time"
)

func TestQuick(t *testing.T) {}

func TestHangs(t *testing.T) {
	t.Run("forever", func(t *testing.T) {
		t.Log("waiting")
		time.Sleep(time.Hour)
	})
}
