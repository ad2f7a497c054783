#!/usr/bin/env bash
# Builds Kubernetes' conformance test binary e2e.test (the test of package
# k8s.io/kubernetes/test/e2e, with `go test -c`) and the static binaries of the
# agnhost and regression-issue-74839 test images, at the release pinned
# in third_party/k8s/go.mod, into the cache that scripts/k8s-build.sh uses:
#   ${SLUICE_CACHE:-/var/cache/sluice}/k8s/<version>/conformance
# and the ginkgo CLI of the same release (parallel runs) into .../ginkgo.
# Safe to run again: it does nothing when both are there, e2e.test -version
# reports the pinned release and agnhost --version the image's VERSION. Steps
# and timings go to stderr; the last line, on stdout, is the output dir, so
# scripts can do  dir=$(scripts/conformance-build.sh).
#
# Needs only Go and the Go module proxy, like k8s-build.sh: modules are checked
# against the committed third_party/k8s/go.sum (third_party/k8s/conformance
# names e2e.test's imports so that go mod tidy keeps them). A cold build of
# e2e.test takes 10 minutes or more on 2 cores.
#
# Usage: scripts/conformance-build.sh [--force]
set -euo pipefail

force=0
for arg in "$@"; do
	case "$arg" in
	-f | --force) force=1 ;;
	-h | --help)
		sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'
		exit 0
		;;
	*)
		echo "conformance-build: unknown argument '$arg' (want --force or --help)" >&2
		exit 2
		;;
	esac
done

start=$SECONDS
step() { echo "conformance-build: [$((SECONDS - start))s] $*" >&2; }
die() {
	echo "conformance-build: $*" >&2
	exit 1
}

command -v go >/dev/null 2>&1 || die "go not found in PATH (scripts/deps.sh installs it)"

mod_dir="$(cd "$(dirname "$0")/.." && pwd)/third_party/k8s"
cd "$mod_dir"

export GOTOOLCHAIN=auto
# -mod=readonly: a go.sum gap is an error, not a silent re-resolution.
export GOFLAGS="-mod=readonly -buildvcs=false"
# Both static: agnhost runs in a scratch-like image, e2e.test anywhere.
export CGO_ENABLED=0

step "reading the pinned release from $mod_dir/go.mod"
version=$(go list -m -f '{{.Version}}' k8s.io/kubernetes) ||
	die "go list -m k8s.io/kubernetes in $mod_dir failed"
[[ $version =~ ^v([0-9]+)\.([0-9]+)\.[0-9]+$ ]] || die "unexpected k8s.io/kubernetes version '$version'"
major=${BASH_REMATCH[1]}
minor=${BASH_REMATCH[2]}

cache_root=${SLUICE_CACHE:-/var/cache/sluice}
out_dir="$cache_root/k8s/$version/conformance"

# The module source: agnhost's image version is its VERSION file.
src=$(go mod download -json k8s.io/kubernetes | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
[ -n "$src" ] && [ -f "$src/test/images/agnhost/VERSION" ] ||
	die "no test/images/agnhost/VERSION in the k8s.io/kubernetes $version module"
agnhost_version=$(tr -d '[:space:]' <"$src/test/images/agnhost/VERSION")

# e2e.test -version prints the -X gitVersion; agnhost --version prints
# "app version <VERSION>" (cobra).
e2e_ok() { [ -x "$1/e2e.test" ] && [ "$("$1/e2e.test" -version 2>/dev/null)" = "$version" ]; }
# agnhost's porter serves TLS with the key pair its image carries at / (the
# upstream Dockerfile adds porter/localhost.crt and .key): kept beside it.
agnhost_ok() {
	[ -x "$1/agnhost" ] && [ "$("$1/agnhost" --version 2>/dev/null)" = "app version $agnhost_version" ] &&
		[ -f "$1/localhost.crt" ] && [ -f "$1/localhost.key" ]
}

mkdir -p "$cache_root/k8s/$version" 2>/dev/null ||
	die "cannot create $cache_root/k8s/$version (run as root or set SLUICE_CACHE)"

# One build at a time per version. A lock of its own, not k8s-build.sh's: a
# lab that only needs the kube binaries must not wait for this long build.
exec 9>"$cache_root/k8s/$version/.conformance.lock"
if command -v flock >/dev/null 2>&1; then
	flock 9
fi

# The invalid-conntrack-state test's image (registry.k8s.io/e2e-test-images/
# regression-issue-74839), a static binary with no version flag.
regression_ok() { [ -x "$1/regression-issue-74839" ]; }

# The ginkgo CLI of the release's ginkgo, which runs e2e.test's specs in
# parallel processes (sluice-lab conformance --parallel), in a dir of its own:
# the rebuild below replaces $out_dir whole.
ginkgo_version=$(go list -m -f '{{.Version}}' github.com/onsi/ginkgo/v2) ||
	die "go list -m github.com/onsi/ginkgo/v2 in $mod_dir failed"
ginkgo_dir="$cache_root/k8s/$version/ginkgo"
if [ "$force" -eq 1 ] || [ "$("$ginkgo_dir/ginkgo" version 2>/dev/null)" != "Ginkgo Version ${ginkgo_version#v}" ]; then
	step "building the ginkgo CLI $ginkgo_version"
	mkdir -p "$ginkgo_dir"
	go build -trimpath -ldflags "-s -w" -o "$ginkgo_dir/.ginkgo.tmp" github.com/onsi/ginkgo/v2/ginkgo ||
		die "go build github.com/onsi/ginkgo/v2/ginkgo failed"
	mv "$ginkgo_dir/.ginkgo.tmp" "$ginkgo_dir/ginkgo"
fi

if [ "$force" -eq 0 ] && e2e_ok "$out_dir" && agnhost_ok "$out_dir" && regression_ok "$out_dir"; then
	step "e2e.test $version and agnhost $agnhost_version already built"
	echo "$out_dir"
	exit 0
fi

info=$(go mod download -json k8s.io/kubernetes | sed -n 's/^[[:space:]]*"Info": "\(.*\)",$/\1/p')
[ -n "$info" ] && [ -f "$info" ] || die "go mod download k8s.io/kubernetes $version gave no .info file"
commit=$(sed -n 's/.*"Hash":"\([0-9a-f]\{40\}\)".*/\1/p' "$info")
build_date=$(sed -n 's/.*"Time":"\([^"]*\)".*/\1/p' "$info")
build_date=$(date -u -d "${build_date:-@0}" +%Y-%m-%dT%H:%M:%SZ)

# The same -X flags as scripts/k8s-build.sh (kube's hack/lib/version.sh).
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

# Build into a temporary dir and rename it into place, so an interrupted build
# never leaves a binary that the up-to-date check would accept.
tmp=$(mktemp -d "$cache_root/k8s/$version/.conformance.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

# Tags as kube's hack/lib/golang.sh sets them for commands and test binaries.
step "building agnhost $agnhost_version (k8s.io/kubernetes $version, commit ${commit:-unknown})"
go build -trimpath -tags selinux,notest -ldflags "-s -w -X main.Version=$agnhost_version" \
	-o "$tmp/agnhost" k8s.io/kubernetes/test/images/agnhost ||
	die "go build k8s.io/kubernetes/test/images/agnhost failed"
cp "$src/test/images/agnhost/porter/localhost.crt" "$src/test/images/agnhost/porter/localhost.key" "$tmp/" ||
	die "no porter key pair in $src/test/images/agnhost/porter"
chmod 0644 "$tmp/localhost.crt" "$tmp/localhost.key"
agnhost_ok "$tmp" || die "agnhost --version says '$("$tmp/agnhost" --version 2>&1 | head -1)', want 'app version $agnhost_version'"

step "building regression-issue-74839 (the invalid-conntrack-state test's server)"
go build -trimpath -ldflags "-s -w" -o "$tmp/regression-issue-74839" k8s.io/kubernetes/test/images/regression-issue-74839 ||
	die "go build k8s.io/kubernetes/test/images/regression-issue-74839 failed"

# -vet=off: go test -c would otherwise vet the whole e2e tree (minutes), which
# says nothing about the pinned upstream code we only want to run.
step "building e2e.test $version (go test -c k8s.io/kubernetes/test/e2e); a cold build takes 10 minutes or more"
go test -c -vet=off -trimpath -tags selinux,notest -ldflags "$ldflags" \
	-o "$tmp/e2e.test" k8s.io/kubernetes/test/e2e ||
	die "go test -c k8s.io/kubernetes/test/e2e failed"
e2e_ok "$tmp" || die "e2e.test -version says '$("$tmp/e2e.test" -version 2>&1 | head -1)', want '$version'"

chmod 0755 "$tmp"
rm -rf "$out_dir.old"
if [ -d "$out_dir" ]; then mv "$out_dir" "$out_dir.old"; fi
mv "$tmp" "$out_dir"
rm -rf "$out_dir.old"
trap - EXIT

step "built e2e.test $version and agnhost $agnhost_version in $((SECONDS - start))s"
echo "$out_dir"
