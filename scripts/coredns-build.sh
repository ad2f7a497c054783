#!/usr/bin/env bash
# Builds CoreDNS, at the release pinned in third_party/coredns/go.mod and with
# the plugins third_party/coredns/main.go lists (kubernetes, hosts, file,
# forward, cache, ...), into a cache shared by every checkout:
#   ${SLUICE_CACHE:-/var/cache/sluice}/coredns/<version>/bin/coredns
# Safe to run again: it does nothing when the binary is there and reports the
# pinned version. Steps go to stderr; the last line, on stdout, is the bin
# dir, so scripts can do  bin=$(scripts/coredns-build.sh).
#
# Needs only Go and the Go module proxy; modules are checked against the
# committed third_party/coredns/go.sum, never re-resolved.
#
# Usage: scripts/coredns-build.sh [--force]
set -euo pipefail

force=0
for arg in "$@"; do
	case "$arg" in
	-f | --force) force=1 ;;
	-h | --help)
		sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'
		exit 0
		;;
	*)
		echo "coredns-build: unknown argument '$arg' (want --force or --help)" >&2
		exit 2
		;;
	esac
done

start=$SECONDS
step() { echo "coredns-build: [$((SECONDS - start))s] $*" >&2; }
die() {
	echo "coredns-build: $*" >&2
	exit 1
}

command -v go >/dev/null 2>&1 || die "go not found in PATH (scripts/deps.sh installs it)"
cd "$(cd "$(dirname "$0")/.." && pwd)/third_party/coredns"

export GOTOOLCHAIN=auto
export GOFLAGS="-mod=readonly -buildvcs=false"
export CGO_ENABLED=0

version=$(go list -m -f '{{.Version}}' github.com/coredns/coredns) ||
	die "go list -m github.com/coredns/coredns in $PWD failed"
[[ $version =~ ^v[0-9]+\.[0-9]+\.[0-9]+$ ]] || die "unexpected github.com/coredns/coredns version '$version'"
cache_root=${SLUICE_CACHE:-/var/cache/sluice}
bin_dir="$cache_root/coredns/$version/bin"

# CoreDNS prints "CoreDNS-1.12.4" first in its -version output.
up_to_date() {
	[ -x "$bin_dir/coredns" ] || return 1
	"$bin_dir/coredns" -version 2>/dev/null | grep -qx "CoreDNS-${version#v}"
}

mkdir -p "$cache_root/coredns/$version" 2>/dev/null ||
	die "cannot create $cache_root/coredns/$version (run as root or set SLUICE_CACHE)"
exec 9>"$cache_root/coredns/$version/.lock"
if command -v flock >/dev/null 2>&1; then
	flock 9
fi

if [ "$force" -eq 0 ] && up_to_date; then
	step "coredns $version already built"
	echo "$bin_dir"
	exit 0
fi

tmp=$(mktemp -d "$cache_root/coredns/$version/.build.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
step "building coredns $version; a cold build downloads its modules and takes a few minutes"
go build -trimpath -ldflags "-s -w" -o "$tmp/coredns" . || die "go build coredns failed"
up_to_date_tmp=$("$tmp/coredns" -version | head -n 1)
[ "$up_to_date_tmp" = "CoreDNS-${version#v}" ] || die "coredns -version says '$up_to_date_tmp', want CoreDNS-${version#v}"

chmod 0755 "$tmp"
rm -rf "$bin_dir.old"
if [ -d "$bin_dir" ]; then mv "$bin_dir" "$bin_dir.old"; fi
mv "$tmp" "$bin_dir"
rm -rf "$bin_dir.old"
trap - EXIT
step "built coredns $version in $((SECONDS - start))s"
echo "$bin_dir"
