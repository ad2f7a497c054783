// Package quantity guards k8s.io/apimachinery's resource.ParseQuantity
// against the inputs that hang it.
//
// ParseQuantity narrows a decimal exponent to int32 and rounds with a
// big.Int of 10^scale: "1e-2000000000" or "92233720E68547077580" never
// return (kubernetes/kubernetes#141203 and #141306, fixed after the
// v0.33 modules sluice builds with). A Pod annotation, a manifest or a
// flag is free text, so anything that reaches ParseQuantity from one goes
// through Parse or Check first.
package quantity

import (
	"fmt"
	"regexp"

	"k8s.io/apimachinery/pkg/api/resource"
)

// MaxExponentDigits is the longest decimal exponent accepted: "1e-999999"
// parses in about 60 ms, and every exponent one digit longer is either
// out of int32 or takes seconds to minutes.
const MaxExponentDigits = 6

// longExponent matches a quantity written with an exponent longer than
// MaxExponentDigits (leading zeros do not count).
var longExponent = regexp.MustCompile(`^[+-]?[0-9]*\.?[0-9]*[eE][+-]?0*[1-9][0-9]{6,}$`)

// scalar finds the same shape inside YAML or JSON text: a scalar standing
// alone between separators or quotes.
var scalar = regexp.MustCompile(`(?:^|[\s:,\[{"'])([+-]?[0-9]*\.?[0-9]+[eE][+-]?0*[1-9][0-9]{6,})(?:$|[\s,\]}"'])`)

// ExponentError is a quantity whose exponent ParseQuantity cannot take.
type ExponentError struct{ Value string }

func (e *ExponentError) Error() string {
	return fmt.Sprintf("quantity %q: exponent longer than %d digits", e.Value, MaxExponentDigits)
}

// Parse is resource.ParseQuantity refusing exponents that hang it.
func Parse(s string) (resource.Quantity, error) {
	if longExponent.MatchString(s) {
		return resource.Quantity{}, &ExponentError{Value: s}
	}
	return resource.ParseQuantity(s)
}

// Check finds the first scalar in YAML or JSON text that decoding into a
// resource.Quantity would hang on. It looks at every scalar, not only
// quantity fields: a label value "1e9999999" is refused too, which is the
// price of never decoding the document.
func Check(text []byte) error {
	m := scalar.FindSubmatch(text)
	if m == nil {
		return nil
	}
	return &ExponentError{Value: string(m[1])}
}
