#!/usr/bin/env bash
# Builds flanneld, at the release pinned in third_party/flannel/go.mod, into
# a cache shared by every checkout:
#   ${SLUICE_CACHE:-/var/cache/sluice}/flannel/<version>/bin/flanneld
# The kubelet lab runs it in every node as the overlay CNI (`lab up --kubelet
# --cni flannel`: its VXLAN backend and kube subnet manager); nothing of it is
# part of sluice. One SDK flanneld links (Tencent Cloud's VPC client, for a
# backend the lab does not use) is not served by the Go module proxy: a
# stand-in that fails every call replaces it (third_party/flannel/
# tencentvpc-standin). Its udp backend needs cgo: gcc (scripts/deps.sh).
# Safe to run again: it does nothing when the binary is there. Steps go to
# stderr; the last line, on stdout, is the bin dir.
#
# Needs only Go, gcc and the Go module proxy; modules are checked against the
# committed third_party/flannel/go.sum, never re-resolved.
#
# Usage: scripts/flannel-build.sh [--force]
set -euo pipefail

name=flannel
module=github.com/flannel-io/flannel
pkg=$module
binary=flanneld
ldflags='-X $module/pkg/version.Version=$version'
version_flag=--version
cgo=1
# shellcheck source=lib/cached-build.sh
. "$(dirname "$0")/lib/cached-build.sh"
cached_build "$@"
