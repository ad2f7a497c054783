#!/usr/bin/env bash
# Installs Debian's etcd-server package when etcd is missing and prints the
# etcd binary path on the last line (stdout), so scripts can do
#   etcd=$(scripts/etcd.sh)
# The package's systemd unit is not used: the lab starts its own etcd, so a
# service the package may have started is stopped and disabled again.
set -euo pipefail

step() { echo "etcd: $*" >&2; }
die() {
	echo "etcd: $*" >&2
	exit 1
}

pkg=etcd-server
if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
	[ "$(id -u)" -eq 0 ] || die "$pkg is not installed and installing it needs root"
	step "apt: installing $pkg"
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq
	# policy-rc.d 101 keeps the package from starting etcd on the default
	# ports; remove it again even when the install fails.
	policy=/usr/sbin/policy-rc.d
	if [ ! -e "$policy" ]; then
		printf '#!/bin/sh\nexit 101\n' >"$policy"
		chmod 0755 "$policy"
		trap 'rm -f "$policy"' EXIT
	fi
	apt-get install -y -qq --no-install-recommends "$pkg" >/dev/null
	if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
		systemctl disable --now etcd.service >/dev/null 2>&1 || true
	fi
fi

bin=$(command -v etcd || true)
[ -n "$bin" ] || bin=/usr/bin/etcd
[ -x "$bin" ] || die "$pkg is installed but $bin is missing"
step "$("$bin" --version 2>/dev/null | head -1)"
echo "$bin"
