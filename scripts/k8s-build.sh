#!/usr/bin/env bash
# Builds the real kube-apiserver, kube-proxy and, for the kubelet lab
# (docs/kubelet-lab.md), kubelet, kube-controller-manager, kube-scheduler and
# kubectl, and the pause image's static binary (Kubernetes' own pause.c, with
# clang), at the release pinned in
# third_party/k8s/go.mod, into a cache shared by every checkout:
#   ${SLUICE_CACHE:-/var/cache/sluice}/k8s/<version>/bin
# Safe to run again: it does nothing when both binaries are there and report
# the pinned version. Steps and timings go to stderr; the last line, on stdout,
# is the bin dir, so scripts can do  bin=$(scripts/k8s-build.sh).
#
# Needs only Go (GOTOOLCHAIN=auto fetches a newer toolchain if the local one is
# too old) and the Go module proxy; modules are checked against the committed
# third_party/k8s/go.sum, never re-resolved.
#
# Usage: scripts/k8s-build.sh [--force]
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
		echo "k8s-build: unknown argument '$arg' (want --force or --help)" >&2
		exit 2
		;;
	esac
done

start=$SECONDS
step() { echo "k8s-build: [$((SECONDS - start))s] $*" >&2; }
die() {
	echo "k8s-build: $*" >&2
	exit 1
}

command -v go >/dev/null 2>&1 || die "go not found in PATH (scripts/deps.sh installs it)"

mod_dir="$(cd "$(dirname "$0")/.." && pwd)/third_party/k8s"
cd "$mod_dir"

export GOTOOLCHAIN=auto
# -mod=readonly: a go.sum gap is an error, not a silent re-resolution. This also
# overrides a GOFLAGS=-mod=mod from the caller's environment.
export GOFLAGS="-mod=readonly -buildvcs=false"
# Kubernetes links both binaries statically (hack/lib/golang.sh).
export CGO_ENABLED=0

step "reading the pinned release from $mod_dir/go.mod"
version=$(go list -m -f '{{.Version}}' k8s.io/kubernetes) ||
	die "go list -m k8s.io/kubernetes in $mod_dir failed"
[[ $version =~ ^v([0-9]+)\.([0-9]+)\.[0-9]+$ ]] || die "unexpected k8s.io/kubernetes version '$version'"
major=${BASH_REMATCH[1]}
minor=${BASH_REMATCH[2]}

cache_root=${SLUICE_CACHE:-/var/cache/sluice}
bin_dir="$cache_root/k8s/$version/bin"
binaries=(kube-apiserver kube-proxy kube-controller-manager kube-scheduler kubelet kubectl)

# version_of prints "Kubernetes vX.Y.Z" for any of the binaries (kubectl has
# no --version flag).
version_of() {
	case "$(basename "$1")" in
	kubectl) "$1" version --client 2>/dev/null | sed -n 's/^Client Version: /Kubernetes /p' ;;
	*) "$1" --version 2>/dev/null ;;
	esac
}

# up_to_date succeeds when every binary exists and reports the pinned version.
up_to_date() {
	local b got
	[ -x "$bin_dir/pause" ] || return 1
	for b in "${binaries[@]}"; do
		[ -x "$bin_dir/$b" ] || return 1
		got=$(version_of "$bin_dir/$b") || return 1
		[ "$got" = "Kubernetes $version" ] || return 1
	done
}

mkdir -p "$cache_root/k8s/$version" 2>/dev/null ||
	die "cannot create $cache_root/k8s/$version (run as root or set SLUICE_CACHE)"

# One build at a time per version: a second caller waits and then finds the
# binaries in place.
exec 9>"$cache_root/k8s/$version/.lock"
if command -v flock >/dev/null 2>&1; then
	flock 9
fi

if [ "$force" -eq 0 ] && up_to_date; then
	step "${binaries[*]} $version already built"
	echo "$bin_dir"
	exit 0
fi

step "fetching k8s.io/kubernetes $version from the module proxy (checked against go.sum)"
info=$(go mod download -json k8s.io/kubernetes | sed -n 's/^[[:space:]]*"Info": "\(.*\)",$/\1/p')
[ -n "$info" ] && [ -f "$info" ] || die "go mod download k8s.io/kubernetes $version gave no .info file"
# The proxy's .info names the tagged commit and its time; kube's own release
# build stamps the same commit and (with SOURCE_DATE_EPOCH) a fixed date, so the
# binaries are reproducible.
commit=$(sed -n 's/.*"Hash":"\([0-9a-f]\{40\}\)".*/\1/p' "$info")
build_date=$(sed -n 's/.*"Time":"\([^"]*\)".*/\1/p' "$info")
build_date=$(date -u -d "${build_date:-@0}" +%Y-%m-%dT%H:%M:%SZ)

# The same -X flags as kube's hack/lib/version.sh, for client-go and
# component-base, so --version and /version report the release.
ldflags="-s -w"
add_ldflag() {
	ldflags+=" -X k8s.io/client-go/pkg/version.$1=$2 -X k8s.io/component-base/version.$1=$2"
}
add_ldflag gitVersion "$version"
add_ldflag gitMajor "$major"
add_ldflag gitMinor "$minor"
add_ldflag buildDate "$build_date"
if [ -n "$commit" ]; then
	add_ldflag gitCommit "$commit"
	add_ldflag gitTreeState clean
fi

# Build into a temporary dir next to the cache and rename it into place, so an
# interrupted build never leaves a binary that up_to_date would accept.
tmp=$(mktemp -d "$cache_root/k8s/$version/.build.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

pkgs=()
for b in "${binaries[@]}"; do pkgs+=("k8s.io/kubernetes/cmd/$b"); done
step "building ${binaries[*]} $version (commit ${commit:-unknown}); a cold build downloads the rest and takes several minutes"
go build -trimpath -tags selinux,notest -ldflags "$ldflags" -o "$tmp/" "${pkgs[@]}" ||
	die "go build ${pkgs[*]} failed"

for b in "${binaries[@]}"; do
	got=$(version_of "$tmp/$b") || die "$tmp/$b: version check failed"
	[ "$got" = "Kubernetes $version" ] || die "$b --version says '$got', want 'Kubernetes $version'"
done

# The pause container every pod sandbox runs: Kubernetes' build/pause builds
# it the same way (static, -Os), in a container we cannot pull here.
src=$(go mod download -json k8s.io/kubernetes | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
pause_c="$src/build/pause/linux/pause.c"
[ -f "$pause_c" ] || die "no $pause_c in the k8s.io/kubernetes module"
pause_version=$(sed -n 's/^TAG ?= //p' "$src/build/pause/Makefile")
cc=$(command -v clang-19 || command -v clang || command -v cc) || die "no C compiler for pause.c (scripts/deps.sh installs clang-19)"
step "building pause ${pause_version:-?} from $pause_c with $cc"
"$cc" -Os -Wall -Werror -static -DVERSION="v${pause_version:-unknown}-sluice" -o "$tmp/pause" "$pause_c" ||
	die "building pause failed (static linking needs libc6-dev's libc.a)"

chmod 0755 "$tmp"
rm -rf "$bin_dir.old"
if [ -d "$bin_dir" ]; then mv "$bin_dir" "$bin_dir.old"; fi
mv "$tmp" "$bin_dir"
rm -rf "$bin_dir.old"
trap - EXIT

step "built ${binaries[*]} $version in $((SECONDS - start))s"
echo "$bin_dir"
