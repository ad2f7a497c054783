//go:build tools

// Package flannel pins flanneld, the kubelet lab's overlay CNI (its VXLAN
// backend and kube subnet manager), built by scripts/flannel-build.sh. Not
// part of sluice.
package flannel

import _ "github.com/flannel-io/flannel"
