#!/usr/bin/env bash
# Regenerates the bpf2go output (Go bindings and BPF objects) and fails when
# it differs from what is committed: the committed objects must be exactly
# what the committed C sources compile to.
set -euo pipefail
cd "$(dirname "$0")/.."
export GOTOOLCHAIN=auto

go generate ./internal/datapath/...
go generate ./internal/bench/...
go generate ./internal/bandwidth/...

generated=(':(glob)internal/datapath/*_bpfe[lb].*' ':(glob)internal/bench/*_bpfe[lb].*' ':(glob)internal/bandwidth/*_bpfe[lb].*')
if ! git diff --exit-code --stat -- "${generated[@]}"; then
	echo "check-generate: regenerated BPF output differs from the committed files;" >&2
	echo "run 'go generate ./internal/datapath/... ./internal/bench/... ./internal/bandwidth/...' and commit the result" >&2
	exit 1
fi
untracked=$(git ls-files --others --exclude-standard -- internal/datapath internal/bench internal/bandwidth | grep -E '_bpfe[lb]\.(go|o)$' || true)
if [ -n "$untracked" ]; then
	echo "check-generate: generated files not committed:" >&2
	echo "$untracked" >&2
	exit 1
fi
echo "check-generate: BPF output up to date"
