// SPDX-License-Identifier: GPL-2.0
//! Asynchronous READ and WRITE through io_uring from Rust (in the test VM,
//! module loaded, root).
//!
//! Device memory these tests write is restored before they end, so the
//! host's byte checks of the C suites' records still hold.

mod common;

use common::{gpu, namespace};
use p2pdirect::{fill, uring::Ring, Device, Io, Memory};
use std::os::fd::AsRawFd;

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;

/// READ number `i` of a run of `size`-byte READs of `ns` from `file_base`
/// on, into consecutive pieces of `m` from its start.
fn nth_read(ns: &std::fs::File, m: &p2pdirect::Mapping, i: u64, size: u64, file_base: u64) -> Io {
    Io {
        fd: ns.as_raw_fd(),
        memory: Memory::Pointer(m.as_ptr()),
        size,
        file_offset: file_base + i * size,
        buf_offset: i * size,
        compat: false,
    }
}

/// 16 READs of 64 KiB of NSID 1 in flight at once, from one thread, then
/// the same MiB once more through the ioctl: the same bytes, all by P2P.
#[test]
fn queue_depth_16_reads_match_the_namespace() {
    let dev = Device::open().unwrap();
    let a = common::alloc(&dev, gpu(&dev).index, 2 * MIB);
    let m = dev.map(&a).unwrap();
    let mut saved = vec![0u8; m.len()];
    m.read(0, &mut saved).unwrap();
    let ns = namespace(1, false);
    let mut ring = Ring::new(&dev, 32).unwrap();
    for i in 0..16u64 {
        ring.push(false, &nth_read(&ns, &m, i, 64 * KIB, 5 * MIB), i)
            .unwrap();
    }
    assert_eq!(ring.submit().unwrap(), 16);
    let mut done = ring.wait(16).unwrap();
    done.sort_by_key(|c| c.user_data);
    for (i, c) in done.iter().enumerate() {
        assert_eq!(c.user_data, i as u64);
        assert_eq!(c.bytes().unwrap(), 64 * KIB, "command {i}");
        assert_eq!((c.p2p_bytes, c.bounce_bytes), (64 * KIB, 0));
    }
    let (mut got, mut want) = (vec![0u8; MIB as usize], vec![0u8; MIB as usize]);
    m.read(0, &mut got).unwrap();
    fill(&mut want, 5 * MIB, 1);
    assert!(got == want, "device memory differs from the namespace");
    m.write(0, &saved).unwrap();
}

/// Bad input comes back as the CQE's errno, as the ioctls give it.
#[test]
fn errors_come_back_in_completions() {
    let dev = Device::open().unwrap();
    let a = common::alloc(&dev, gpu(&dev).index, 2 * MIB);
    let m = dev.map(&a).unwrap();
    let ns = namespace(1, false);
    let ram = vec![0u8; 2 * 4096];
    let base = Io {
        fd: ns.as_raw_fd(),
        memory: Memory::Pointer(m.as_ptr()),
        size: 4096,
        file_offset: 0,
        buf_offset: 0,
        compat: false,
    };
    let cases = [
        (Io { size: 0, ..base }, libc::EINVAL),
        (Io { size: 100, ..base }, libc::EINVAL),
        (Io { fd: -1, ..base }, libc::EBADF),
        (
            Io {
                memory: Memory::Pointer(
                    ram.as_ptr()
                        .wrapping_add(4096 - ram.as_ptr() as usize % 4096),
                ),
                ..base
            },
            libc::ENXIO,
        ),
        (
            Io {
                memory: Memory::Registered(999_999),
                ..base
            },
            libc::ENOENT,
        ),
    ];
    let mut ring = Ring::new(&dev, 8).unwrap();
    for (i, (io, _)) in cases.iter().enumerate() {
        ring.push(false, io, i as u64).unwrap();
    }
    ring.submit().unwrap();
    let done = ring.wait(cases.len()).unwrap();
    for c in done {
        let want = cases[c.user_data as usize].1;
        assert_eq!(c.result, Err(want), "case {}", c.user_data);
    }
}

/// `wait(n)` hands out exactly `n` completions and keeps the others for the
/// next call; it refuses to wait for more than are pending (it would wait
/// forever). Before, `wait(4)` returned all 16 when they were ready, and a
/// `wait(12)` after it waited forever.
#[test]
fn wait_returns_exactly_what_was_asked() {
    let dev = Device::open().unwrap();
    let a = common::alloc(&dev, gpu(&dev).index, 2 * MIB);
    let m = dev.map(&a).unwrap();
    let mut saved = vec![0u8; 64 * KIB as usize];
    m.read(0, &mut saved).unwrap();
    let ns = namespace(1, false);
    let mut ring = Ring::new(&dev, 32).unwrap();
    for i in 0..16u64 {
        ring.push(false, &nth_read(&ns, &m, i, 4 * KIB, 5 * MIB), i)
            .unwrap();
    }
    assert_eq!(ring.pending(), 16);
    assert_eq!(ring.submit().unwrap(), 16);
    // Let all 16 complete, so that the ring holds more than is asked for.
    ring.submit_and_wait(16).unwrap();
    let first = ring.wait(4).unwrap();
    assert_eq!(first.len(), 4);
    assert_eq!(ring.pending(), 12);
    let e = ring.wait(13).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput, "{e}");
    let rest = ring.wait(12).unwrap();
    assert_eq!(rest.len(), 12);
    assert_eq!(ring.pending(), 0);
    let mut ids: Vec<u64> = first.iter().chain(&rest).map(|c| c.user_data).collect();
    ids.sort_unstable();
    assert_eq!(ids, (0..16).collect::<Vec<_>>());
    assert!(first.iter().chain(&rest).all(|c| c.result == Ok(4 * KIB)));
    assert!(ring.completions().is_empty());
    drop(ring);
    m.write(0, &saved).unwrap();
}

/// Dropping a ring waits for what it submitted: those READs' bytes are in
/// device memory when the drop returns; what was only pushed never runs.
/// (A guard: before, the drop did not wait, but these READs usually ended
/// before the check anyway, so it did not fail reliably.)
#[test]
fn dropping_the_ring_waits_for_its_commands() {
    let dev = Device::open().unwrap();
    let a = common::alloc(&dev, gpu(&dev).index, 2 * MIB);
    let m = dev.map(&a).unwrap();
    let mut saved = vec![0u8; MIB as usize];
    m.read(0, &mut saved).unwrap();
    m.write(0, &vec![0u8; MIB as usize]).unwrap();
    let ns = namespace(1, false);
    let mut ring = Ring::new(&dev, 32).unwrap();
    for i in 0..16u64 {
        ring.push(false, &nth_read(&ns, &m, i, 64 * KIB, 7 * MIB), i)
            .unwrap();
        // The first half submitted, the second only pushed.
        if i == 7 {
            ring.submit().unwrap();
        }
    }
    drop(ring);
    let (mut got, mut want) = (vec![0u8; MIB as usize], vec![0u8; MIB as usize]);
    m.read(0, &mut got).unwrap();
    fill(&mut want[..MIB as usize / 2], 7 * MIB, 1);
    assert!(
        got == want,
        "device memory is not the submitted half's bytes after the drop"
    );
    m.write(0, &saved).unwrap();
}

/// A full submission queue refuses the command (kind `WouldBlock`, saying
/// why), queues nothing, and takes it once what was pushed is submitted.
#[test]
fn a_full_submission_queue_says_so() {
    let dev = Device::open().unwrap();
    let a = common::alloc(&dev, gpu(&dev).index, MIB);
    let m = dev.map(&a).unwrap();
    let mut saved = vec![0u8; 20 * KIB as usize];
    m.read(0, &mut saved).unwrap();
    let ns = namespace(1, false);
    let mut ring = Ring::new(&dev, 4).unwrap();
    for i in 0..4u64 {
        ring.push(false, &nth_read(&ns, &m, i, 4 * KIB, 5 * MIB), i)
            .unwrap();
    }
    let fifth = nth_read(&ns, &m, 4, 4 * KIB, 5 * MIB);
    let e = ring.push(false, &fifth, 4).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::WouldBlock, "{e}");
    assert!(e.to_string().contains("submission queue is full"), "{e}");
    assert_eq!(ring.pending(), 4);
    assert_eq!(ring.submit().unwrap(), 4);
    ring.push(false, &fifth, 4).unwrap();
    let mut ids: Vec<u64> = ring.wait(5).unwrap().iter().map(|c| c.user_data).collect();
    ids.sort_unstable();
    assert_eq!(ids, (0..5).collect::<Vec<_>>());
    let (mut got, mut want) = (vec![0u8; 20 * KIB as usize], vec![0u8; 20 * KIB as usize]);
    m.read(0, &mut got).unwrap();
    fill(&mut want, 5 * MIB, 1);
    assert!(
        got == want,
        "the five READs did not bring the namespace's bytes"
    );
    drop(ring);
    m.write(0, &saved).unwrap();
}

/// A READ of a file whose first 64 KiB are a hole: the completion counts
/// those bytes as zeroed, the rest as P2P, and device memory holds zeros
/// then the file's data.
#[test]
fn a_files_hole_comes_back_as_zeroed_bytes() {
    use std::os::unix::fs::{FileExt, OpenOptionsExt};
    let path = "/mnt/xfs/rust-uring-hole.bin";
    let data = vec![0x5au8; 64 * KIB as usize];
    {
        let f = std::fs::File::create(path).unwrap();
        f.write_all_at(&data, 64 * KIB).unwrap();
        f.sync_all().unwrap();
    }
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
        .unwrap();
    let dev = Device::open().unwrap();
    let a = common::alloc(&dev, gpu(&dev).index, MIB);
    let m = dev.map(&a).unwrap();
    let mut saved = vec![0u8; 128 * KIB as usize];
    m.read(0, &mut saved).unwrap();
    m.write(0, &vec![0xffu8; 128 * KIB as usize]).unwrap();
    let mut ring = Ring::new(&dev, 4).unwrap();
    let io = Io {
        fd: file.as_raw_fd(),
        memory: Memory::Pointer(m.as_ptr()),
        size: 128 * KIB,
        file_offset: 0,
        buf_offset: 0,
        compat: false,
    };
    ring.push(false, &io, 7).unwrap();
    let c = ring.wait(1).unwrap()[0];
    assert_eq!(c.result, Ok(128 * KIB), "{c:?}");
    assert_eq!(
        (c.p2p_bytes, c.bounce_bytes, c.zeroed_bytes),
        (64 * KIB, 0, 64 * KIB),
        "{c:?}"
    );
    let mut got = vec![0u8; 128 * KIB as usize];
    m.read(0, &mut got).unwrap();
    assert!(
        got[..64 * KIB as usize].iter().all(|&b| b == 0),
        "the hole is not zeros"
    );
    assert!(
        got[64 * KIB as usize..] == data[..],
        "the data is not the file's"
    );
    drop(ring);
    m.write(0, &saved).unwrap();
    std::fs::remove_file(path).unwrap();
}
