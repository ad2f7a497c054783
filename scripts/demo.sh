#!/usr/bin/env bash
# The main job: a 2-node lab (node1's agent on native XDP, node2's on tc)
# with sample Services, traffic through each (from a pod through the socket
# LB, from the external client to a NodePort through XDP and through tc),
# Service VIP vs pod IP latency and NodePort XDP vs tc latency. Installs what
# it needs first; the lab is torn down at the end, on failure and on Ctrl-C.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/deps.sh
./scripts/build.sh
exec ./bin/sluice-lab demo "$@"
