#!/usr/bin/env bash
# Every test: generated code up to date, formatting, vet, unit tests, and the
# privileged tests (real BPF programs, namespaces, sockets). Installs what it
# needs first.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/deps.sh
./scripts/build.sh
export GOTOOLCHAIN=auto

# The real control plane for the tests that need one: etcd from Debian,
# kube-apiserver and kube-proxy built from the k8s.io/kubernetes module
# (about 7 minutes the first time, then cached under /var/cache/sluice).
echo "==> etcd, kube-apiserver and kube-proxy"
./scripts/etcd.sh >/dev/null
SLUICE_K8S_BIN_DIR=$(./scripts/k8s-build.sh | tail -n 1)
export SLUICE_K8S_BIN_DIR
echo "==> helm (the deploy/ tests lint and render the charts with it; built once, cached)"
./scripts/helm-build.sh >/dev/null

echo "==> generated BPF objects match the sources"
./scripts/check-generate.sh

echo "==> gofmt"
bad=$(gofmt -l cmd internal deploy test)
if [ -n "$bad" ]; then
	echo "gofmt needed on:"; echo "$bad"; exit 1
fi

echo "==> go vet"
go vet ./...

# Privileged tests start bin/sluice and bin/sluice-agent.
export SLUICE_BIN_DIR="$PWD/bin"
echo "==> go test (unit and privileged)"
go test -count=1 -timeout 30m "$@" ./...
