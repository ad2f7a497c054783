#!/usr/bin/env bash
# The long mode of the contenders beside sluice that scripts/test.sh does not
# build: Cilium (docs/cilium.md). Builds what it needs (scripts/deps.sh, the
# Kubernetes control plane, Cilium from its Go module: ~15 minutes cold on 2
# cores, then cached), then runs the tests of the Cilium lab
# (TestPrivilegedCilium*: the lab up with cilium-agent on every node, the
# demo's Services through it, nothing left after lab down, the machine's
# sysctls and root cgroup untouched). scripts/test.sh skips exactly these
# tests, by name, and runs the rest.
#
# Usage: scripts/test-contenders.sh [go test flags...]
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/deps.sh
./scripts/build.sh
export GOTOOLCHAIN=auto
./scripts/etcd.sh >/dev/null
SLUICE_K8S_BIN_DIR=$(./scripts/k8s-build.sh | tail -n 1)
export SLUICE_K8S_BIN_DIR
echo "==> Cilium (agent, CNI plugin, cilium-dbg) built from its Go module (~15 minutes once, then cached)"
SLUICE_CILIUM_DIR=$(dirname "$(./scripts/cilium-build.sh | tail -n 1)")
export SLUICE_CILIUM_DIR
export SLUICE_BIN_DIR="$PWD/bin"
echo "==> go test -race ./internal/lab ./test/e2e -run '^TestPrivilegedCilium|^TestCilium|^TestCniConf'"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
go build -o "$tmp/testreport" ./scripts/testreport
go test -json -race -count=1 -timeout 90m -run '^TestPrivilegedCilium|^TestCilium|^TestCniConf' "$@" ./internal/lab ./test/e2e |
	tee bin/go-test-contenders.json | "$tmp/testreport"
