#!/usr/bin/env bash
# The kernel matrix (docs/kernels.md): the kernel-facing test packages and the
# lab smoke on this machine's kernel and on Debian's 6.1 and 6.12 under QEMU.
# Installs and builds what it needs first; arguments go to `sluice-lab vm matrix`
# (--kernels host,6.1 --suites smoke,datapath --lock FILE …). Writes
# results/kernels/matrix.{json,md} and the table in docs/kernels.md; exits 1
# when a test failed on any kernel. About 80 minutes under TCG on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/deps.sh
./scripts/build.sh
# The ipvs suite runs etcd (Debian's) and the real kube-apiserver and
# kube-proxy (cached build).
./scripts/etcd.sh >/dev/null
if [ -z "${SLUICE_K8S_BIN_DIR:-}" ]; then
	SLUICE_K8S_BIN_DIR=$(./scripts/k8s-build.sh | tail -n 1)
fi
export SLUICE_K8S_BIN_DIR
export GOTOOLCHAIN=auto
exec ./bin/sluice-lab vm matrix "$@"
