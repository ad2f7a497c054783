# shellcheck shell=bash
# cached_build builds one Go main package of a pinned third-party module
# (third_party/<name>/go.mod) into a cache shared by every checkout:
#   ${SLUICE_CACHE:-/var/cache/sluice}/<name>/<version>/bin/<binary>
# Modules are checked against the committed go.sum, never re-resolved. Safe
# to run again: nothing is built when the binary answers its version check.
# Steps go to stderr; the last line, on stdout, is the bin dir.
#
# The caller sets, then calls cached_build "$@":
#   name     third_party/<name>, the cache directory and the log prefix
#   module   the pinned module
#   pkg      the main package to build
#   binary   the file name it gets
#   ldflags  extra -ldflags (-s -w are always given); may use $version
#   version_flag  the binary's version flag; its output must name $version
#                 (without its leading v)
#   cgo      1 when the package needs cgo (default 0)
#   more_pkgs     optional: "package=binary ..." built beside it, with the
#                 same flags (no version check of their own)
#   cached_extra  optional function: called with the module's directory and
#                 the version's cache directory after the binaries, for files
#                 beside bin/; cached_extra_ok, when defined, says whether
#                 they are there (the build is up to date only then)

cached_build() {
	local force=0 arg
	for arg in "$@"; do
		case "$arg" in
		-f | --force) force=1 ;;
		-h | --help)
			sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
			exit 0
			;;
		*)
			echo "$name-build: unknown argument '$arg' (want --force or --help)" >&2
			exit 2
			;;
		esac
	done

	start=$SECONDS
	step() { echo "$name-build: [$((SECONDS - start))s] $*" >&2; }
	die() {
		echo "$name-build: $*" >&2
		exit 1
	}

	command -v go >/dev/null 2>&1 || die "go not found in PATH (scripts/deps.sh installs it)"
	cd "$(cd "$(dirname "$0")/.." && pwd)/third_party/$name" || die "no third_party/$name"

	export GOTOOLCHAIN=auto
	export GOFLAGS="-mod=readonly -buildvcs=false"
	export CGO_ENABLED=${cgo:-0}

	version=$(go list -m -f '{{.Version}}' "$module") ||
		die "go list -m $module in $PWD failed"
	[[ $version =~ ^v[0-9]+\.[0-9]+\.[0-9]+$ ]] || die "unexpected $module version '$version'"
	local cache_root=${SLUICE_CACHE:-/var/cache/sluice}
	bin_dir="$cache_root/$name/$version/bin"
	local flags
	flags="-s -w $(eval echo "$ldflags")"

	up_to_date() {
		[ -x "$bin_dir/$binary" ] || return 1
		local pb
		for pb in ${more_pkgs:-}; do [ -x "$bin_dir/${pb#*=}" ] || return 1; done
		if declare -F cached_extra_ok >/dev/null; then cached_extra_ok "$cache_root/$name/$version" || return 1; fi
		"$bin_dir/$binary" "$version_flag" 2>&1 | grep -qF "${version#v}"
	}

	mkdir -p "$cache_root/$name/$version" 2>/dev/null ||
		die "cannot create $cache_root/$name/$version (run as root or set SLUICE_CACHE)"
	exec 9>"$cache_root/$name/$version/.lock"
	if command -v flock >/dev/null 2>&1; then
		flock 9
	fi

	if [ "$force" -eq 0 ] && up_to_date; then
		step "$name $version already built"
		echo "$bin_dir"
		exit 0
	fi

	tmp=$(mktemp -d "$cache_root/$name/$version/.build.XXXXXX")
	trap 'rm -rf "$tmp"' EXIT
	step "building $name $version; a cold build downloads its modules and takes a few minutes"
	go build -trimpath -ldflags "$flags" -o "$tmp/$binary" "$pkg" || die "go build $pkg failed"
	"$tmp/$binary" "$version_flag" 2>&1 | grep -qF "${version#v}" ||
		die "$binary $version_flag says '$("$tmp/$binary" "$version_flag" 2>&1 | head -n 1)', want $version"
	local pb
	for pb in ${more_pkgs:-}; do
		go build -trimpath -ldflags "$flags" -o "$tmp/${pb#*=}" "${pb%%=*}" || die "go build ${pb%%=*} failed"
	done
	if declare -F cached_extra >/dev/null; then
		local src
		src=$(go mod download -json "$module" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
		[ -n "$src" ] && [ -d "$src" ] || die "go mod download $module gave no module directory"
		cached_extra "$src" "$cache_root/$name/$version" || die "copying $name's files beside bin/ failed"
	fi

	chmod 0755 "$tmp"
	rm -rf "$bin_dir.old"
	if [ -d "$bin_dir" ]; then mv "$bin_dir" "$bin_dir.old"; fi
	mv "$tmp" "$bin_dir"
	rm -rf "$bin_dir.old"
	trap - EXIT
	step "built $name $version in $((SECONDS - start))s"
	echo "$bin_dir"
}
