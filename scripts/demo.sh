#!/usr/bin/env bash
# The main job: a 2-node lab with sample Services, traffic through each, and
# Service VIP vs pod IP latency. Installs what it needs first.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/deps.sh
./scripts/build.sh
exec ./bin/sluice lab demo "$@"
