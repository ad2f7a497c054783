# sluice's image: sluice-agent (the DaemonSet's entrypoint), the sluice CLI
# and sluice-dns-autoscaler, on Debian slim (not sluice-lab, the lab's CLI).
#
#   docker build -t REGISTRY/sluice:TAG .
#
# deploy/charts/sluice runs it (image.repository, image.tag). The BPF objects
# are compiled from bpf/ here with clang-19, as `go generate` does in a
# checkout; scripts/check-generate.sh keeps the committed ones equal to them.
# linux/amd64 only: the generate directives include the x86_64 headers.

ARG GO_VERSION=1.26
ARG DEBIAN=bookworm

FROM golang:${GO_VERSION}-${DEBIAN} AS build
RUN apt-get update \
	&& apt-get install -y --no-install-recommends clang-19 llvm-19 libbpf-dev linux-libc-dev \
	&& rm -rf /var/lib/apt/lists/*
WORKDIR /src
# go.mod's go line names the exact toolchain; an older image fetches it.
ENV GOTOOLCHAIN=auto
COPY go.mod go.sum ./
RUN go mod download
COPY . .
# Static binaries: nothing in the runtime image has to match the builder's libc.
ENV CGO_ENABLED=0
RUN go generate ./internal/datapath/... ./internal/bench/... \
	&& ./scripts/build.sh

FROM debian:${DEBIAN}-slim
# The chart's bpffs init container needs only sh, stat and mount, which the
# base image has. iptables, nftables and conntrack are for `sluice
# cleanup-kube-proxy` (deploy/migrate/cleanup-kube-proxy.yaml).
RUN apt-get update \
	&& apt-get install -y --no-install-recommends iptables nftables conntrack \
	&& rm -rf /var/lib/apt/lists/*
# The lab's CLI (bin/sluice-lab) stays out: nothing of the lab runs on a node.
COPY --from=build /src/bin/sluice /src/bin/sluice-agent /src/bin/sluice-dns-autoscaler /usr/local/bin/
ENTRYPOINT ["/usr/local/bin/sluice-agent"]
