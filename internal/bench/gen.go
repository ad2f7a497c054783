package bench

// The helper programs of the pps benchmark (bpf/bench/pps.c). The generated
// files are committed; scripts/check-generate.sh fails when regenerating
// them gives a diff.
//go:generate go tool bpf2go -cc clang-19 -strip llvm-strip-19 -no-global-types -cflags "-O2 -g -Wall -Werror" -target bpfel pps ../../bpf/bench/pps.c -- -I../../bpf/lib -I/usr/include/x86_64-linux-gnu
