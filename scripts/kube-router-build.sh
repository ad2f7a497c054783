#!/usr/bin/env bash
# Builds kube-router, at the release pinned in third_party/kube-router/go.mod,
# into a cache shared by every checkout:
#   ${SLUICE_CACHE:-/var/cache/sluice}/kube-router/<version>/bin/kube-router
# The kubelet lab runs its firewall controller alone as the NetworkPolicy
# engine in each node's netfilter (`lab up --kubelet --network-policy
# kube-router`); nothing of it is part of sluice. Its dependencies are raised
# over the release's (golang.org/x/net, x/crypto, grpc: see go.mod) for the
# advisories against v2.1.0's. Safe to run again: it does nothing when the
# binary is there. Steps go to stderr; the last line, on stdout, is the bin dir.
#
# Needs only Go and the Go module proxy; modules are checked against the
# committed third_party/kube-router/go.sum, never re-resolved.
#
# Usage: scripts/kube-router-build.sh [--force]
set -euo pipefail

name=kube-router
module=github.com/cloudnativelabs/kube-router/v2
pkg=$module/cmd/kube-router
binary=kube-router
# The version is stamped at link time (kube-router's own Makefile does so).
ldflags='-X $module/pkg/version.Version=$version'
version_flag=--version
# shellcheck source=lib/cached-build.sh
. "$(dirname "$0")/lib/cached-build.sh"
cached_build "$@"
