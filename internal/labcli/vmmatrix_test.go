package labcli

import (
	"io"
	"testing"
)

// A partial matrix run leaves docs/kernels.md's table alone unless --doc
// asks for it; a full run writes it.
func TestMatrixDoc(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "docs/kernels.md"},
		{[]string{"--kernels", "6.1"}, ""},
		{[]string{"--suites", "datapath"}, ""},
		{[]string{"--kernels", "6.1", "--doc", "docs/kernels.md"}, "docs/kernels.md"},
		{[]string{"--doc", "other.md"}, "other.md"},
	} {
		cmd := vmMatrixCommand()
		if err := cmd.Flags().Parse(tc.args); err != nil {
			t.Fatal(err)
		}
		doc, _ := cmd.Flags().GetString("doc")
		if got := matrixDoc(cmd.Flags(), doc, io.Discard); got != tc.want {
			t.Errorf("%v: doc %q, want %q", tc.args, got, tc.want)
		}
	}
}
