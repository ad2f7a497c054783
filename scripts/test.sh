#!/usr/bin/env bash
# Every test: generated code up to date, formatting, vet, unit tests, and the
# privileged tests (real BPF programs, namespaces, sockets). Installs what it
# needs first. Ends with the count of tests passed, failed and skipped and
# every skip with its reason; as root, a skip for anything but a kernel
# feature the probe reports missing fails the run (docs/testing.md).
set -euo pipefail
cd "$(dirname "$0")/.."
# Each step says when it started (minutes:seconds into the run), so that a
# slow CI run shows where its time went (docs/testing.md).
step() { printf '==> [%d:%02d] %s\n' $((SECONDS / 60)) $((SECONDS % 60)) "$*"; }
step "dependencies (apt, Go modules)"
./scripts/deps.sh
step "build"
./scripts/build.sh
export GOTOOLCHAIN=auto

# The real control plane for the tests that need one: etcd from Debian,
# kube-apiserver, kube-proxy and, for the kubelet lab's test, kubelet,
# kube-controller-manager, kube-scheduler, kubectl and pause built from the
# k8s.io/kubernetes module (about 10 minutes the first time, then cached
# under /var/cache/sluice).
step "etcd and the Kubernetes binaries (apiserver, kube-proxy, kubelet, controller-manager, scheduler, kubectl)"
./scripts/etcd.sh >/dev/null
SLUICE_K8S_BIN_DIR=$(./scripts/k8s-build.sh | tail -n 1)
export SLUICE_K8S_BIN_DIR
step "CoreDNS (the lab's cluster DNS) built from its Go module (a few minutes once, then cached)"
SLUICE_COREDNS_BIN=$(./scripts/coredns-build.sh | tail -n 1)/coredns
export SLUICE_COREDNS_BIN
step "kube-router (the kubelet lab's NetworkPolicy engine) built from its Go module (a minute or two once, then cached)"
SLUICE_KUBE_ROUTER_BIN=$(./scripts/kube-router-build.sh | tail -n 1)/kube-router
export SLUICE_KUBE_ROUTER_BIN
step "flanneld (the kubelet lab's overlay CNI) built from its Go module (a minute or two once, then cached)"
SLUICE_FLANNEL_BIN=$(./scripts/flannel-build.sh | tail -n 1)/flanneld
export SLUICE_FLANNEL_BIN
step "helm (the deploy/ tests lint and render the charts with it; built once, cached)"
./scripts/helm-build.sh >/dev/null
step "guest kernel for the kernel smoke (Debian 12's 6.1 under QEMU; downloaded once, cached)"
# test/e2e's TestPrivilegedKernelSmokeGuest boots it (docs/kernels.md). A
# machine that cannot get it lets that test skip, which the summary accepts
# only after trying again (no QEMU, or the package out of reach).
./bin/sluice-lab vm fetch 6.1 || echo "guest kernel 6.1 unavailable here: TestPrivilegedKernelSmokeGuest will say why"

step "generated BPF objects match the sources"
./scripts/check-generate.sh

step "gofmt"
bad=$(gofmt -l cmd internal deploy test scripts)
if [ -n "$bad" ]; then
	echo "gofmt needed on:"; echo "$bad"; exit 1
fi

step "go vet"
go vet ./...

# Privileged tests start bin/sluice, bin/sluice-lab and bin/sluice-agent.
export SLUICE_BIN_DIR="$PWD/bin"

# One run of every test, unit and privileged, under the race detector: it
# costs the privileged tests 5-30% here, less than building every test
# binary a second time without it (docs/testing.md). No -short: every test
# runs in full. scripts/testreport reads `go test -json`: a line per package,
# each failed test's output in full, then the counts and the skips. The raw
# events stay in bin/go-test.json.
step "go test -race (unit and privileged)"
tmp=$(mktemp -d)
fuzzpid=
cleanup() {
	if [ -n "$fuzzpid" ]; then
		kill -- -"$fuzzpid" 2>/dev/null || true
	fi
	rm -rf "$tmp"
}
trap cleanup EXIT
go build -o "$tmp/testreport" ./scripts/testreport

# The fuzz stage: every native fuzz target 30 s, two at a time on one worker
# each (CI's two cores); a crash fails the run, its input in the target's
# testdata/fuzz/ (docs/testing.md). Not with arguments (a targeted run). The
# short version of the fuzzing; the long run is
# ./scripts/fuzz.sh -t 10m --packets 10000000. It runs beside test/e2e, at
# the idle CPU priority (SCHED_IDLE, inherited by its builds and workers):
# test/e2e's labs and guests mostly wait, and a process of that class runs
# only on a CPU no other process wants, so the tests' rates and timeouts
# are not its to take. It starts when test/e2e's binary does: before, the
# other packages keep both CPUs busy and it would spend its 30 s starved.
fuzz_beside_e2e() {
	local e2e='"Action":"start","Package":"github.com/sluice-dataplane/sluice/test/e2e"'
	until grep -qF "$e2e" bin/go-test.json 2>/dev/null || [ -e "$tmp/go-test.done" ]; do
		sleep 2
	done
	echo "$SECONDS" >"$tmp/fuzz.start"
	local idle=(nice -n 19)
	if chrt --idle 0 true 2>/dev/null; then
		idle=(chrt --idle 0)
	fi
	rc=0
	"${idle[@]}" ./scripts/fuzz.sh -t 30s -j 2 >"$tmp/fuzz.log" 2>&1 || rc=$?
	echo "$rc $SECONDS" >"$tmp/fuzz.rc"
}
if [ $# -eq 0 ]; then
	: >bin/go-test.json
	setsid bash -c "$(declare -f fuzz_beside_e2e); tmp=$tmp; SECONDS=$SECONDS; fuzz_beside_e2e" &
	fuzzpid=$!
fi
set +e
# The Cilium lab's tests need Cilium's build (~15 minutes cold), which this
# command does not make: scripts/test-contenders.sh runs them (docs/cilium.md).
# test/e2e's tests that mostly wait (kubelet labs, the soak, the guests)
# run four at a time, longest first, once its others have ended: its own
# scheduler decides (test/e2e/alongside_test.go), so -parallel (64) is above
# their count and never holds one back (the other packages' parallel tests
# bound themselves by the CPUs). It starts last, in ./... order: named
# first, its migration tests ran beside internal/datapath's floods and
# lost requests.
go test -json -race -count=1 -timeout 75m -parallel 64 -skip '^TestPrivilegedCilium' "$@" ./... | tee bin/go-test.json | "$tmp/testreport"
status=("${PIPESTATUS[@]}")
: >"$tmp/go-test.done"
set -e
if [ "${status[2]}" -ne 0 ]; then
	exit 1
fi
if [ "${status[0]}" -ne 0 ]; then # a failure the events did not show
	echo "go test exited ${status[0]}; see bin/go-test.json" >&2
	exit 1
fi

if [ -n "$fuzzpid" ]; then
	step "fuzz (every target 30 s, beside test/e2e at idle priority)"
	wait "$fuzzpid" || true
	fuzzpid=
	cat "$tmp/fuzz.log"
	read -r start <"$tmp/fuzz.start"
	read -r rc end <"$tmp/fuzz.rc"
	printf 'fuzz: ran from %d:%02d to %d:%02d of this run\n' $((start / 60)) $((start % 60)) $((end / 60)) $((end % 60))
	if [ "$rc" -ne 0 ]; then
		exit 1
	fi
fi
step "done"
