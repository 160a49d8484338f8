// SPDX-License-Identifier: GPL-2.0

//! The ABI as the module sees it: generated at build time by bindgen from
//! include/uapi/linux/p2pdirect.h (see Kbuild), so it cannot drift from the
//! header. Only `ioctl.rs` (and the io_uring entry beside it) reads and
//! writes these structs; other modules use its constants. bindgen's layout asserts check every size and offset at compile
//! time, and `--clang-macro-fallback` evaluates the `_IOWR()` command numbers
//! with clang.

#![allow(non_camel_case_types, dead_code, unreachable_pub, clippy::all)]

include!("../ffi/uapi_generated.rs");

/// Marks UAPI structs as plain bytes for `copy_from_user`/`copy_to_user`.
macro_rules! uapi_pod {
    ($($t:ty),* $(,)?) => {$(
        // SAFETY: every UAPI struct is `#[repr(C)]` of fixed-width integers and
        // arrays of them (the header allows no pointers, enums or bitfields), so
        // every bit pattern is valid; explicit `pad` fields leave no implicit
        // padding (sizes are checked against clang's by bindgen's asserts, and
        // `no_padding` below), so all bytes are initialised.
        unsafe impl kernel::transmute::FromBytes for $t {}
        // SAFETY: as above.
        unsafe impl kernel::transmute::AsBytes for $t {}
    )*};
}

uapi_pod!(
    p2pdirect_version,
    p2pdirect_client_info,
    p2pdirect_provider_info,
    p2pdirect_list_providers,
    p2pdirect_alloc,
    p2pdirect_free,
    p2pdirect_dma_seg,
    p2pdirect_dma_probe,
    p2pdirect_register,
    p2pdirect_reg_id,
    p2pdirect_io,
    p2pdirect_stat,
    p2pdirect_stats,
    p2pdirect_uring_io,
    p2pdirect_export_dmabuf,
);

// No implicit padding: each size is the sum of its fields.
const _: () = {
    use core::mem::size_of;
    assert!(size_of::<p2pdirect_version>() == 4 + 4 + 32);
    assert!(size_of::<p2pdirect_client_info>() == 4 + 4);
    assert!(size_of::<p2pdirect_provider_info>() == 4 * 4 + 5 * 8 + 2 * 4 + 16 * 8);
    assert!(size_of::<p2pdirect_list_providers>() == 8 + 4 + 4);
    assert!(size_of::<p2pdirect_alloc>() == 4 + 4 + 6 * 8);
    assert!(size_of::<p2pdirect_free>() == 8);
    assert!(size_of::<p2pdirect_dma_seg>() == 16);
    assert!(size_of::<p2pdirect_dma_probe>() == 8 + 8 + 4 + 4 + 8 + 6 * 4);
    assert!(size_of::<p2pdirect_register>() == 8 + 8 + 4 + 4 + 8);
    assert!(size_of::<p2pdirect_reg_id>() == 8 + 4 + 4);
    assert!(size_of::<p2pdirect_io>() == 4 + 4 + 8 * 8 + 4 + 4);
    assert!(size_of::<p2pdirect_stat>() == 4 + 4 + 12 * 8);
    assert!(size_of::<p2pdirect_stats>() == 8 + 4 * 4);
    assert!(size_of::<p2pdirect_export_dmabuf>() == 3 * 8 + 4 + 4);
    assert!(size_of::<p2pdirect_uring_io>() == 4 + 4 + 4 * 8);
};
