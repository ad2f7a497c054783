#!/usr/bin/env bash
# Every native Go fuzz target (func FuzzX in the repository's tests) for a
# fixed time each, a few at a time with one fuzzing worker each, then a
# summary: per target its time, inputs run, new corpus entries and verdict.
# A crash fails the run; its input is written to testdata/fuzz/FuzzX/ of the
# target's package (commit it with the fix: every go test replays it).
# With --packets N, also the packet fuzzer's long run (internal/pktfuzz):
# N packets through every tc and XDP program, every invariant checked.
#
#   ./scripts/fuzz.sh                       # 60 s per target, 2 at a time
#   ./scripts/fuzz.sh -t 30s                # what scripts/test.sh (and CI) runs
#   ./scripts/fuzz.sh -t 10m --packets 10000000   # the long run (docs/testing.md)
#   ./scripts/fuzz.sh -t 30s --only 'Tracker|Packets'
#
# FuzzPackets and the long run need root (BPF, a network namespace).
set -euo pipefail
cd "$(dirname "$0")/.."

fuzztime=60s
jobs=2
packets=0
only=.
while [ $# -gt 0 ]; do
	case "$1" in
	-t) fuzztime=$2; shift 2 ;;
	-j) jobs=$2; shift 2 ;;
	--packets) packets=$2; shift 2 ;;
	--only) only=$2; shift 2 ;;
	*) echo "usage: $0 [-t DURATION] [-j PARALLEL] [--packets N] [--only REGEXP]" >&2; exit 2 ;;
	esac
done

# Targets as "package-dir name", from the test files.
mapfile -t targets < <(grep -rEo '^func Fuzz[A-Za-z0-9_]+\(f \*testing\.F\)' --include='*_test.go' cmd internal test |
	sed -E 's#^(.*)/[^/]+_test\.go:func (Fuzz[A-Za-z0-9_]+)\(.*#./\1 \2#' | sort -u | grep -E -- "$only" || true)
if [ ${#targets[@]} -eq 0 ]; then
	echo "fuzz: no target matches $only" >&2
	exit 1
fi

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
export GOTOOLCHAIN=auto

# coordinator_race: the target's log shows Go's fuzzing coordinator
# failing at the end of -fuzztime with a bare "context deadline exceeded"
# and no input written (golang/go#75804, fixed in go1.27: the deadline is
# read from the parent context before it reaches the workers' one). That
# is no finding; the target runs once more.
coordinator_race() {
	grep -q 'context deadline exceeded' "$1" && ! grep -qE 'Failing input written|panic:|--- FAIL: .*\(0\.' "$1"
}

run() { # dir name: one target; its output in $out/name.log, its verdict in $out/name.rc
	local dir=$1 name=$2 start rc=0 try
	start=$(date +%s)
	for try in 1 2; do
		rc=0
		# -fuzzminimizetime bounds the minimisation of each new corpus
		# entry (60 s by default), which would eat the target's time.
		go test -run '^$' -fuzz "^${name}\$" -fuzztime "$fuzztime" -fuzzminimizetime 200x -parallel 1 "$dir" \
			>"$out/$name.log" 2>&1 || rc=$?
		if [ "$rc" -eq 0 ] || ! coordinator_race "$out/$name.log"; then
			break
		fi
		echo "fuzz: $name: Go's coordinator failed at the deadline with no input (golang/go#75804); running it again" >&2
	done
	echo "$rc $(($(date +%s) - start))" >"$out/$name.rc"
}

echo "fuzz: ${#targets[@]} targets, $fuzztime each, $jobs at a time"
start=$(date +%s)
running=0
for t in "${targets[@]}"; do
	read -r dir name <<<"$t"
	run "$dir" "$name" &
	running=$((running + 1))
	if [ "$running" -ge "$jobs" ]; then
		wait -n || true
		running=$((running - 1))
	fi
done
wait

failed=0
printf '%-28s %-22s %6s %12s %8s  %s\n' target package secs inputs new verdict
for t in "${targets[@]}"; do
	read -r dir name <<<"$t"
	read -r rc secs <"$out/$name.rc"
	last=$(grep -E '^fuzz: elapsed' "$out/$name.log" | tail -n 1 || true)
	execs=$(sed -nE 's/.*execs: ([0-9]+).*/\1/p' <<<"$last")
	newc=$(sed -nE 's/.*new interesting: ([0-9]+).*/\1/p' <<<"$last")
	verdict=ok
	if [ "$rc" -ne 0 ]; then
		verdict=FAIL
		failed=$((failed + 1))
	fi
	printf '%-28s %-22s %6s %12s %8s  %s\n' "$name" "${dir#./}" "$secs" "${execs:--}" "${newc:--}" "$verdict"
done
for t in "${targets[@]}"; do
	read -r dir name <<<"$t"
	read -r rc _ <"$out/$name.rc"
	if [ "$rc" -ne 0 ]; then
		echo
		echo "--- $name ($dir) failed:"
		grep -vE '^fuzz: elapsed' "$out/$name.log" | tail -n 60
	fi
done

if [ "$packets" -gt 0 ]; then
	echo
	echo "==> packet fuzzer: $packets packets through every tc and XDP program"
	if ! go test -count=1 -timeout 0 -run '^TestPrivilegedPacketFuzz$' -v ./internal/pktfuzz -pktfuzz.packets "$packets" |
		grep -vE '^=== RUN'; then
		failed=$((failed + 1))
	fi
fi

echo
if [ "$failed" -ne 0 ]; then
	echo "FUZZ FAIL: $failed of ${#targets[@]} targets (or the packet run) failed in $(($(date +%s) - start)) s"
	exit 1
fi
echo "FUZZ PASS: ${#targets[@]} targets, $fuzztime each, no crash, in $(($(date +%s) - start)) s"
