// SPDX-License-Identifier: GPL-2.0

//! Misc devices whose open files hold their module.
//!
//! `kernel::miscdevice::MiscDeviceRegistration` of Linux 7.2 registers file
//! operations whose `owner` is NULL, so an open file (or a mapping, which
//! holds its file) does not keep the module loaded: `rmmod` succeeds under a
//! user and a later `close`, ioctl or page fault runs freed code. This
//! registration copies the same vtable into its own `file_operations`, sets
//! `owner`, and registers that, so `misc_open()`'s `fops_get()` takes a module
//! reference that `__fput()` drops after `release` returned. It also adds the
//! `uring_cmd` operation ([`MiscUringCmd`]), which the kernel crate's misc
//! device does not offer.

use super::uring_cmd::{self, UringCmd};
use core::{
    marker::PhantomData,
    ptr::{addr_of_mut, NonNull},
};
use kernel::{
    bindings,
    error::to_result,
    ffi::{c_int, c_uint},
    fs::File,
    miscdevice::{MiscDevice, MiscDeviceOptions},
    prelude::*,
    types::{ForeignOwnable, Opaque},
};

/// A misc device that takes io_uring commands (`IORING_OP_URING_CMD`), which
/// `kernel::miscdevice` of Linux 7.2 does not offer.
pub(crate) trait MiscUringCmd: MiscDevice {
    /// Issues `cmd` on `file` (see [`UringCmd`]): `Ok(res)` or `Err` is
    /// posted at once unless the command was queued.
    fn uring_cmd(
        device: <Self::Ptr as ForeignOwnable>::Borrowed<'_>,
        file: &File,
        cmd: &mut UringCmd,
    ) -> Result<i32>;
}

/// # Safety
///
/// `ioucmd` is a command io_uring issues on a file of an
/// [`OwnedMiscDevice<T>`].
unsafe extern "C" fn uring_cmd_op<T: MiscUringCmd>(
    ioucmd: *mut bindings::io_uring_cmd,
    issue_flags: c_uint,
) -> c_int {
    let Some(raw) = NonNull::new(ioucmd) else {
        return -(bindings::EINVAL as c_int);
    };
    // SAFETY: issued to us now; the result below follows `queued`.
    let mut cmd = unsafe { UringCmd::from_raw(raw, issue_flags) };
    let file = cmd.file_raw();
    // SAFETY: the command's file is one of our misc device's, open for the
    // duration of the command (io_uring holds it), so its private data is
    // the `T::Ptr` that `open` returned and `release` has not run.
    let device = unsafe { <T::Ptr as ForeignOwnable>::borrow((*file).private_data) };
    // SAFETY: the file is valid for the duration of this call, with no
    // fdget_pos region on this thread.
    let file = unsafe { File::from_raw_file(file) };
    let r = T::uring_cmd(device, file, &mut cmd);
    uring_cmd::issue_result(&cmd, r)
}

/// A registered misc device whose file operations are owned by a module.
///
/// # Invariants
///
/// `misc` is a `struct miscdevice` registered with `misc_register()` whose
/// `fops` points at `fops`, a copy of `kernel::miscdevice`'s vtable for `T`
/// with `owner` set; both stay at their address (pinned) until `Drop`
/// deregistered the device.
#[pin_data(PinnedDrop)]
pub(crate) struct OwnedMiscDevice<T: MiscUringCmd> {
    #[pin]
    misc: Opaque<bindings::miscdevice>,
    #[pin]
    fops: Opaque<bindings::file_operations>,
    _t: PhantomData<T>,
}

// SAFETY: `misc_deregister` may run on another thread than `misc_register`.
unsafe impl<T: MiscUringCmd> Send for OwnedMiscDevice<T> {}
// SAFETY: no `&self` method touches the C structs.
unsafe impl<T: MiscUringCmd> Sync for OwnedMiscDevice<T> {}

impl<T: MiscUringCmd> OwnedMiscDevice<T> {
    /// Registers a misc device for `T` whose files hold `module`.
    pub(crate) fn register(
        opts: MiscDeviceOptions,
        module: &'static ThisModule,
    ) -> impl PinInit<Self, Error> {
        let init = move |slot: *mut Self| {
            let raw = opts.into_raw::<T>();
            // SAFETY: `slot` is valid for writes (pin-init contract); the
            // fields are written before any use. `raw.fops` points at the
            // kernel crate's static vtable for `T`, which is only read.
            unsafe {
                let fops = addr_of_mut!((*slot).fops).cast::<bindings::file_operations>();
                fops.write(core::ptr::read(raw.fops));
                (*fops).owner = module.as_ptr();
                (*fops).uring_cmd = Some(uring_cmd_op::<T>);
                let misc = addr_of_mut!((*slot).misc).cast::<bindings::miscdevice>();
                misc.write(raw);
                (*misc).fops = fops;
                // INVARIANT: registered with the owned vtable; on error the
                // slot is simply abandoned (nothing was registered).
                to_result(bindings::misc_register(misc))
            }
        };
        // SAFETY: the closure initialises every field (`_t` is a ZST) or
        // returns an error having registered nothing; the memory is pinned
        // by the caller, and `Drop` deregisters before it goes.
        unsafe { pin_init::pin_init_from_closure(init) }
    }
}

#[pinned_drop]
impl<T: MiscUringCmd> PinnedDrop for OwnedMiscDevice<T> {
    fn drop(self: Pin<&mut Self>) {
        // SAFETY: registered by the type invariant; deregistered once, here.
        unsafe { bindings::misc_deregister(self.misc.get()) };
    }
}
