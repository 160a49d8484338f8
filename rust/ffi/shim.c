// SPDX-License-Identifier: GPL-2.0
/*
 * C shim of p2pdirect: the C APIs the kernel's Rust crate does not bind
 * (static inline functions, headers outside its bindings). Called only from
 * rust/ffi.rs, which declares these prototypes by hand.
 */
#include <linux/ratelimit.h>

static DEFINE_RATELIMIT_STATE(p2pdirect_rs, 5 * HZ, 10);

bool p2pdirect_ratelimit(void)
{
	return __ratelimit(&p2pdirect_rs);
}
