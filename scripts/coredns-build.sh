#!/usr/bin/env bash
# Builds CoreDNS, at the release pinned in third_party/coredns/go.mod and with
# the plugins third_party/coredns/main.go lists (kubernetes, hosts, file,
# forward, cache, ...), into a cache shared by every checkout:
#   ${SLUICE_CACHE:-/var/cache/sluice}/coredns/<version>/bin/coredns
# Safe to run again: it does nothing when the binary is there and reports the
# pinned version. Steps go to stderr; the last line, on stdout, is the bin
# dir, so scripts can do  bin=$(scripts/coredns-build.sh).
#
# Needs only Go and the Go module proxy; modules are checked against the
# committed third_party/coredns/go.sum, never re-resolved.
#
# Usage: scripts/coredns-build.sh [--force]
set -euo pipefail

name=coredns
module=github.com/coredns/coredns
pkg=. # third_party/coredns/main.go: the plugins the lab needs
binary=coredns
ldflags=''
version_flag=-version # "CoreDNS-1.12.4"
# shellcheck source=lib/cached-build.sh
. "$(dirname "$0")/lib/cached-build.sh"
cached_build "$@"
