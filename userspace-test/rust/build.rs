// SPDX-License-Identifier: GPL-2.0
//! Generates the UAPI bindings from include/uapi/linux/p2pdirect.h, the one
//! definition of the ABI, so this crate and the module cannot drift apart.

use std::{env, path::PathBuf};

fn main() {
    let header =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../include/uapi/linux/p2pdirect.h");
    println!("cargo:rerun-if-changed={}", header.display());
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    bindgen::Builder::default()
        .header(header.to_string_lossy())
        .allowlist_item("(p2pdirect|P2PDIRECT).*")
        // Evaluates the _IOWR() command numbers with clang.
        .clang_macro_fallback()
        .clang_macro_fallback_build_dir(&out)
        .derive_default(true)
        .generate_comments(false)
        .generate()
        .expect("bindgen failed on include/uapi/linux/p2pdirect.h")
        .write_to_file(out.join("uapi.rs"))
        .expect("writing uapi.rs");
}
