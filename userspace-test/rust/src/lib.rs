// SPDX-License-Identifier: GPL-2.0
//! Safe userspace API of p2pdirect's `/dev/p2pdirect`.

use std::{
    ffi::CStr,
    fmt,
    fs::OpenOptions,
    io,
    os::fd::{AsRawFd, OwnedFd},
    os::unix::fs::OpenOptionsExt,
    path::Path,
};

pub mod sys;

/// Where the module's misc device appears.
pub const DEVICE_PATH: &str = "/dev/p2pdirect";

/// ABI and module version reported by the running module.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Version {
    pub abi_major: u32,
    pub abi_minor: u32,
    pub module: String,
}

impl Version {
    /// Whether a library built against this header can talk to that module:
    /// same major, and the module's minor at least ours.
    // ABI minor 0 makes the second comparison trivially true today; the rule is for later minors.
    #[allow(clippy::absurd_extreme_comparisons)]
    pub fn is_compatible(&self) -> bool {
        self.abi_major == sys::P2PDIRECT_ABI_MAJOR && self.abi_minor >= sys::P2PDIRECT_ABI_MINOR
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "p2pdirect {} (ABI {}.{})",
            self.module, self.abi_major, self.abi_minor
        )
    }
}

/// An open `/dev/p2pdirect`.
#[derive(Debug)]
pub struct Device {
    fd: OwnedFd,
}

impl Device {
    /// Opens `/dev/p2pdirect`.
    pub fn open() -> io::Result<Self> {
        Self::open_path(DEVICE_PATH)
    }

    /// Opens the misc device at `path`.
    pub fn open_path(path: impl AsRef<Path>) -> io::Result<Self> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_CLOEXEC)
            .open(path)?;
        Ok(Self { fd: file.into() })
    }

    /// `P2PDIRECT_IOC_GET_VERSION`.
    pub fn version(&self) -> io::Result<Version> {
        let mut v = sys::p2pdirect_version::default();
        // SAFETY: GET_VERSION writes exactly one `p2pdirect_version`, which `v` is.
        unsafe {
            self.ioctl_raw(
                sys::P2PDIRECT_IOC_GET_VERSION.into(),
                std::ptr::from_mut(&mut v).cast(),
            )
        }?;
        // The module NUL-terminates inside the field; refuse a reply that is not.
        let bytes: Vec<u8> = v.module_version.iter().map(|&c| c as u8).collect();
        let module = CStr::from_bytes_until_nul(&bytes)
            .map_err(|_| {
                io::Error::new(io::ErrorKind::InvalidData, "module version not terminated")
            })?
            .to_string_lossy()
            .into_owned();
        Ok(Version {
            abi_major: v.abi_major,
            abi_minor: v.abi_minor,
            module,
        })
    }

    /// Issues an arbitrary ioctl on the device; the errno comes back as the error.
    ///
    /// # Safety
    /// `arg` must be valid for whatever the command `cmd` reads and writes, as
    /// the kernel would for a well-formed call, or be deliberately invalid (the
    /// kernel then fails with `EFAULT` without touching process memory).
    pub unsafe fn ioctl_raw(&self, cmd: libc::c_ulong, arg: *mut libc::c_void) -> io::Result<i32> {
        // SAFETY: the fd is open for the lifetime of `self`; the caller vouches for `arg`.
        let rc = unsafe { libc::ioctl(self.fd.as_raw_fd(), cmd, arg) };
        if rc < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(rc)
        }
    }
}

/// Builds an ioctl number the way `<asm-generic/ioctl.h>` does.
pub const fn ioc(dir: u32, ty: u32, nr: u32, size: u32) -> libc::c_ulong {
    ((dir << 30) | (size << 16) | (ty << 8) | nr) as libc::c_ulong
}
/// `_IOC_READ | _IOC_WRITE`.
pub const IOC_READ_WRITE: u32 = 3;
/// `_IOC_READ`.
pub const IOC_READ: u32 = 2;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ioc_matches_header_numbers() {
        // The header's own number, evaluated by clang, equals what _IOWR builds.
        let size = std::mem::size_of::<sys::p2pdirect_version>() as u32;
        assert_eq!(
            ioc(
                IOC_READ_WRITE,
                sys::P2PDIRECT_IOCTL_MAGIC.into(),
                sys::P2PDIRECT_IOCTL_BASE,
                size
            ),
            sys::P2PDIRECT_IOC_GET_VERSION.into()
        );
    }

    #[test]
    fn compatibility_rule() {
        let mut v = Version {
            abi_major: sys::P2PDIRECT_ABI_MAJOR,
            abi_minor: sys::P2PDIRECT_ABI_MINOR,
            module: "x".into(),
        };
        assert!(v.is_compatible());
        v.abi_major += 1;
        assert!(!v.is_compatible());
    }
}
