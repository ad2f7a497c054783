//go:build tools

// Package kuberouter pins kube-router, the lab's NetworkPolicy engine (its
// firewall controller alone: iptables and ipsets in the node's netfilter),
// built by scripts/kube-router-build.sh. Not part of sluice.
package kuberouter

import _ "github.com/cloudnativelabs/kube-router/v2/cmd/kube-router"
