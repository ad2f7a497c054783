package datapath

// The per-packet east-west program for pod veths (tc_pod.c): lib/nodeport.h
// built with SLUICE_POD_LB, over the same pinned maps as tc_lb.c.
//go:generate go tool bpf2go -cc clang-19 -strip llvm-strip-19 -no-global-types -cflags "-O2 -g -Wall -Werror" -target bpfel tcpod ../../bpf/tc_pod.c -- -I../../bpf/lib -I/usr/include/x86_64-linux-gnu
