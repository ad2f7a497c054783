#!/usr/bin/env bash
# A real node in one command: installs what it needs (containerd, runc, the CNI
# plugins, busybox-static, etcd, ...), builds sluice, the Kubernetes binaries
# (kubelet, kube-controller-manager, kube-scheduler, kubectl and pause with the
# apiserver), CoreDNS (the cluster's DNS, as pods) and helm, brings up a lab whose nodes run a real kubelet and
# containerd, and installs sluice's Helm chart and the DNS autoscaler's into it
# (docs/kubelet-lab.md).
# Extra arguments go to `sluice-lab up` (e.g. --nodes 1, --network-policy
# kube-router, --no-portmap, --cni flannel). Then:
#   ./bin/sluice-lab kubectl -- get pods -A
#   ./bin/sluice-lab kubectl -- -n kube-system exec ds/sluice -- sluice status
#   ./bin/sluice-lab down
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/deps.sh
./scripts/build.sh
./scripts/etcd.sh >/dev/null
./scripts/k8s-build.sh >/dev/null
./scripts/coredns-build.sh >/dev/null
./scripts/helm-build.sh >/dev/null
case " $* " in
*" --network-policy"*) ./scripts/kube-router-build.sh >/dev/null ;; # the NetworkPolicy engine
esac
case " $* " in
*" --cni flannel "* | *" --cni=flannel "*) ./scripts/flannel-build.sh >/dev/null ;; # the overlay CNI
esac
exec ./bin/sluice-lab up --kubelet --chart deploy/charts/sluice \
  --dns-autoscaler deploy/charts/sluice-dns-autoscaler "$@"
