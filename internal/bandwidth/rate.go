// Package bandwidth is sluice's bandwidth manager: the Pods' kubernetes.io/
// egress-bandwidth and ingress-bandwidth annotations enforced on the
// Earliest Departure Time clock by BPF (bpf/lib/edt.h), with fq on the
// devices where the kernel has sch_fq and a policer plus TCP pacing at the
// source where it does not. The pure parts (annotations, the EDT arithmetic,
// the choice of mechanism, the desired state) are free of I/O; the kernel
// sits behind the Datapath interface (kernel.go is the BPF one).
package bandwidth

import (
	"errors"
	"fmt"
	"strings"

	"github.com/sluice-dataplane/sluice/internal/quantity"
	"k8s.io/apimachinery/pkg/api/resource"
)

// The Pod annotations, as the kubelet and the bandwidth CNI plugin read them.
const (
	EgressAnnotation  = "kubernetes.io/egress-bandwidth"
	IngressAnnotation = "kubernetes.io/ingress-bandwidth"
)

// Rate is a bandwidth in bits per second, as the annotations give it.
type Rate uint64

// The rates an annotation may ask for. The kubelet refuses below 1 kbit/s
// ("unreasonably small"); 100 Gbit/s is above any Pod's veth.
const (
	MinRate Rate = 1_000
	MaxRate Rate = 100_000_000_000
)

var (
	minQuantity = resource.NewQuantity(int64(MinRate), resource.DecimalSI)
	maxQuantity = resource.NewQuantity(int64(MaxRate), resource.DecimalSI)
)

// ParseRate reads an annotation's value as the kubelet does: a
// resource.Quantity in bits per second ("50M" is 50,000,000; "1G"; "500k";
// "10Mi" is 10,485,760), fractions rounded up to a whole bit.
func ParseRate(s string) (Rate, error) {
	q, err := quantity.Parse(strings.TrimSpace(s))
	var ee *quantity.ExponentError
	switch {
	case errors.As(err, &ee):
		return 0, fmt.Errorf("%q: exponent out of range", s)
	case err != nil:
		return 0, fmt.Errorf("%q is not a quantity of bits per second (like 50M, 1G or 500k)", s)
	}
	switch {
	case q.Sign() < 0:
		return 0, fmt.Errorf("%q is negative", s)
	case q.Cmp(*minQuantity) < 0:
		return 0, fmt.Errorf("%q is below %s bit/s", s, MinRate)
	case q.Cmp(*maxQuantity) > 0:
		return 0, fmt.Errorf("%q is above %s bit/s", s, MaxRate)
	}
	return Rate(q.Value()), nil
}

// BytesPerSecond is the rate in bytes, rounded down, as the datapath counts.
func (r Rate) BytesPerSecond() uint64 { return uint64(r) / 8 }

// String is the rate as a quantity: 50M, 1500k, 10485760.
func (r Rate) String() string {
	return resource.NewQuantity(int64(r), resource.DecimalSI).String()
}

// Limits are a Pod's rates; 0 is no limit in that direction.
type Limits struct {
	Egress  Rate
	Ingress Rate
}

// Limited reports whether either direction has a limit.
func (l Limits) Limited() bool { return l.Egress != 0 || l.Ingress != 0 }

// AnnotationError is a bad annotation value.
type AnnotationError struct {
	Annotation string
	Value      string
	Err        error
}

func (e *AnnotationError) Error() string {
	return fmt.Sprintf("%s: %v", e.Annotation, e.Err)
}

func (e *AnnotationError) Unwrap() error { return e.Err }

// PodLimits reads a Pod's annotations. Any bad value is an error
// (errors.Join of *AnnotationError) and the Pod gets no limit at all, as the
// kubelet would refuse it: a half-applied pair would surprise.
func PodLimits(annotations map[string]string) (Limits, error) {
	var l Limits
	var errs []error
	for _, a := range []struct {
		name string
		into *Rate
	}{{EgressAnnotation, &l.Egress}, {IngressAnnotation, &l.Ingress}} {
		v, ok := annotations[a.name]
		if !ok {
			continue
		}
		r, err := ParseRate(v)
		if err != nil {
			errs = append(errs, &AnnotationError{Annotation: a.name, Value: v, Err: err})
			continue
		}
		*a.into = r
	}
	if len(errs) > 0 {
		return Limits{}, errors.Join(errs...)
	}
	return l, nil
}
