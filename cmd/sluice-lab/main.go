// Command sluice-lab is the lab's CLI: the lab, the benchmarks and the guest
// kernels (internal/labcli). Not in the image.
package main

import (
	"github.com/sluice-dataplane/sluice/internal/cli"
	"github.com/sluice-dataplane/sluice/internal/labcli"
)

func main() { cli.Main(labcli.NewRoot()) }
