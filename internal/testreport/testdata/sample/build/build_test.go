package build

import "testing"

func TestBroken(t *testing.T) { undefined(t) }
