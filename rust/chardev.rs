// SPDX-License-Identifier: GPL-2.0

//! `/dev/p2pdirect`: the misc device and its per-open-file state.
//!
//! The node is created by devtmpfs with mode 0600 (root only), the misc core's
//! default; administrators widen it with a udev rule, never the module.

use kernel::{
    fs::File,
    miscdevice::{MiscDevice, MiscDeviceOptions, MiscDeviceRegistration},
    prelude::*,
};

/// The registration the crate root holds.
pub(crate) type Registration = MiscDeviceRegistration<OpenFile>;

/// Registers `/dev/p2pdirect`.
pub(crate) fn register() -> impl PinInit<Registration, Error> {
    MiscDeviceRegistration::register(MiscDeviceOptions { name: c"p2pdirect" })
}

/// State of one open file description of `/dev/p2pdirect`.
///
/// Later rooms hang their per-file objects (allocations, registrations) here,
/// so that close or process exit releases them.
pub(crate) struct OpenFile;

#[vtable]
impl MiscDevice for OpenFile {
    type Ptr = KBox<Self>;

    fn open(_file: &File, _misc: &Registration) -> Result<KBox<Self>> {
        KBox::new(OpenFile, GFP_KERNEL).map_err(Into::into)
    }

    fn ioctl(_me: &OpenFile, _file: &File, cmd: u32, arg: usize) -> Result<isize> {
        crate::ioctl::dispatch(cmd, arg)
    }
}
