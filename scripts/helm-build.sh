#!/usr/bin/env bash
# Builds the real helm (v3), at the release pinned in third_party/helm/go.mod,
# into a cache shared by every checkout:
#   ${SLUICE_CACHE:-/var/cache/sluice}/helm/<version>/bin/helm
# Safe to run again: it does nothing when the binary is there and reports the
# pinned version. Steps and timings go to stderr; the last line, on stdout, is
# the bin dir, so scripts can do  bin=$(scripts/helm-build.sh).
#
# Needs only Go (GOTOOLCHAIN=auto fetches a newer toolchain if the local one is
# too old) and the Go module proxy; modules are checked against the committed
# third_party/helm/go.sum, never re-resolved. deploy/'s tests run it.
#
# Usage: scripts/helm-build.sh [--force]
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
		echo "helm-build: unknown argument '$arg' (want --force or --help)" >&2
		exit 2
		;;
	esac
done

start=$SECONDS
step() { echo "helm-build: [$((SECONDS - start))s] $*" >&2; }
die() {
	echo "helm-build: $*" >&2
	exit 1
}

command -v go >/dev/null 2>&1 || die "go not found in PATH (scripts/deps.sh installs it)"

mod_dir="$(cd "$(dirname "$0")/.." && pwd)/third_party/helm"
cd "$mod_dir"

export GOTOOLCHAIN=auto
# -mod=readonly: a go.sum gap is an error, not a silent re-resolution. This also
# overrides a GOFLAGS=-mod=mod from the caller's environment.
export GOFLAGS="-mod=readonly -buildvcs=false"
# helm's release binaries are static (Makefile: CGO_ENABLED=0).
export CGO_ENABLED=0

step "reading the pinned release from $mod_dir/go.mod"
version=$(go list -m -f '{{.Version}}' helm.sh/helm/v3) ||
	die "go list -m helm.sh/helm/v3 in $mod_dir failed"
[[ $version =~ ^v3\.[0-9]+\.[0-9]+$ ]] || die "unexpected helm.sh/helm/v3 version '$version'"
# helm's Makefile derives the Kubernetes version that .Capabilities and the
# deprecation lint assume from its client-go (v0.N.P => 1.N).
kube=$(go list -m -f '{{.Version}}' k8s.io/client-go) ||
	die "go list -m k8s.io/client-go in $mod_dir failed"
[[ $kube =~ ^v0\.([0-9]+)\.[0-9]+$ ]] || die "unexpected k8s.io/client-go version '$kube'"
kube_minor=${BASH_REMATCH[1]}

cache_root=${SLUICE_CACHE:-/var/cache/sluice}
bin_dir="$cache_root/helm/$version/bin"

# up_to_date succeeds when helm exists and reports the pinned version.
up_to_date() {
	local got
	[ -x "$bin_dir/helm" ] || return 1
	got=$("$bin_dir/helm" version --template '{{.Version}}' 2>/dev/null) || return 1
	[ "$got" = "$version" ]
}

mkdir -p "$cache_root/helm/$version" 2>/dev/null ||
	die "cannot create $cache_root/helm/$version (run as root or set SLUICE_CACHE)"

# One build at a time per version: a second caller waits and then finds the
# binary in place.
exec 9>"$cache_root/helm/$version/.lock"
if command -v flock >/dev/null 2>&1; then
	flock 9
fi

if [ "$force" -eq 0 ] && up_to_date; then
	step "helm $version already built"
	echo "$bin_dir"
	exit 0
fi

step "fetching helm.sh/helm/v3 $version from the module proxy (checked against go.sum)"
info=$(go mod download -json helm.sh/helm/v3 | sed -n 's/^[[:space:]]*"Info": "\(.*\)",$/\1/p')
[ -n "$info" ] && [ -f "$info" ] || die "go mod download helm.sh/helm/v3 $version gave no .info file"
commit=$(sed -n 's/.*"Hash":"\([0-9a-f]\{40\}\)".*/\1/p' "$info")

# The same -X flags as helm's Makefile for a tagged, clean release.
ldflags="-s -w -X helm.sh/helm/v3/internal/version.version=$version"
ldflags+=" -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
if [ -n "$commit" ]; then
	ldflags+=" -X helm.sh/helm/v3/internal/version.gitCommit=$commit"
fi
for pkg in pkg/lint/rules pkg/chartutil; do
	ldflags+=" -X helm.sh/helm/v3/$pkg.k8sVersionMajor=1 -X helm.sh/helm/v3/$pkg.k8sVersionMinor=$kube_minor"
done

# Build into a temporary dir next to the cache and rename it into place, so an
# interrupted build never leaves a binary that up_to_date would accept.
tmp=$(mktemp -d "$cache_root/helm/$version/.build.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

step "building helm $version (commit ${commit:-unknown}); a cold build downloads the rest and takes a few minutes"
go build -trimpath -ldflags "$ldflags" -o "$tmp/helm" helm.sh/helm/v3/cmd/helm ||
	die "go build helm.sh/helm/v3/cmd/helm failed"

got=$("$tmp/helm" version --template '{{.Version}}') || die "$tmp/helm version failed"
[ "$got" = "$version" ] || die "helm version says '$got', want '$version'"

chmod 0755 "$tmp"
rm -rf "$bin_dir.old"
if [ -d "$bin_dir" ]; then mv "$bin_dir" "$bin_dir.old"; fi
mv "$tmp" "$bin_dir"
rm -rf "$bin_dir.old"
trap - EXIT

step "built helm $version in $((SECONDS - start))s"
echo "$bin_dir"
