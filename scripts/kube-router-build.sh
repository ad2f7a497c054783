#!/usr/bin/env bash
# Builds kube-router, at the release pinned in third_party/kube-router/go.mod,
# into a cache shared by every checkout:
#   ${SLUICE_CACHE:-/var/cache/sluice}/kube-router/<version>/bin/kube-router
# The kubelet lab runs its firewall controller alone as the NetworkPolicy
# engine in each node's netfilter (`lab up --kubelet --network-policy
# kube-router`); nothing of it is part of sluice. Its dependencies are raised
# over the release's (golang.org/x/net, x/crypto, grpc: see go.mod) for the
# advisories against v2.1.0's. Safe to run again: it does nothing when the
# binary is there. Steps go to stderr; the last line, on stdout, is the bin dir.
#
# Needs only Go and the Go module proxy; modules are checked against the
# committed third_party/kube-router/go.sum, never re-resolved.
#
# Usage: scripts/kube-router-build.sh [--force]
set -euo pipefail

force=0
for arg in "$@"; do
	case "$arg" in
	-f | --force) force=1 ;;
	-h | --help)
		sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'
		exit 0
		;;
	*)
		echo "kube-router-build: unknown argument '$arg' (want --force or --help)" >&2
		exit 2
		;;
	esac
done

start=$SECONDS
step() { echo "kube-router-build: [$((SECONDS - start))s] $*" >&2; }
die() {
	echo "kube-router-build: $*" >&2
	exit 1
}

command -v go >/dev/null 2>&1 || die "go not found in PATH (scripts/deps.sh installs it)"
cd "$(cd "$(dirname "$0")/.." && pwd)/third_party/kube-router"

export GOTOOLCHAIN=auto
export GOFLAGS="-mod=readonly -buildvcs=false"
export CGO_ENABLED=0

module=github.com/cloudnativelabs/kube-router/v2
version=$(go list -m -f '{{.Version}}' "$module") ||
	die "go list -m $module in $PWD failed"
[[ $version =~ ^v[0-9]+\.[0-9]+\.[0-9]+$ ]] || die "unexpected $module version '$version'"
cache_root=${SLUICE_CACHE:-/var/cache/sluice}
bin_dir="$cache_root/kube-router/$version/bin"

# The version is stamped at link time (kube-router's own Makefile does so).
ldflags="-s -w -X $module/pkg/version.Version=$version"
up_to_date() {
	[ -x "$bin_dir/kube-router" ] || return 1
	"$bin_dir/kube-router" --version 2>&1 | grep -q "version $version"
}

mkdir -p "$cache_root/kube-router/$version" 2>/dev/null ||
	die "cannot create $cache_root/kube-router/$version (run as root or set SLUICE_CACHE)"
exec 9>"$cache_root/kube-router/$version/.lock"
if command -v flock >/dev/null 2>&1; then
	flock 9
fi

if [ "$force" -eq 0 ] && up_to_date; then
	step "kube-router $version already built"
	echo "$bin_dir"
	exit 0
fi

tmp=$(mktemp -d "$cache_root/kube-router/$version/.build.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
step "building kube-router $version; a cold build downloads its modules and takes a few minutes"
go build -trimpath -ldflags "$ldflags" -o "$tmp/kube-router" "$module/cmd/kube-router" || die "go build kube-router failed"
"$tmp/kube-router" --version 2>&1 | grep -q "version $version" ||
	die "kube-router --version says '$("$tmp/kube-router" --version 2>&1 | head -n 1)', want version $version"

chmod 0755 "$tmp"
rm -rf "$bin_dir.old"
if [ -d "$bin_dir" ]; then mv "$bin_dir" "$bin_dir.old"; fi
mv "$tmp" "$bin_dir"
rm -rf "$bin_dir.old"
trap - EXIT
step "built kube-router $version in $((SECONDS - start))s"
echo "$bin_dir"
