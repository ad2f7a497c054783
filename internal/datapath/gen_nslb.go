package datapath

// The north-south programs: tc_lb.c and xdp_lb.c share lib/nodeport.h and
// the pinned maps. Their generated files are committed like socklb's.
//go:generate go tool bpf2go -cc clang-19 -strip llvm-strip-19 -no-global-types -cflags "-O2 -g -Wall -Werror" -target bpfel tclb ../../bpf/tc_lb.c -- -I../../bpf/lib -I/usr/include/x86_64-linux-gnu
//go:generate go tool bpf2go -cc clang-19 -strip llvm-strip-19 -no-global-types -cflags "-O2 -g -Wall -Werror" -target bpfel xdplb ../../bpf/xdp_lb.c -- -I../../bpf/lib -I/usr/include/x86_64-linux-gnu
//go:generate go tool bpf2go -cc clang-19 -strip llvm-strip-19 -no-global-types -cflags "-O2 -g -Wall -Werror" -target bpfel xdpvlan ../../bpf/xdp_vlan.c -- -I../../bpf/lib -I/usr/include/x86_64-linux-gnu
