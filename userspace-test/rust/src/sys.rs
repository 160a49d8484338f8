// SPDX-License-Identifier: GPL-2.0
//! Raw ABI of /dev/p2pdirect, generated from the UAPI header at build time.

#![allow(
    non_camel_case_types,
    non_upper_case_globals,
    dead_code,
    missing_docs,
    clippy::all
)]

include!(concat!(env!("OUT_DIR"), "/uapi.rs"));
