package datapath

// The generated socklb_bpfel.go and socklb_bpfel.o are committed;
// scripts/check-generate.sh fails when regenerating them gives a diff.
//go:generate go tool bpf2go -cc clang-19 -strip llvm-strip-19 -no-global-types -cflags "-O2 -g -Wall -Werror" -target bpfel socklb ../../bpf/sock_lb.c -- -I../../bpf/lib -I/usr/include/x86_64-linux-gnu

// The UDP socket destroyer (bpf/sock_destroy.c), loaded apart: its kfunc
// needs 6.5.
//go:generate go tool bpf2go -cc clang-19 -strip llvm-strip-19 -no-global-types -cflags "-O2 -g -Wall -Werror" -target bpfel sockdestroy ../../bpf/sock_destroy.c -- -I../../bpf/lib -I/usr/include/x86_64-linux-gnu
