#!/usr/bin/env bash
# Builds sluice, sluice-agent and sluice-dns-autoscaler into ./bin.
set -euo pipefail
cd "$(dirname "$0")/.."
export GOTOOLCHAIN=auto
mkdir -p bin
echo "==> go build ./cmd/..."
# Static (no cgo): the same binaries go into the kubelet lab's container image.
CGO_ENABLED=0 go build -o bin/ ./cmd/...
