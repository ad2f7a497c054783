#!/usr/bin/env bash
# Kubernetes' Service conformance tests against sluice and against the real
# kube-proxy, in one run (docs/conformance.md): installs and builds what it
# needs (e2e.test and agnhost from the pinned release: ten minutes or more the
# first time, then cached), then for each dataplane brings up a kubelet lab
# (docs/kubelet-lab.md), runs e2e.test against it and tears it down. About
# 20 minutes per dataplane on 2 cores. Extra arguments go to
# `sluice-lab conformance` (--focus, --skip, --dataplanes, --nodes, --out).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/deps.sh
# What the conformance tests run inside the agnhost image, from Debian.
missing=()
for p in netcat-openbsd curl bind9-dnsutils wget; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
	echo "==> apt: installing ${missing[*]}"
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
./scripts/build.sh
./scripts/etcd.sh >/dev/null
./scripts/k8s-build.sh >/dev/null
./scripts/coredns-build.sh >/dev/null
./scripts/helm-build.sh >/dev/null
./scripts/conformance-build.sh >/dev/null
case " $* " in
*" --cni flannel "* | *" --cni=flannel "*) ./scripts/flannel-build.sh >/dev/null ;; # the overlay CNI
esac
case " $* " in
*cilium*) # the contender: ~15 minutes once, then cached (docs/cilium.md)
	SLUICE_CILIUM_DIR=$(dirname "$(./scripts/cilium-build.sh | tail -n 1)")
	export SLUICE_CILIUM_DIR
	;;
esac
exec ./bin/sluice-lab conformance "$@"
