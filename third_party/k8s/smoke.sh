#!/usr/bin/env bash
# Smoke test for the pinned control plane: starts etcd and kube-apiserver on
# 127.0.0.1 high ports in a temp dir, waits for /readyz, makes one
# authenticated request, then stops both and removes the temp dir. The flags
# here are the ones the lab's control plane uses (with its fabric address
# instead of 127.0.0.1).
#
# Usage: third_party/k8s/smoke.sh [BIN_DIR]   (default: scripts/k8s-build.sh)
# Ports: SMOKE_ETCD_PORT (42379; peer +1), SMOKE_APISERVER_PORT (42443).
# SMOKE_LOG_DIR: keep etcd.log and apiserver.log there.
set -euo pipefail

root="$(cd "$(dirname "$0")/../.." && pwd)"
bin_dir=${1:-$("$root/scripts/k8s-build.sh")}
etcd_bin=$("$root/scripts/etcd.sh")
etcd_port=${SMOKE_ETCD_PORT:-42379}
api_port=${SMOKE_APISERVER_PORT:-42443}
addr=127.0.0.1
start=$SECONDS

step() { echo "smoke: [$((SECONDS - start))s] $*" >&2; }
die() {
	echo "smoke: $*" >&2
	exit 1
}

for p in "$etcd_port" "$((etcd_port + 1))" "$api_port"; do
	if ss -Htln "sport = :$p" | grep -q .; then die "port $p is in use"; fi
done

dir=$(mktemp -d /tmp/sluice-k8s-smoke.XXXXXX)
pids=()
cleanup() {
	# Newest first: the apiserver goes before the etcd it writes to.
	local i
	for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
		kill "${pids[i]}" 2>/dev/null || true
		wait "${pids[i]}" 2>/dev/null || true
	done
	if [ -n "${SMOKE_LOG_DIR:-}" ]; then
		mkdir -p "$SMOKE_LOG_DIR" && cp "$dir"/*.log "$SMOKE_LOG_DIR/" 2>/dev/null || true
	fi
	rm -rf "$dir"
}
trap cleanup EXIT INT TERM

# Service-account signing key pair; the apiserver generates its own
# self-signed serving certificate into --cert-dir.
openssl genrsa -out "$dir/sa.key" 2048 2>/dev/null
openssl rsa -in "$dir/sa.key" -pubout -out "$dir/sa.pub" 2>/dev/null
# Static token for clients (agents, kube-proxy, tests): user admin in
# system:masters.
token=$(openssl rand -hex 16)
echo "$token,admin,admin,system:masters" >"$dir/tokens.csv"

step "starting etcd on $addr:$etcd_port"
"$etcd_bin" \
	--name=smoke \
	--data-dir="$dir/etcd" \
	--listen-client-urls="http://$addr:$etcd_port" \
	--advertise-client-urls="http://$addr:$etcd_port" \
	--listen-peer-urls="http://$addr:$((etcd_port + 1))" \
	--initial-advertise-peer-urls="http://$addr:$((etcd_port + 1))" \
	--initial-cluster="smoke=http://$addr:$((etcd_port + 1))" \
	>"$dir/etcd.log" 2>&1 &
pids+=($!)

step "starting kube-apiserver on $addr:$api_port ($("$bin_dir/kube-apiserver" --version))"
"$bin_dir/kube-apiserver" \
	--etcd-servers="http://$addr:$etcd_port" \
	--bind-address="$addr" \
	--advertise-address="$addr" \
	--secure-port="$api_port" \
	--cert-dir="$dir/certs" \
	--token-auth-file="$dir/tokens.csv" \
	--authorization-mode=RBAC \
	--service-account-issuer=https://kubernetes.default.svc.cluster.local \
	--service-account-key-file="$dir/sa.pub" \
	--service-account-signing-key-file="$dir/sa.key" \
	--service-cluster-ip-range=198.19.0.0/17,fd00:198:19::/108 \
	--disable-admission-plugins=ServiceAccount \
	>"$dir/apiserver.log" 2>&1 &
pids+=($!)

ready=0
for _ in $(seq 1 120); do
	if out=$(curl -sk --max-time 2 "https://$addr:$api_port/readyz" 2>/dev/null) && [ "$out" = ok ]; then
		ready=1
		break
	fi
	kill -0 "${pids[1]}" 2>/dev/null || break
	sleep 0.5
done
if [ "$ready" -ne 1 ]; then
	tail -n 30 "$dir/etcd.log" "$dir/apiserver.log" >&2
	die "kube-apiserver did not become ready"
fi
step "/readyz: ok"

version=$(curl -sk --max-time 5 -H "Authorization: Bearer $token" "https://$addr:$api_port/version" |
	sed -n 's/.*"gitVersion": "\([^"]*\)".*/\1/p')
step "/version (authenticated): $version"
svc=$(curl -sk --max-time 5 -H "Authorization: Bearer $token" \
	"https://$addr:$api_port/api/v1/namespaces/default/services/kubernetes" |
	sed -n 's/.*"clusterIP": "\([^"]*\)".*/\1/p')
[ -n "$svc" ] || die "GET service default/kubernetes failed"
step "service default/kubernetes: clusterIP $svc"
step "ok; stopping"
