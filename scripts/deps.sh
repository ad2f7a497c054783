#!/usr/bin/env bash
# Installs what sluice needs to build, test and run its lab, on Debian 12.
# Safe to run again: it installs only what is missing.
set -euo pipefail

need_root() {
	if [ "$(id -u)" -ne 0 ]; then
		echo "sluice: run as root (BPF, network namespaces and cgroups need it)" >&2
		exit 1
	fi
}
need_root

pkgs=(clang-19 llvm-19 libbpf-dev bpftool iproute2 iptables nftables conntrack util-linux curl
	linux-libc-dev make git ca-certificates python3
	qemu-system-x86 kmod # sluice-lab vm: guest kernels under QEMU, depmod for their modules (docs/vmtest.md)
	ipset ipvsadm # kube-proxy's ipvs mode, the contender the kernel matrix runs in its guests, and its rules' check
	iperf3 # bulk TCP through a NodePort with GRO on (test/e2e/gro_test.go), bandwidth limits
	sockperf # request/response latency under a bandwidth limit's load (sluice-lab bench bandwidth)
	qperf ethtool # sluice-lab bench qperf; ring sizes and offloads (sluice tune)
	dnsperf # sluice-lab bench dns (the echo server's and the cluster DNS's queries per second)
	containerd runc containernetworking-plugins busybox-static # the kubelet lab: runtime, CNI, the image's shell (docs/kubelet-lab.md)
	gcc libc6-dev) # cgo: flanneld (its udp backend), the kubelet lab's overlay CNI
missing=()
for p in "${pkgs[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
	echo "==> apt: installing ${missing[*]}"
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq
	apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# Go: the module's go line names the toolchain; an older go fetches it from the
# module proxy (GOTOOLCHAIN=auto).
if ! command -v go >/dev/null 2>&1; then
	echo "==> apt: installing golang-go (the module's toolchain is then fetched by go itself)"
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends golang-go >/dev/null
fi
export GOTOOLCHAIN=auto

cd "$(dirname "$0")/.."
echo "==> go: downloading modules"
go mod download

# bpffs for pinned maps; the agent mounts it too when missing.
if ! mountpoint -q /sys/fs/bpf; then
	mount -t bpf bpf /sys/fs/bpf
fi
