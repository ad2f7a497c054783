#!/usr/bin/env bash
# Builds sluice, sluice-agent and sluice-dns-autoscaler into ./bin.
set -euo pipefail
cd "$(dirname "$0")/.."
export GOTOOLCHAIN=auto
mkdir -p bin
echo "==> go build ./cmd/..."
# Static (no cgo): the same binaries go into the kubelet lab's container image.
# Release builds: no symbol table or DWARF (-s -w; panics still print their
# stacks) and no build paths (-trimpath); sizes in deploy/README.md.
CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o bin/ ./cmd/...
