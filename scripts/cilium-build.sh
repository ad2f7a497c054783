#!/usr/bin/env bash
# Builds the real Cilium agent (kube-proxy replacement), its CNI plugin and
# cilium-dbg at the release pinned in third_party/cilium/go.mod, for the lab's
# Cilium contender (docs/cilium.md), into a cache shared by every checkout:
#   ${SLUICE_CACHE:-/var/cache/sluice}/cilium/<version>/bin   cilium-agent, cilium-cni, cilium-dbg
#   ${SLUICE_CACHE:-/var/cache/sluice}/cilium/<version>/lib/bpf   the datapath's C source, which
#     the agent compiles with clang at every start (the lab gives each node a copy)
#   ${SLUICE_CACHE:-/var/cache/sluice}/cilium/<version>/crds   its CustomResourceDefinitions,
#     which its operator would create (the lab applies them)
# The module needs two fixes to resolve (third_party/cilium/go.mod): gobgp's
# pinned pre-release, which the module proxy refuses, replaced by v4.7.0.
# Safe to run again: it does nothing when everything is there and the agent
# reports the pinned version. Steps go to stderr; the last line, on stdout,
# is the bin dir. Needs only Go and the Go module proxy; modules are checked
# against the committed go.sum. A cold build takes ~12 minutes on 2 cores.
#
# Usage: scripts/cilium-build.sh [--force]
set -euo pipefail

name=cilium
module=github.com/cilium/cilium
pkg=$module/daemon
binary=cilium-agent
more_pkgs="$module/plugins/cilium-cni=cilium-cni $module/cilium-dbg=cilium-dbg"
# Cilium's own version stamp (Makefile.defs).
ldflags='-X $module/pkg/version.ciliumVersion=${version#v}'
version_flag=--version

cached_extra_ok() {
	[ -f "$1/lib/bpf/bpf_lxc.c" ] && [ -f "$1/crds/ciliumnodes.yaml" ]
}

# cached_extra copies the datapath's source and the CRDs out of the module.
cached_extra() {
	local src=$1 dir=$2
	rm -rf "$dir/lib" "$dir/crds"
	mkdir -p "$dir/lib" "$dir/crds"
	cp -r "$src/bpf" "$dir/lib/bpf"
	cp "$src"/pkg/k8s/apis/cilium.io/client/crds/*/*.yaml "$dir/crds/"
	chmod -R u+w "$dir/lib" "$dir/crds"
}

# shellcheck source=lib/cached-build.sh
. "$(dirname "$0")/lib/cached-build.sh"
cached_build "$@"
