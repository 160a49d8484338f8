// SPDX-License-Identifier: GPL-2.0

//! Module-global mutexes whose initialisation is safe: a token type that
//! initialises the lock at most once (an atomic flag guards the kernel
//! crate's unsafe `init`) and frees the value's buffers when dropped, since
//! statics are never dropped.
//!
//! The module struct holds each token, so the setup order of module init
//! is the order the globals come up in.

/// Declares a global `Mutex`, an accessor that locks it, and the token that
/// initialises it and empties it again.
///
/// ```ignore
/// global_mutex! {
///     static TABLE: Table = Table::new();
///     /// The table's global.
///     pub(crate) struct Globals;
///     /// The table (a leaf lock).
///     pub(crate) fn table;
/// }
/// ```
macro_rules! global_mutex {
    (
        static $name:ident: $ty:ty = $init:expr;
        $(#[$tmeta:meta])* $tvis:vis struct $token:ident;
        $(#[$ameta:meta])* $avis:vis fn $acc:ident;
    ) => {
        kernel::sync::global_lock! {
            // SAFETY: only `$token::init` calls `init`, and its flag lets
            // that happen once. It runs before the first lock: the crate
            // root sets every token up first in module init, before it
            // registers anything (driver, misc device, notifier) through
            // which the accessor can be reached.
            $avis unsafe(uninit) static $name: Mutex<$ty> = $init;
        }

        $(#[$ameta])*
        $avis fn $acc() -> kernel::sync::GlobalGuard<$name> {
            $name.lock()
        }

        $(#[$tmeta])*
        $tvis struct $token(());

        impl $token {
            /// Initialises the global; `EBUSY` if it already was.
            $tvis fn init() -> Result<Self> {
                static DONE: core::sync::atomic::AtomicBool =
                    core::sync::atomic::AtomicBool::new(false);
                if DONE.swap(true, core::sync::atomic::Ordering::AcqRel) {
                    return Err(EBUSY);
                }
                // SAFETY: the flag above lets this call happen once.
                unsafe { $name.init() };
                Ok(Self(()))
            }
        }

        impl Drop for $token {
            // `$init` is whatever the global starts as; not every value type
            // has a `Default`, so `take` does not fit every invocation.
            #[allow(clippy::mem_replace_with_default, clippy::mem_replace_option_with_none)]
            fn drop(&mut self) {
                // Statics are never dropped: free the value's buffers here,
                // after the lock is let go (a value's destructor may take
                // it again, as a graveyard's entries reaping do).
                let old = core::mem::replace(&mut *$name.lock(), $init);
                drop(old);
            }
        }
    };
}

pub(crate) use global_mutex;
