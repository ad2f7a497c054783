package bandwidth

// The bandwidth manager's BPF objects: tc_edt.c (stamping and policing on
// devices and Pod veths) and sock_edt.c (BBR, ECN and pacing for Pods'
// sockets), over the maps of lib/edt.h. The generated files are committed;
// scripts/check-generate.sh fails when regenerating them gives a diff.
//go:generate go tool bpf2go -cc clang-19 -strip llvm-strip-19 -no-global-types -cflags "-O2 -g -Wall -Werror" -target bpfel tcedt ../../bpf/tc_edt.c -- -I../../bpf/lib -I/usr/include/x86_64-linux-gnu
//go:generate go tool bpf2go -cc clang-19 -strip llvm-strip-19 -no-global-types -cflags "-O2 -g -Wall -Werror -mcpu=v3" -target bpfel sockedt ../../bpf/sock_edt.c -- -I../../bpf/lib -I/usr/include/x86_64-linux-gnu
