// SPDX-License-Identifier: GPL-2.0

//! The module's message rate limit: one `DEFINE_RATELIMIT_STATE` (a macro,
//! so it lives in the shim) shared by every refusal message.

/// Whether a rate-limited message may be printed now (10 per 5 s).
pub(crate) fn allow() -> bool {
    // SAFETY: takes no arguments and only touches the shim's static
    // ratelimit state, which `__ratelimit` locks itself.
    unsafe { super::c::p2pdirect_ratelimit() }
}
