// SPDX-License-Identifier: GPL-2.0
//! `p2pd bench`: gdsio's role. The same workloads over five paths, in one
//! run, on one namespace:
//!
//! - `p2pdirect`: READ/WRITE ioctls on a registered buffer (as gdsio uses
//!   cuFileBufRegister'd buffers), the NVMe DMAs straight into/out of device
//!   memory (an emulated GPU's BAR);
//! - `upstream-p2pmem`: the upstream sysfs path: an mmap of the NVMe's own
//!   published P2P memory (`p2pmem/allocate`, its CMB) and O_DIRECT
//!   pread/pwrite into it;
//! - `odirect-devmem`: O_DIRECT pread/pwrite straight into p2pdirect's
//!   device-memory mapping (the block layer builds the P2P bios itself);
//! - `bounce`: O_DIRECT into host memory plus a CPU copy into (out of) the
//!   device memory mapping: what an application does without P2P;
//! - `buffered`: buffered pread/pwrite plus the CPU copy;
//! - `odirect-ram`: O_DIRECT into host memory, no copy: the device's own
//!   limit, the baseline the throughput target is measured against.
//!
//! and, one thread keeping N I/Os in flight (a queue-depth sweep, `--qd`):
//!
//! - `p2pdirect-uring`: `P2PDIRECT_URING_CMD_READ/WRITE` on a registered
//!   buffer;
//! - `upstream-uring-p2pmem`, `upstream-uring-devmem`: io_uring O_DIRECT
//!   reads/writes (`IORING_OP_READ/WRITE`, non-fixed buffers) into the
//!   sysfs p2pmem mapping and into p2pdirect's device-memory mapping: the
//!   upstream deep-queue path, which pins the pages again on every I/O;
//! - `uring-ram`: the same into host memory, the device's limit.
//!
//! Reports MiB/s, IOPS, mean, p50 and p99 latency, and guest CPU seconds per
//! GiB (all CPUs' busy time from /proc/stat while the run lasts). A run's
//! clock and CPU time cover its I/O only (see [`Window`]).

use crate::cli::{AlignedBuf, Args, Json, Namespace, Progress};
use io_uring::{opcode, types, IoUring};
use p2pdirect::{uring::Ring, Device, Io, Memory};
use std::{
    fs,
    io::Write,
    os::{fd::AsRawFd, unix::fs::FileExt},
    sync::Barrier,
    time::{Duration, Instant},
};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Path {
    P2pdirect,
    Upstream,
    DirectDevmem,
    Bounce,
    Buffered,
    Ram,
    Uring,
    UringP2pmem,
    UringDevmem,
    UringRam,
}

/// The synchronous paths (one I/O per thread at a time).
const PATHS: [Path; 6] = [
    Path::P2pdirect,
    Path::Upstream,
    Path::DirectDevmem,
    Path::Bounce,
    Path::Buffered,
    Path::Ram,
];

/// The io_uring paths (a queue depth per run).
const URING_PATHS: [Path; 4] = [
    Path::Uring,
    Path::UringP2pmem,
    Path::UringDevmem,
    Path::UringRam,
];

/// The queue depths of the sweep when `--qd` does not say.
const QD_SWEEP: [u32; 5] = [1, 4, 16, 32, 64];

/// The most device memory one io_uring run spreads its I/Os over (the
/// slots of a deeper queue share buffers): the p2pmem CMB of the VM's NVMe
/// is 16 MiB.
const URING_BUF_MAX: u64 = 8 << 20;

impl Path {
    fn name(self) -> &'static str {
        match self {
            Path::P2pdirect => "p2pdirect",
            Path::Upstream => "upstream-p2pmem",
            Path::DirectDevmem => "odirect-devmem",
            Path::Bounce => "bounce",
            Path::Buffered => "buffered",
            Path::Ram => "odirect-ram",
            Path::Uring => "p2pdirect-uring",
            Path::UringP2pmem => "upstream-uring-p2pmem",
            Path::UringDevmem => "upstream-uring-devmem",
            Path::UringRam => "uring-ram",
        }
    }

    fn uring(self) -> bool {
        URING_PATHS.contains(&self)
    }
}

#[derive(Clone, Debug)]
struct Workload {
    write: bool,
    random: bool,
    bs: u64,
    threads: usize,
    /// I/Os in flight (io_uring paths), 0 for the synchronous ones.
    qd: u32,
}

impl Workload {
    fn name(&self) -> String {
        let bs = if self.bs >= 1 << 20 {
            format!("{}M", self.bs >> 20)
        } else {
            format!("{}K", self.bs >> 10)
        };
        format!(
            "{}-{}-{}{}{}",
            if self.random { "rand" } else { "seq" },
            if self.write { "write" } else { "read" },
            bs,
            if self.threads > 1 {
                format!("-t{}", self.threads)
            } else {
                String::new()
            },
            if self.qd > 0 {
                format!("-qd{}", self.qd)
            } else {
                String::new()
            }
        )
    }
}

/// What one worker did: its I/Os, their latencies, and (io_uring) how
/// many `io_uring_enter` calls waited for completions.
struct Worked {
    ops: u64,
    lat: Vec<f32>,
    waits: u64,
}

/// One measured (path, workload).
struct Res {
    path: Path,
    wl: Workload,
    ops: u64,
    bytes: u64,
    secs: f64,
    cpu_s: f64,
    lat_us: Vec<f32>,
    /// io_uring runs: the `io_uring_enter` calls that waited (0 for the
    /// synchronous paths).
    waits: u64,
    error: Option<String>,
}

impl Res {
    /// io_uring runs: completions reaped per `io_uring_enter` that waited
    /// for one (the queue depth when the device completes a whole queue
    /// at once).
    fn per_wait(&self) -> Option<f64> {
        (self.waits > 0).then(|| self.ops as f64 / self.waits as f64)
    }
    fn mib_s(&self) -> f64 {
        self.bytes as f64 / 1048576.0 / self.secs.max(1e-9)
    }
    fn iops(&self) -> f64 {
        self.ops as f64 / self.secs.max(1e-9)
    }
    fn mean_us(&self) -> f64 {
        if self.lat_us.is_empty() {
            return 0.0;
        }
        self.lat_us.iter().map(|&x| x as f64).sum::<f64>() / self.lat_us.len() as f64
    }
    fn pct_us(&self, pct: usize) -> f64 {
        let mut v = self.lat_us.clone();
        if v.is_empty() {
            return 0.0;
        }
        v.sort_by(f32::total_cmp);
        v[(v.len() * pct / 100).min(v.len() - 1)] as f64
    }
    fn p50_us(&self) -> f64 {
        self.pct_us(50)
    }
    fn p99_us(&self) -> f64 {
        self.pct_us(99)
    }
    fn cpu_s_per_gib(&self) -> f64 {
        if self.bytes == 0 {
            return 0.0;
        }
        self.cpu_s / (self.bytes as f64 / (1u64 << 30) as f64)
    }
}

/// All CPUs' busy time so far, in seconds (USER_HZ = 100).
fn cpu_busy_s() -> f64 {
    let stat = fs::read_to_string("/proc/stat").unwrap_or_default();
    let Some(line) = stat.lines().next() else {
        return 0.0;
    };
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal
    let busy: u64 = [0, 1, 2, 5, 6, 7].iter().filter_map(|&i| v.get(i)).sum();
    busy as f64 / 100.0
}

/// What every worker of a run shares.
struct Ctx<'a> {
    dev: &'a Device,
    ns: &'a Namespace,
    gpu: u32,
    /// The namespace's controller's p2pmem/allocate, if it publishes P2P memory.
    p2pmem: Option<String>,
    /// Reads use [base, base + span), writes [base + span, base + 2 * span).
    base: u64,
    span: u64,
}

/// A per-thread source of offsets.
struct Offsets {
    next: u64,
    rng: u64,
    start: u64,
    span: u64,
    bs: u64,
    random: bool,
}

impl Offsets {
    fn next(&mut self) -> u64 {
        if self.random {
            self.rng = self
                .rng
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            return self.start + ((self.rng >> 33) % (self.span / self.bs)) * self.bs;
        }
        let o = self.start + self.next;
        self.next = (self.next + self.bs) % (self.span - self.span % self.bs);
        o
    }
}

/// The memory one worker moves data into or out of.
enum Buf<'d> {
    Device(p2pdirect::Mapping<'d>),
    Host(AlignedBuf, p2pdirect::Mapping<'d>),
    P2pmem(*mut u8, usize),
    Ram(AlignedBuf),
    /// Given up while I/O may still use it (never unmapped or freed).
    Leaked,
}

impl Drop for Buf<'_> {
    fn drop(&mut self) {
        if let Buf::P2pmem(p, len) = self {
            // SAFETY: the mapping was made by `worker` with this length.
            unsafe { libc::munmap(p.cast(), *len) };
        }
    }
}

/// The memory a worker of `path` moves data into or out of, `len` bytes,
/// and the handle of the device memory under it, which the caller frees.
fn buffer<'d>(ctx: &Ctx<'d>, path: Path, len: u64) -> Result<(Buf<'d>, Option<u64>), String> {
    let mut handle = None;
    let mut gpu_map = || -> Result<p2pdirect::Mapping<'d>, String> {
        let a = ctx
            .dev
            .alloc(ctx.gpu, len, 0)
            .map_err(|e| format!("ALLOC {len}: {e}"))?;
        handle = Some(a.handle);
        ctx.dev.map(&a).map_err(|e| {
            let _ = ctx.dev.free(a.handle);
            format!("mmap: {e}")
        })
    };
    let buf = match path {
        Path::P2pdirect | Path::DirectDevmem | Path::Uring | Path::UringDevmem => {
            Buf::Device(gpu_map()?)
        }
        Path::Bounce | Path::Buffered => Buf::Host(AlignedBuf::new(len as usize)?, gpu_map()?),
        Path::Ram | Path::UringRam => Buf::Ram(AlignedBuf::new(len as usize)?),
        Path::Upstream | Path::UringP2pmem => {
            let p = ctx
                .p2pmem
                .as_ref()
                .ok_or("the namespace's controller publishes no P2P memory")?;
            let f = fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(p)
                .map_err(|e| format!("{p}: {e}"))?;
            // SAFETY: a fresh shared mapping of the p2pmem file; checked below.
            let m = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    len as usize,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED,
                    f.as_raw_fd(),
                    0,
                )
            };
            if m == libc::MAP_FAILED {
                return Err(format!("mmap {p}: {}", std::io::Error::last_os_error()));
            }
            Buf::P2pmem(m.cast(), len as usize)
        }
    };
    Ok((buf, handle))
}

impl Buf<'_> {
    /// Where the I/O buffers start, for the kernel (never dereferenced here).
    fn base(&mut self) -> *mut u8 {
        match self {
            Buf::Device(m) | Buf::Host(_, m) => m.as_ptr(),
            Buf::P2pmem(p, _) => *p,
            Buf::Ram(h) => h.as_mut().as_mut_ptr(),
            Buf::Leaked => std::ptr::null_mut(),
        }
    }
}

/// pwrite(2) or pread(2) of all of `s` at `off`.
fn pio(file: &fs::File, s: &mut [u8], off: u64, write: bool) -> std::io::Result<usize> {
    if write {
        file.write_at(s, off)
    } else {
        file.read_at(s, off)
    }
}

/// The timed part of a run: its workers set up (open, allocate, map,
/// register) before it starts and tear down after it ends, as gdsio times
/// its I/O after cuFileBufRegister, so a path's setup and teardown (a
/// registration's, an mmap's) are in no figure. The run's thread waits at
/// both barriers too: it reads the clock and the CPU time there.
struct Window {
    start: Barrier,
    end: Barrier,
    secs: f64,
}

impl Window {
    fn new(workers: usize, secs: f64) -> Self {
        Self {
            start: Barrier::new(workers + 1),
            end: Barrier::new(workers + 1),
            secs,
        }
    }
}

/// A worker's passage through the window: each barrier is waited at once,
/// whatever happens to the worker (a failed setup, an error, a panic), so
/// no other thread waits forever.
struct Turn<'w> {
    win: &'w Window,
    began: bool,
    ended: bool,
}

impl<'w> Turn<'w> {
    fn new(win: &'w Window) -> Self {
        Self {
            win,
            began: false,
            ended: false,
        }
    }

    /// Waits for every worker to be set up; returns the worker's deadline.
    fn begin(&mut self) -> Instant {
        if !self.began {
            self.began = true;
            self.win.start.wait();
        }
        Instant::now() + Duration::from_secs_f64(self.win.secs)
    }

    /// The worker's I/O is done.
    fn end(&mut self) {
        self.begin();
        if !self.ended {
            self.ended = true;
            self.win.end.wait();
        }
    }
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        self.end();
    }
}

fn worker(ctx: &Ctx, path: Path, wl: &Workload, t: usize, win: &Window) -> Result<Worked, String> {
    let mut turn = Turn::new(win);
    let bs = wl.bs;
    let direct = path != Path::Buffered;
    let file = ctx.ns.open(wl.write, direct)?;
    if path == Path::Buffered && !wl.write && wl.random {
        // No readahead: each read costs the device one block.
        // SAFETY: advice on an open descriptor; no memory involved.
        unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_RANDOM) };
    }
    let buf_len = if path.uring() {
        (bs * u64::from(wl.qd)).min(URING_BUF_MAX.max(bs))
    } else {
        bs
    };
    let (mut buf, handle) = buffer(ctx, path, buf_len)?;
    let r = worker_on(ctx, path, wl, t, &mut turn, &file, &mut buf, buf_len);
    turn.end();
    // Unmapped first, then given back (a bench process runs many workers).
    drop(buf);
    if let Some(h) = handle {
        let _ = ctx.dev.free(h);
    }
    let r = r?;
    Ok(r)
}

/// A worker's run on its buffer.
#[allow(clippy::too_many_arguments)]
fn worker_on(
    ctx: &Ctx,
    path: Path,
    wl: &Workload,
    t: usize,
    turn: &mut Turn<'_>,
    file: &fs::File,
    buf: &mut Buf,
    buf_len: u64,
) -> Result<Worked, String> {
    let bs = wl.bs;
    let mut offs = Offsets {
        next: (t as u64 * (ctx.span / wl.threads as u64)) / bs * bs,
        rng: 0x9E37_79B9 ^ (t as u64 + 1),
        start: ctx.base + if wl.write { ctx.span } else { 0 },
        span: ctx.span,
        bs,
        random: wl.random,
    };
    // p2pdirect: the buffer is registered once, like cuFileBufRegister.
    let reg = match &buf {
        Buf::Device(m) if matches!(path, Path::P2pdirect | Path::Uring) => Some(
            ctx.dev
                .register(m.as_ptr(), buf_len, true)
                .map_err(|e| format!("REGISTER: {e}"))?
                .0,
        ),
        _ => None,
    };
    let mut r = if path.uring() {
        // The ring is set up and torn down outside the window too.
        uring_worker(ctx, path, wl, file, buf, buf_len, reg, &mut offs, turn)
    } else {
        let deadline = turn.begin();
        sync_worker(ctx, path, wl, file, buf, reg, &mut offs, deadline)
    };
    // Buffered writes are done when they reach the device: inside the window.
    if r.is_ok() && wl.write && path == Path::Buffered {
        if let Err(e) = file.sync_data() {
            r = Err(format!("fdatasync: {e}"));
        }
    }
    turn.end();
    if let Some(id) = reg {
        let _ = ctx.dev.deregister(id);
    }
    r
}

/// One I/O at a time, timed one by one.
#[allow(clippy::too_many_arguments)]
fn sync_worker(
    ctx: &Ctx,
    path: Path,
    wl: &Workload,
    file: &fs::File,
    buf: &mut Buf,
    reg: Option<u64>,
    offs: &mut Offsets,
    deadline: Instant,
) -> Result<Worked, String> {
    let bs = wl.bs;
    let mut lat = Vec::new();
    let mut ops = 0u64;
    while Instant::now() < deadline || ops < 4 {
        let off = offs.next();
        let t0 = Instant::now();
        let res = match buf {
            Buf::Device(m) if path == Path::DirectDevmem => {
                // SAFETY: the device-memory mapping holds `bs` bytes; the
                // slice is only handed to the kernel as an I/O buffer.
                let s = unsafe { std::slice::from_raw_parts_mut(m.as_ptr(), bs as usize) };
                pio(file, s, off, wl.write)
            }
            Buf::Device(m) => {
                let io = Io {
                    fd: file.as_raw_fd(),
                    memory: reg.map_or(Memory::Pointer(m.as_ptr()), Memory::Registered),
                    size: bs,
                    file_offset: off,
                    buf_offset: 0,
                    compat: false,
                };
                let r = if wl.write {
                    ctx.dev.write(&io)
                } else {
                    ctx.dev.read(&io)
                };
                r.map(|d| d.bytes as usize)
            }
            Buf::Host(h, m) if wl.write => {
                let s = h.as_mut();
                m.read(0, s).and_then(|_| file.write_at(s, off))
            }
            Buf::Host(h, m) => {
                let s = h.as_mut();
                let r = file
                    .read_at(s, off)
                    .and_then(|n| m.write(0, &s[..n]).map(|_| n));
                if path == Path::Buffered {
                    // The next pass over the span must find the device, not
                    // the page cache.
                    // SAFETY: advice on an open descriptor.
                    unsafe {
                        libc::posix_fadvise(
                            file.as_raw_fd(),
                            off as i64,
                            bs as i64,
                            libc::POSIX_FADV_DONTNEED,
                        )
                    };
                }
                r
            }
            Buf::Ram(h) => pio(file, h.as_mut(), off, wl.write),
            Buf::Leaked => return Err("the buffer was given up".into()),
            Buf::P2pmem(p, len) => {
                // SAFETY: the p2pmem mapping holds `len` bytes; the slice is
                // only handed to the kernel as an I/O buffer.
                let s = unsafe { std::slice::from_raw_parts_mut(*p, *len) };
                pio(file, s, off, wl.write)
            }
        };
        match res {
            Ok(n) if n as u64 == bs => {}
            Ok(n) => return Err(format!("short transfer: {n} of {bs} bytes at {off:#x}")),
            Err(e) => return Err(format!("{} at {off:#x}: {e}", path.name())),
        }
        lat.push(t0.elapsed().as_secs_f64() as f32 * 1e6);
        ops += 1;
    }
    Ok(Worked { ops, lat, waits: 0 })
}

/// The ring of an io_uring worker: p2pdirect's commands, or plain O_DIRECT
/// reads and writes.
enum Uring<'d> {
    Cmd(Ring<'d>),
    Plain(IoUring),
}

/// `wl.qd` I/Os kept in flight by one thread: each completion is followed
/// by the next I/O of its slot until the deadline, then the queue drains.
/// Latency is from the submission of an I/O to the reaping of its
/// completion. The buffer is given back only once no I/O uses it (leaked if
/// the ring failed with I/Os in flight).
#[allow(clippy::too_many_arguments)]
fn uring_worker(
    ctx: &Ctx,
    path: Path,
    wl: &Workload,
    file: &fs::File,
    buf: &mut Buf,
    buf_len: u64,
    reg: Option<u64>,
    offs: &mut Offsets,
    turn: &mut Turn<'_>,
) -> Result<Worked, String> {
    let (bs, qd) = (wl.bs, wl.qd as usize);
    let bufs = (buf_len / bs).max(1);
    let base = buf.base();
    let entries = (qd as u32).next_power_of_two();
    let mut ring = match path {
        Path::Uring => {
            Uring::Cmd(Ring::new(ctx.dev, entries).map_err(|e| format!("io_uring: {e}"))?)
        }
        _ => Uring::Plain(IoUring::new(entries).map_err(|e| format!("io_uring: {e}"))?),
    };
    let deadline = turn.begin();
    let fd = file.as_raw_fd();
    let mut started = vec![Instant::now(); qd];
    let mut push = |ring: &mut Uring, slot: usize, started: &mut [Instant]| -> Result<(), String> {
        let off = offs.next();
        let boff = (slot as u64 % bufs) * bs;
        started[slot] = Instant::now();
        match ring {
            Uring::Cmd(r) => {
                let io = Io {
                    fd,
                    memory: reg.map_or(Memory::Pointer(base), Memory::Registered),
                    size: bs,
                    file_offset: off,
                    buf_offset: boff,
                    compat: false,
                };
                r.push(wl.write, &io, slot as u64)
                    .map_err(|e| format!("io_uring push: {e}"))
            }
            Uring::Plain(r) => {
                let p = base.wrapping_add(boff as usize);
                let sqe = if wl.write {
                    opcode::Write::new(types::Fd(fd), p, bs as u32)
                        .offset(off)
                        .build()
                } else {
                    opcode::Read::new(types::Fd(fd), p, bs as u32)
                        .offset(off)
                        .build()
                };
                // SAFETY: the buffer (`buf_len` bytes at `base`) outlives
                // every I/O: the worker drains the queue before it lets go
                // of it, or leaks it.
                unsafe { r.submission().push(&sqe.user_data(slot as u64)) }
                    .map_err(|_| "io_uring: submission queue full".to_string())
            }
        }
    };
    let (mut inflight, mut ops, mut lat, mut err) = (0usize, 0u64, Vec::new(), None);
    let mut waits = 0u64;
    for slot in 0..qd {
        match push(&mut ring, slot, &mut started) {
            Ok(()) => inflight += 1,
            Err(e) => {
                err = Some(e);
                break;
            }
        }
    }
    while inflight > 0 {
        let entered = match &mut ring {
            Uring::Cmd(r) => r.submit_and_wait(1),
            Uring::Plain(r) => r.submit_and_wait(1),
        };
        match entered {
            Ok(_) => waits += 1,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => {
                // I/Os may still use the buffer: it must never be reused.
                std::mem::forget(std::mem::replace(buf, Buf::Leaked));
                return Err(format!("io_uring_enter: {e}"));
            }
        }
        let done: Vec<(u64, i64)> = match &mut ring {
            Uring::Cmd(r) => r
                .completions()
                .iter()
                .map(|c| {
                    (
                        c.user_data,
                        c.result.map_or_else(|e| -i64::from(e), |b| b as i64),
                    )
                })
                .collect(),
            Uring::Plain(r) => r
                .completion()
                .map(|c| (c.user_data(), i64::from(c.result())))
                .collect(),
        };
        for (slot, res) in done {
            let Some(t0) = started.get(slot as usize) else {
                err.get_or_insert(format!("io_uring: unknown completion {slot}"));
                continue;
            };
            if res != bs as i64 {
                err.get_or_insert(if res < 0 {
                    format!(
                        "{}: {}",
                        path.name(),
                        std::io::Error::from_raw_os_error(-res as i32)
                    )
                } else {
                    format!("short transfer: {res} of {bs} bytes")
                });
            }
            lat.push(t0.elapsed().as_secs_f64() as f32 * 1e6);
            ops += 1;
            inflight -= 1;
            if err.is_none() && (Instant::now() < deadline || ops < 4) {
                match push(&mut ring, slot as usize, &mut started) {
                    Ok(()) => inflight += 1,
                    Err(e) => err = Some(e),
                }
            }
        }
    }
    turn.end();
    drop(ring);
    match err {
        Some(e) => Err(e),
        None => Ok(Worked { ops, lat, waits }),
    }
}

fn run_one(ctx: &Ctx, path: Path, wl: &Workload, secs: f64) -> Res {
    if path == Path::Buffered && !wl.write {
        // Cold cache: the device, not the page cache, must serve the reads.
        let _ = fs::write("/proc/sys/vm/drop_caches", "3");
    }
    let win = Window::new(wl.threads, secs);
    let (results, elapsed, cpu_s) = std::thread::scope(|s| {
        let win = &win;
        let hs: Vec<_> = (0..wl.threads)
            .map(|t| s.spawn(move || worker(ctx, path, wl, t, win)))
            .collect();
        // From the moment every worker is set up to the moment every
        // worker's I/O is done.
        win.start.wait();
        let t0 = Instant::now();
        let cpu0 = cpu_busy_s();
        win.end.wait();
        let elapsed = t0.elapsed().as_secs_f64();
        let cpu_s = cpu_busy_s() - cpu0;
        let results: Vec<Result<Worked, String>> = hs
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("worker panicked".into())))
            .collect();
        (results, elapsed, cpu_s)
    });
    let mut r = Res {
        path,
        wl: wl.clone(),
        ops: 0,
        bytes: 0,
        secs: elapsed,
        cpu_s,
        lat_us: Vec::new(),
        waits: 0,
        error: None,
    };
    for x in results {
        match x {
            Ok(w) => {
                r.ops += w.ops;
                r.bytes += w.ops * wl.bs;
                r.lat_us.extend(w.lat);
                r.waits += w.waits;
            }
            Err(e) => r.error = Some(e),
        }
    }
    r
}

/// The round of a run with the median IOPS (a failed round wins: its
/// error is reported).
fn median(mut runs: Vec<Res>) -> Option<Res> {
    if let Some(i) = runs.iter().position(|r| r.error.is_some()) {
        return Some(runs.swap_remove(i));
    }
    runs.sort_by(|a, b| a.iops().total_cmp(&b.iops()));
    let mid = runs.len() / 2;
    runs.into_iter().nth(mid)
}

fn find<'a>(rs: &'a [Res], path: Path, wl: &str) -> Option<&'a Res> {
    rs.iter()
        .find(|r| r.path == path && r.wl.name() == wl && r.error.is_none())
}

/// (what, measured ratio, target, higher is better).
type Ratio = (String, Option<f64>, f64, bool);

/// The upstream io_uring path of a workload: the better of its two
/// mappings (the sysfs p2pmem one and p2pdirect's device memory).
fn upstream_uring<'a>(rs: &'a [Res], wl: &str) -> Option<&'a Res> {
    [Path::UringP2pmem, Path::UringDevmem]
        .iter()
        .filter_map(|p| find(rs, *p, wl))
        .max_by(|a, b| a.iops().total_cmp(&b.iops()))
}

/// Where the compared side of a ratio comes from.
#[derive(Clone, Copy)]
enum Side {
    Path(Path),
    /// The better of the upstream io_uring mappings ([`upstream_uring`]).
    UpstreamUring,
}

fn side<'a>(rs: &'a [Res], side: Side, wl: &str) -> Option<&'a Res> {
    match side {
        Side::Path(p) => find(rs, p, wl),
        Side::UpstreamUring => upstream_uring(rs, wl),
    }
}

/// `f(a) / f(b)`, if both ran.
fn pair(a: Option<&Res>, b: Option<&Res>, f: fn(&Res) -> f64) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) if f(b) > 0.0 => Some(f(a) / f(b)),
        _ => None,
    }
}

fn ratios(rs: &[Res], threads: usize, qds: &[u32]) -> Vec<Ratio> {
    use Side::{Path as P, UpstreamUring};
    let (mib, iops, cpu): (fn(&Res) -> f64, _, _) = (Res::mib_s, Res::iops, Res::cpu_s_per_gib);
    let t4 = |wl: &str| format!("{wl}-t{threads}");
    // (a, its workload, b, its workload, metric, what it is, target, higher
    // is better)
    let pairs = [
        (
            P(Path::P2pdirect),
            "seq-read-1M".to_string(),
            P(Path::Ram),
            "seq-read-1M".to_string(),
            mib,
            "MiB/s",
            0.95,
            true,
        ),
        (
            P(Path::P2pdirect),
            "seq-read-1M".into(),
            P(Path::Bounce),
            "seq-read-1M".into(),
            cpu,
            "CPU s/GiB",
            0.25,
            false,
        ),
        // The synchronous ioctls against the upstream sysfs path, 4 KiB.
        (
            P(Path::P2pdirect),
            "seq-read-4K".into(),
            P(Path::Upstream),
            "seq-read-4K".into(),
            iops,
            "IOPS",
            1.0,
            true,
        ),
        (
            P(Path::P2pdirect),
            t4("seq-read-4K"),
            P(Path::Upstream),
            t4("seq-read-4K"),
            iops,
            "IOPS",
            1.0,
            true,
        ),
        (
            P(Path::P2pdirect),
            "rand-read-4K".into(),
            P(Path::Upstream),
            "rand-read-4K".into(),
            iops,
            "IOPS",
            1.0,
            true,
        ),
        (
            P(Path::P2pdirect),
            t4("rand-read-4K"),
            P(Path::Upstream),
            t4("rand-read-4K"),
            iops,
            "IOPS",
            1.0,
            true,
        ),
        // io_uring: p2pdirect's commands against upstream's deep queue.
        (
            P(Path::Uring),
            "rand-read-4K-qd32".into(),
            UpstreamUring,
            "rand-read-4K-qd32".into(),
            iops,
            "IOPS",
            1.2,
            true,
        ),
        (
            P(Path::Uring),
            "seq-read-1M-qd32".into(),
            P(Path::Bounce),
            "seq-read-1M".into(),
            cpu,
            "CPU s/GiB",
            0.10,
            false,
        ),
    ];
    let name = |s: Side| match s {
        Side::Path(p) => p.name(),
        Side::UpstreamUring => "upstream-uring",
    };
    let mut v: Vec<Ratio> = pairs
        .iter()
        .map(|(a, wa, b, wb, f, unit, target, higher)| {
            let b_wl = if wa == wb {
                String::new()
            } else {
                format!(" {wb}")
            };
            (
                format!("{wa} {unit}: {} / {}{b_wl}", name(*a), name(*b)),
                pair(side(rs, *a, wa), side(rs, *b, wb), *f),
                *target,
                *higher,
            )
        })
        .collect();
    let sweep: Vec<Option<f64>> = qds
        .iter()
        .flat_map(|qd| {
            [
                format!("rand-read-4K-qd{qd}"),
                format!("seq-read-1M-qd{qd}"),
            ]
        })
        .map(|wl| pair(find(rs, Path::Uring, &wl), upstream_uring(rs, &wl), iops))
        .collect();
    let worst = if sweep.iter().all(Option::is_some) {
        sweep.iter().flatten().copied().reduce(f64::min)
    } else {
        None
    };
    v.insert(
        7,
        (
            "every QD, 4K and 1M: p2pdirect-uring / upstream-uring (lowest)".into(),
            worst,
            1.0,
            true,
        ),
    );
    // `--threads 1` runs no multi-threaded workload: no target for one.
    if threads == 1 {
        v.retain(|r| !r.0.split(' ').next().is_some_and(|w| w.ends_with("-t1")));
    }
    v
}

/// bench's region on `ns`: reads at `[base, base + span)`, writes the span
/// after it; `--offset` and `--size`, or their defaults. A region that
/// is not in 4 MiB steps, is too small or does not fit is refused, naming
/// the options, their values or defaults, and the namespace's size.
fn region(args: &Args, ns: &Namespace) -> Result<(u64, u64), String> {
    const STEP: u64 = 4 << 20;
    const MIN: u64 = 8 << 20;
    let mib = crate::cli::human_bytes;
    let base = args.offset.unwrap_or((ns.size / 2) / STEP * STEP);
    let span = args
        .size
        .unwrap_or((ns.size / 4).min(64 << 20) / STEP * STEP);
    // An option as given, or its default and where that comes from.
    let said = |opt: &str, given: Option<u64>, value: u64, default: &str| match given {
        Some(v) => format!("{opt} {v} ({})", mib(v)),
        None => format!("{opt} {value} ({}: the default, {default})", mib(value)),
    };
    let offset = said(
        "--offset",
        args.offset,
        base,
        &format!("the middle of {} rounded down to 4 MiB", ns.name),
    );
    let size = said(
        "--size",
        args.size,
        span,
        &format!(
            "a quarter of {} rounded down to 4 MiB, at most 64 MiB",
            ns.name
        ),
    );
    let capacity = format!("its {} bytes ({})", ns.size, mib(ns.size));
    let unaligned: Vec<&str> = [(base, offset.as_str()), (span, size.as_str())]
        .into_iter()
        .filter(|(v, _)| !v.is_multiple_of(STEP))
        .map(|(_, what)| what)
        .collect();
    if !unaligned.is_empty() {
        return Err(format!(
            "{} must be {} of 4 MiB",
            unaligned.join(" and "),
            if unaligned.len() == 1 {
                "a multiple"
            } else {
                "multiples"
            }
        ));
    }
    if span < MIN {
        return Err(match args.size {
            Some(_) => format!("{size} is less than bench's minimum, 8 MiB"),
            None => format!(
                "{}: {size} is less than bench's minimum, 8 MiB: {capacity} are too few for the \
                 defaults (32 MiB at least); give --offset and --size (8M or more; bench \
                 uses 2 x --size from --offset)",
                ns.name
            ),
        });
    }
    match span.checked_mul(2).and_then(|s| base.checked_add(s)) {
        Some(end) if end <= ns.size => Ok((base, span)),
        end => Err(format!(
            "{}: {offset} and {size}: the reads and the writes after them (2 x --size from \
             --offset) end at {}, past {capacity}",
            ns.name,
            end.map_or("more than 2^64 bytes".into(), |e| format!(
                "{e} ({})",
                mib(e)
            ))
        )),
    }
}

fn machine_json() -> String {
    let mut m = Json::obj();
    let uname = fs::read_to_string("/proc/version").unwrap_or_default();
    m.str("kernel", uname.trim());
    let cpuinfo = fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split_once(':'))
        .map_or("?".into(), |(_, v)| v.trim().to_string());
    m.str("cpu", &model);
    m.int(
        "cpus",
        cpuinfo
            .lines()
            .filter(|l| l.starts_with("processor"))
            .count() as u64,
    );
    m.end()
}

pub fn run(dev: &Device, args: &Args) -> Result<(), String> {
    // The provider first: the default namespace is one it reaches.
    let gpu = args.gpu(dev)?;
    let ns = args.namespace(&gpu)?;
    let secs = args.seconds.unwrap_or(1.0);
    let threads = args.threads.unwrap_or(4);
    // Reads use [base, base + span), writes the span after it. By default
    // the upper half of the namespace: the lower half is left to `p2pd
    // verify` and the tests.
    let (base, span) = region(args, &ns)?;
    // The reads and writes go over the namespace's data: not while anyone
    // uses it, and nobody may start to until the runs end.
    let _claim = ns.claim()?;
    let p2pmem = ns
        .pci
        .map(|a| format!("/sys/bus/pci/devices/{a}/p2pmem/allocate"))
        .filter(|p| fs::metadata(p).is_ok());
    let ctx = Ctx {
        dev,
        ns: &ns,
        gpu: gpu.index,
        p2pmem,
        base,
        span,
    };
    let wl = |write, random, bs, threads, qd| Workload {
        write,
        random,
        bs,
        threads,
        qd,
    };
    let mut wls = Vec::new();
    for write in [false, true] {
        for bs in [4u64 << 10, 128 << 10, 1 << 20, 4 << 20] {
            wls.push(wl(write, false, bs, 1, 0));
        }
    }
    // 4 KiB reads, one thread and `threads` (`--threads 1`: the one-thread
    // runs only, not twice).
    wls.push(wl(false, true, 4 << 10, 1, 0));
    if threads > 1 {
        wls.push(wl(false, false, 4 << 10, threads, 0));
        wls.push(wl(false, true, 4 << 10, threads, 0));
    }
    // The queue-depth sweep of the io_uring paths, one thread.
    let qds = if args.qd.is_empty() {
        QD_SWEEP.to_vec()
    } else {
        args.qd.clone()
    };
    let mut uring_wls = Vec::new();
    for &qd in &qds {
        uring_wls.push(wl(false, true, 4 << 10, 1, qd));
        uring_wls.push(wl(false, false, 1 << 20, 1, qd));
    }
    let wanted = |path: Path, wl: &Workload| {
        let name = format!("{} {}", path.name(), wl.name());
        args.only.is_empty() || args.only.iter().any(|o| name.contains(o.as_str()))
    };
    // The upstream sysfs paths need the controller's published memory: on
    // a controller without it they are left out, and said so, rather than
    // failed.
    let no_p2pmem =
        |p: Path| ctx.p2pmem.is_none() && matches!(p, Path::Upstream | Path::UringP2pmem);
    let (todo, skipped): (Vec<(Path, &Workload)>, Vec<_>) = wls
        .iter()
        .flat_map(|wl| PATHS.iter().map(move |p| (*p, wl)))
        .chain(
            uring_wls
                .iter()
                .flat_map(|wl| URING_PATHS.iter().map(move |p| (*p, wl))),
        )
        .filter(|(p, wl)| wanted(*p, wl))
        .partition(|(p, _)| !no_p2pmem(*p));
    let left_out = (!skipped.is_empty()).then(|| {
        let why = if ns.pci.is_none() && !ns.paths.is_empty() {
            format!(
                "{} is a multipath head, with no one controller whose P2P memory they would use",
                ns.name
            )
        } else {
            format!(
                "the controller of {} publishes no P2P memory (no p2pmem/allocate in sysfs)",
                ns.name
            )
        };
        format!(
            "{} runs of upstream-p2pmem and upstream-uring-p2pmem left out: {why}",
            skipped.len()
        )
    });
    if let (true, Some(note)) = (todo.is_empty(), &left_out) {
        return Err(note.clone());
    }
    if todo.is_empty() {
        return Err("--only matches no run (runs are named like 'p2pdirect seq-read-4K')".into());
    }
    // The JSON file is opened before the runs (a path that cannot be
    // written is refused now, not after minutes of runs), but after the
    // choice of runs (a choice of none leaves no new empty file), and
    // emptied only when the results are there: a bench that fails keeps an
    // older file.
    let json_file = match &args.out {
        Some(path) => Some((
            path,
            fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(false)
                .open(path)
                .map_err(|e| format!("{}: {e}", path.display()))?,
        )),
        None => None,
    };
    // Each run is repeated, the rounds interleaved, and the median round
    // kept: a disturbance of the machine during one run (a VM's host is
    // never quiet) then moves no ratio.
    let rounds = args.rounds.unwrap_or(3);
    let mut progress = Progress::new(todo.len() * rounds);
    let mut all: Vec<Vec<Res>> = todo.iter().map(|_| Vec::new()).collect();
    for _ in 0..rounds {
        for ((path, wl), runs) in todo.iter().zip(all.iter_mut()) {
            progress.step(&format!("{} {}", path.name(), wl.name()));
            runs.push(run_one(&ctx, *path, wl, secs));
        }
    }
    // Each run's median round, with every round's IOPS in the order the
    // rounds ran (for the JSON: the spread of a run, and ratios taken round
    // by round).
    let (rs, round_iops): (Vec<Res>, Vec<Vec<f64>>) = all
        .into_iter()
        .filter_map(|runs| {
            let each = runs.iter().map(Res::iops).collect();
            median(runs).map(|r| (r, each))
        })
        .unzip();
    let ratios = ratios(&rs, threads, &qds);

    // With --json, stdout holds the JSON document alone; the table goes to
    // stderr.
    let mut out: Box<dyn Write> = if args.json {
        Box::new(std::io::stderr())
    } else {
        Box::new(std::io::stdout())
    };
    let reported = report(
        &mut *out,
        &rs,
        &ratios,
        &ns,
        &gpu,
        secs,
        rounds,
        left_out.as_deref(),
    );
    let failed = rs.iter().filter(|r| r.error.is_some()).count();

    let runs: Vec<String> = rs
        .iter()
        .zip(&round_iops)
        .map(|(r, rounds)| {
            let mut o = Json::obj();
            o.str("path", r.path.name());
            o.str("workload", &r.wl.name());
            o.raw("write", if r.wl.write { "true" } else { "false" });
            o.raw("random", if r.wl.random { "true" } else { "false" });
            o.int("block_size", r.wl.bs);
            o.int("threads", r.wl.threads as u64);
            o.int("queue_depth", r.wl.qd);
            o.int("ops", r.ops);
            o.int("bytes", r.bytes);
            o.num("seconds", r.secs);
            o.num("mib_s", r.mib_s());
            o.num("iops", r.iops());
            o.num("lat_mean_us", r.mean_us());
            o.num("lat_p50_us", r.p50_us());
            o.num("lat_p99_us", r.p99_us());
            o.num("cpu_s_per_gib", r.cpu_s_per_gib());
            match r.per_wait() {
                Some(v) => o.num("completions_per_wait", v),
                None => o.raw("completions_per_wait", "null"),
            }
            let each: Vec<String> = rounds.iter().map(|v| Json::number(*v)).collect();
            o.raw("round_iops", &Json::array(&each));
            match &r.error {
                Some(e) => o.str("error", e),
                None => o.raw("error", "null"),
            }
            o.end()
        })
        .collect();
    let rat: Vec<String> = ratios
        .iter()
        .map(|(what, v, target, higher)| {
            let mut o = Json::obj();
            o.str("ratio", what);
            match v {
                Some(v) => o.num("value", *v),
                None => o.raw("value", "null"),
            }
            o.num("target", *target);
            o.str("target_is", if *higher { "min" } else { "max" });
            o.end()
        })
        .collect();
    let mut j = Json::obj();
    j.raw("machine", &machine_json());
    j.str("namespace", &ns.name);
    j.str("gpu", &gpu.pci_addr.to_string());
    // As given (Rust prints the shortest decimal that reads back the same),
    // not rounded to four places.
    j.raw("seconds_per_run", &secs.to_string());
    j.int("rounds", rounds as u64);
    j.raw("runs", &Json::array(&runs));
    j.raw("ratios", &Json::array(&rat));
    if let Some(note) = &left_out {
        j.str("left_out", note);
    }
    let text = j.end();
    // The file first: a standard output that fails ends p2pd.
    // Only a regular file is emptied: a pipe, a terminal or /dev/null
    // (`--out /dev/stdout`) cannot be, and needs not.
    if let Some((path, mut file)) = json_file {
        file.metadata()
            .and_then(|m| if m.is_file() { file.set_len(0) } else { Ok(()) })
            .and_then(|()| file.write_all(text.as_bytes()))
            .map_err(|e| format!("{}: {e}", path.display()))?;
    }
    // The table's failure, once the file has the results: on stdout, as
    // any failed standard output (quiet for a reader that went away). With
    // --json the table is on stderr, beside the results: one that cannot be
    // written (`2>/dev/full`) loses the table, not the JSON.
    if let (Err(e), false) = (reported, args.json) {
        crate::stdout_failed(e);
    }
    if args.json {
        outln!("{text}");
    }
    if failed > 0 {
        return Err(format!(
            "{failed} of {} runs failed (their rows say why)",
            rs.len()
        ));
    }
    Ok(())
}

/// The human-readable results: the table, the runs left out and the
/// targets.
#[allow(clippy::too_many_arguments)]
fn report(
    w: &mut dyn Write,
    rs: &[Res],
    ratios: &[Ratio],
    ns: &Namespace,
    gpu: &p2pdirect::Provider,
    secs: f64,
    rounds: usize,
    left_out: Option<&str>,
) -> std::io::Result<()> {
    writeln!(
        w,
        "p2pd bench: {} (nsid {}, {}) <-> GPU {}; {secs} s per run, median of {rounds} rounds",
        ns.name, ns.nsid, ns.serial, gpu.pci_addr
    )?;
    writeln!(
        w,
        "{:<20} {:<22} {:>9} {:>9} {:>9} {:>9} {:>9} {:>10}",
        "workload", "path", "MiB/s", "IOPS", "mean us", "p50 us", "p99 us", "CPU s/GiB"
    )?;
    for r in rs {
        if let Some(e) = &r.error {
            writeln!(w, "{:<20} {:<22} error: {e}", r.wl.name(), r.path.name())?;
            continue;
        }
        writeln!(
            w,
            "{:<20} {:<22} {:>9.1} {:>9.0} {:>9.1} {:>9.1} {:>9.1} {:>10.3}",
            r.wl.name(),
            r.path.name(),
            r.mib_s(),
            r.iops(),
            r.mean_us(),
            r.p50_us(),
            r.p99_us(),
            r.cpu_s_per_gib()
        )?;
    }
    if let Some(note) = left_out {
        writeln!(w, "{note}")?;
    }
    writeln!(w, "targets:")?;
    for (what, v, target, higher) in ratios {
        let (verdict, shown) = match v {
            Some(v) if (*higher && *v >= *target) || (!*higher && *v <= *target) => {
                ("met", format!("{v:.3}"))
            }
            Some(v) => ("MISSED", format!("{v:.3}")),
            None => ("not measured", "-".into()),
        };
        writeln!(
            w,
            "  {what}: {shown} (target {} {target}) {verdict}",
            if *higher { ">=" } else { "<=" }
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ns(size: u64) -> Namespace {
        Namespace {
            name: "nvme0n1".into(),
            nsid: 1,
            serial: "s".into(),
            pci: None,
            paths: Vec::new(),
            size,
            lbs: 512,
        }
    }

    fn args(offset: Option<u64>, size: Option<u64>) -> Args {
        Args {
            offset,
            size,
            ..Args::default()
        }
    }

    #[test]
    fn region_defaults() {
        // 128 MiB: reads from the middle, a quarter of it.
        assert_eq!(
            region(&args(None, None), &ns(128 << 20)),
            Ok((64 << 20, 32 << 20))
        );
        // 1 GiB: at most 64 MiB.
        assert_eq!(
            region(&args(None, None), &ns(1 << 30)),
            Ok((512 << 20, 64 << 20))
        );
    }

    #[test]
    fn region_past_the_end_names_the_options() {
        let e = region(&args(Some(120 << 20), None), &ns(128 << 20)).unwrap_err();
        for want in [
            "--offset 125829120 (120 MiB)",
            "--size 33554432 (32 MiB: the default",
            "184 MiB",
            "134217728 bytes (128 MiB)",
        ] {
            assert!(e.contains(want), "{want}: {e}");
        }
    }

    #[test]
    fn region_too_small_names_size() {
        let e = region(&args(None, Some(4 << 20)), &ns(128 << 20)).unwrap_err();
        assert!(
            e.contains("--size 4194304 (4 MiB) is less than bench's minimum, 8 MiB"),
            "{e}"
        );
        // The default on a small namespace: its size and what to give.
        let e = region(&args(None, None), &ns(20 << 20)).unwrap_err();
        for want in [
            "--size 4194304 (4 MiB: the default",
            "(20 MiB)",
            "--offset and --size",
        ] {
            assert!(e.contains(want), "{want}: {e}");
        }
    }

    #[test]
    fn region_not_in_4mib_steps() {
        let e = region(&args(Some(1 << 20), Some(6 << 20)), &ns(128 << 20)).unwrap_err();
        assert!(
            e.contains(
                "--offset 1048576 (1 MiB) and --size 6291456 (6 MiB) must be multiples of 4 MiB"
            ),
            "{e}"
        );
        // Past 2^64: said, not wrapped.
        let top: u64 = !((4 << 20) - 1);
        let e = region(&args(Some(top), None), &ns(128 << 20)).unwrap_err();
        assert!(e.contains("end at more than 2^64 bytes"), "{e}");
    }
}
