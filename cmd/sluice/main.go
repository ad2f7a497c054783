// Command sluice is the operator's and the node's CLI: status, service and
// map listings, monitor, tune, bandwidth, DNS replicas (internal/cli).
package main

import "github.com/sluice-dataplane/sluice/internal/cli"

func main() { cli.Main(cli.NewRoot()) }
