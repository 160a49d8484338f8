// SPDX-License-Identifier: GPL-2.0

//! The ABI as the module sees it: generated at build time by bindgen from
//! include/uapi/linux/p2pdirect.h (see Kbuild), so it cannot drift from the
//! header. bindgen's layout asserts check every size and offset at compile
//! time, and `--clang-macro-fallback` evaluates the `_IOWR()` command numbers
//! with clang.

#![allow(non_camel_case_types, dead_code, unreachable_pub, clippy::all)]

include!("uapi_generated.rs");

// SAFETY: `p2pdirect_version` is `#[repr(C)]` of `u32`s and a `c_char` array:
// every bit pattern is a valid value, and there is no padding (size 40 =
// 4 + 4 + 32, checked by bindgen's layout assert), so all bytes are initialised.
unsafe impl kernel::transmute::FromBytes for p2pdirect_version {}
// SAFETY: as above; no padding, no pointers, no interior mutability.
unsafe impl kernel::transmute::AsBytes for p2pdirect_version {}
