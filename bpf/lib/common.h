/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Includes and small helpers shared by every sluice BPF program. */
#ifndef __SLUICE_COMMON_H
#define __SLUICE_COMMON_H

#include <stdbool.h>
#include <linux/bpf.h>
#include <linux/in.h>
#include <linux/errno.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#include "lb_abi.h"

#ifndef __always_inline
#define __always_inline inline __attribute__((always_inline))
#endif /* __always_inline */

/* Keys built on the stack are read as u32 words; keep them word aligned. */
#define __align_stack_8 __attribute__((aligned(8)))

#ifndef READ_ONCE
#define READ_ONCE(x) (*(const volatile typeof(x) *)&(x))
#endif /* READ_ONCE */
#ifndef barrier
#define barrier() asm volatile("" ::: "memory")
/* barrier_var makes var opaque to the compiler: arithmetic on it is not
 * folded into what it was computed from (data_end - data + n would become
 * pointer arithmetic on data_end, which the verifier refuses). */
#define barrier_var(var) asm volatile("" : "+r"(var))
#endif /* barrier */
#ifndef WRITE_ONCE
#define WRITE_ONCE(x, v) (*(volatile typeof(x) *)&(x) = (v))
#endif /* WRITE_ONCE */

#define NSEC_PER_SEC 1000000000ULL

/* Address families for bpf_fib_lookup: libc's <sys/socket.h> is not for the
 * BPF target. */
#ifndef AF_INET
#define AF_INET  2
#define AF_INET6 10
#endif

/* A 16-byte map address, readable as bytes or words. */
union lb_addr {
	__u8  b[16];
	__u32 w[4];
	__u64 d[2];
};

static __always_inline void addr_from_v4(union lb_addr *a, __be32 ip4)
{
	a->w[0] = 0;
	a->w[1] = 0;
	a->w[2] = bpf_htonl(0x0000ffff);
	a->w[3] = ip4;
}

static __always_inline bool addr_is_v4(const union lb_addr *a)
{
	return a->w[0] == 0 && a->w[1] == 0 && a->w[2] == bpf_htonl(0x0000ffff);
}

/* 127.0.0.0/8 (v4-mapped) or ::1. */
static __always_inline bool addr_is_loopback(const union lb_addr *a)
{
	if (addr_is_v4(a))
		return (bpf_ntohl(a->w[3]) >> 24) == 127;
	return a->d[0] == 0 && a->w[2] == 0 && a->w[3] == bpf_htonl(1);
}

/* 0.0.0.0 (v4-mapped) or ::, the bind-to-any address. */
static __always_inline bool addr_is_any(const union lb_addr *a)
{
	if (addr_is_v4(a))
		return a->w[3] == 0;
	return a->d[0] == 0 && a->d[1] == 0;
}

/* The wildcard NodePort key of a's family: ::ffff:0.0.0.0 or ::. */
static __always_inline void addr_to_wildcard(union lb_addr *a)
{
	if (addr_is_v4(a))
		a->w[3] = 0;
	else
		a->d[0] = a->d[1] = 0;
}

/* b is an addr field at offset 0 of a map value, so it is word aligned. */
static __always_inline bool addr_equal(const union lb_addr *a, const __u8 *b)
{
	const __u32 *w = (const __u32 *)b;

	return a->w[0] == w[0] && a->w[1] == w[1] &&
	       a->w[2] == w[2] && a->w[3] == w[3];
}

/* hash_fmix32 is murmur3's finalizer: every input bit affects every output
 * bit, so sequential inputs (cookies, ports) spread evenly. */
static __always_inline __u32 hash_fmix32(__u32 h)
{
	h ^= h >> 16;
	h *= 0x85ebca6b;
	h ^= h >> 13;
	h *= 0xc2b2ae35;
	h ^= h >> 16;
	return h;
}

#endif /* __SLUICE_COMMON_H */
