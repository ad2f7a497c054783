package reconciler

import (
	"errors"
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/types"

	"github.com/sluice-dataplane/sluice/internal/lbmap"
	"github.com/sluice-dataplane/sluice/internal/loadbalancer"
)

// ApplyError is what one Apply could not do. A frontend in Frontends keeps
// what was installed for it before (or stays absent); every other frontend
// was written. Err is a failure outside any one frontend (a sweep, the node
// addresses): it makes the next Apply a full sync.
type ApplyError struct {
	Frontends []FrontendError
	Err       error
}

// FrontendError is one frontend the maps do not hold as desired.
type FrontendError struct {
	Service  types.NamespacedName
	Name     loadbalancer.ServiceName
	Type     loadbalancer.FrontendType
	Frontend loadbalancer.Frontend
	Err      error
	// Retry: the error may pass (a full map, a failed write), so the
	// Service is listed by Failed; false for a value that can never be
	// programmed as it is (more backends than a frontend has slots).
	Retry bool
	// Need is, when a map was full, about how many more entries of it
	// the frontend wants.
	Need int
}

func (e FrontendError) Error() string {
	return fmt.Sprintf("service %s frontend %s: %v", e.Name, e.Frontend, e.Err)
}

// MapFull returns the full map the write failed on, if that was the cause.
func (e FrontendError) MapFull() (*lbmap.MapFullError, bool) {
	var full *lbmap.MapFullError
	ok := errors.As(e.Err, &full)
	return full, ok
}

// maxErrorLines bounds Error's text: a full map can fail thousands of
// frontends, and the summary is what a reader needs.
const maxErrorLines = 10

func (e *ApplyError) Error() string {
	var lines []string
	if e.Err != nil {
		lines = append(lines, e.Err.Error())
	}
	for i, fe := range e.Frontends {
		if i == maxErrorLines {
			lines = append(lines, fmt.Sprintf("and %d more frontends", len(e.Frontends)-i))
			break
		}
		lines = append(lines, fe.Error())
	}
	return strings.Join(lines, "\n")
}

func (e *ApplyError) Unwrap() []error {
	out := make([]error, 0, len(e.Frontends)+1)
	if e.Err != nil {
		out = append(out, e.Err)
	}
	for _, fe := range e.Frontends {
		out = append(out, fe.Err)
	}
	return out
}

// Systemic reports whether err, returned by Apply, includes a failure that
// is not one frontend's (so the maps may be unusable).
func Systemic(err error) bool {
	if err == nil {
		return false
	}
	var ae *ApplyError
	if errors.As(err, &ae) {
		return ae.Err != nil
	}
	return true
}
