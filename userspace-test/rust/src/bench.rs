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
//! Reports MiB/s, IOPS, mean and p99 latency, and guest CPU seconds per GiB
//! (all CPUs' busy time from /proc/stat while the run lasts).

use crate::cli::{AlignedBuf, Args, Json, Namespace, Progress};
use p2pdirect::{Device, Io, Memory};
use std::{
    fs,
    os::{fd::AsRawFd, unix::fs::FileExt},
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
}

const PATHS: [Path; 6] = [
    Path::P2pdirect,
    Path::Upstream,
    Path::DirectDevmem,
    Path::Bounce,
    Path::Buffered,
    Path::Ram,
];

impl Path {
    fn name(self) -> &'static str {
        match self {
            Path::P2pdirect => "p2pdirect",
            Path::Upstream => "upstream-p2pmem",
            Path::DirectDevmem => "odirect-devmem",
            Path::Bounce => "bounce",
            Path::Buffered => "buffered",
            Path::Ram => "odirect-ram",
        }
    }
}

#[derive(Clone, Debug)]
struct Workload {
    write: bool,
    random: bool,
    bs: u64,
    threads: usize,
}

impl Workload {
    fn name(&self) -> String {
        let bs = if self.bs >= 1 << 20 {
            format!("{}M", self.bs >> 20)
        } else {
            format!("{}K", self.bs >> 10)
        };
        format!(
            "{}-{}-{}{}",
            if self.random { "rand" } else { "seq" },
            if self.write { "write" } else { "read" },
            bs,
            if self.threads > 1 {
                format!("-t{}", self.threads)
            } else {
                String::new()
            }
        )
    }
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
    error: Option<String>,
}

impl Res {
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
    fn p99_us(&self) -> f64 {
        let mut v = self.lat_us.clone();
        if v.is_empty() {
            return 0.0;
        }
        v.sort_by(f32::total_cmp);
        v[(v.len() * 99 / 100).min(v.len() - 1)] as f64
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
}

impl Drop for Buf<'_> {
    fn drop(&mut self) {
        if let Buf::P2pmem(p, len) = self {
            // SAFETY: the mapping was made by `worker` with this length.
            unsafe { libc::munmap(p.cast(), *len) };
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

fn worker(
    ctx: &Ctx,
    path: Path,
    wl: &Workload,
    t: usize,
    deadline: Instant,
) -> Result<(u64, Vec<f32>), String> {
    let bs = wl.bs;
    let direct = path != Path::Buffered;
    let file = ctx.ns.open(wl.write, direct)?;
    let gpu_map = || -> Result<p2pdirect::Mapping<'_>, String> {
        let a = ctx
            .dev
            .alloc(ctx.gpu, bs, 0)
            .map_err(|e| format!("ALLOC {bs}: {e}"))?;
        ctx.dev.map(&a).map_err(|e| format!("mmap: {e}"))
    };
    let mut buf = match path {
        Path::P2pdirect | Path::DirectDevmem => Buf::Device(gpu_map()?),
        Path::Bounce | Path::Buffered => Buf::Host(AlignedBuf::new(bs as usize)?, gpu_map()?),
        Path::Ram => Buf::Ram(AlignedBuf::new(bs as usize)?),
        Path::Upstream => {
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
                    bs as usize,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED,
                    f.as_raw_fd(),
                    0,
                )
            };
            if m == libc::MAP_FAILED {
                return Err(format!("mmap {p}: {}", std::io::Error::last_os_error()));
            }
            Buf::P2pmem(m.cast(), bs as usize)
        }
    };
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
        Buf::Device(m) if path == Path::P2pdirect => Some(
            ctx.dev
                .register(m.as_ptr(), bs, true)
                .map_err(|e| format!("REGISTER: {e}"))?
                .0,
        ),
        _ => None,
    };
    let mut lat = Vec::new();
    let mut ops = 0u64;
    while Instant::now() < deadline || ops < 4 {
        let off = offs.next();
        let t0 = Instant::now();
        let res = match &mut buf {
            Buf::Device(m) if path == Path::DirectDevmem => {
                // SAFETY: the device-memory mapping holds `bs` bytes; the
                // slice is only handed to the kernel as an I/O buffer.
                let s = unsafe { std::slice::from_raw_parts_mut(m.as_ptr(), bs as usize) };
                pio(&file, s, off, wl.write)
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
                file.read_at(s, off)
                    .and_then(|n| m.write(0, &s[..n]).map(|_| n))
            }
            Buf::Ram(h) => pio(&file, h.as_mut(), off, wl.write),
            Buf::P2pmem(p, len) => {
                // SAFETY: the p2pmem mapping holds `len` bytes; the slice is
                // only handed to the kernel as an I/O buffer.
                let s = unsafe { std::slice::from_raw_parts_mut(*p, *len) };
                pio(&file, s, off, wl.write)
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
    if let Some(id) = reg {
        let _ = ctx.dev.deregister(id);
    }
    if wl.write && path == Path::Buffered {
        file.sync_data().map_err(|e| format!("fdatasync: {e}"))?;
    }
    Ok((ops, lat))
}

fn run_one(ctx: &Ctx, path: Path, wl: &Workload, secs: f64) -> Res {
    if path == Path::Buffered && !wl.write {
        // Cold cache: the device, not the page cache, must serve the reads.
        let _ = fs::write("/proc/sys/vm/drop_caches", "3");
    }
    let cpu0 = cpu_busy_s();
    let t0 = Instant::now();
    let deadline = t0 + Duration::from_secs_f64(secs);
    let results: Vec<Result<(u64, Vec<f32>), String>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..wl.threads)
            .map(|t| s.spawn(move || worker(ctx, path, wl, t, deadline)))
            .collect();
        hs.into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("worker panicked".into())))
            .collect()
    });
    let elapsed = t0.elapsed().as_secs_f64();
    let cpu_s = cpu_busy_s() - cpu0;
    let mut r = Res {
        path,
        wl: wl.clone(),
        ops: 0,
        bytes: 0,
        secs: elapsed,
        cpu_s,
        lat_us: Vec::new(),
        error: None,
    };
    for x in results {
        match x {
            Ok((ops, lat)) => {
                r.ops += ops;
                r.bytes += ops * wl.bs;
                r.lat_us.extend(lat);
            }
            Err(e) => r.error = Some(e),
        }
    }
    r
}

fn find<'a>(rs: &'a [Res], path: Path, wl: &str) -> Option<&'a Res> {
    rs.iter()
        .find(|r| r.path == path && r.wl.name() == wl && r.error.is_none())
}

/// (what, measured ratio, target, higher is better).
fn ratios(rs: &[Res], threads: usize) -> Vec<(String, Option<f64>, f64, bool)> {
    let rand = format!("rand-read-4K-t{threads}");
    let pair = |a: Option<&Res>, b: Option<&Res>, f: fn(&Res) -> f64| match (a, b) {
        (Some(a), Some(b)) if f(b) > 0.0 => Some(f(a) / f(b)),
        _ => None,
    };
    vec![
        (
            "seq-read-1M MiB/s: p2pdirect / odirect-ram".into(),
            pair(
                find(rs, Path::P2pdirect, "seq-read-1M"),
                find(rs, Path::Ram, "seq-read-1M"),
                Res::mib_s,
            ),
            0.95,
            true,
        ),
        (
            format!("{rand} IOPS: p2pdirect / upstream-p2pmem"),
            pair(
                find(rs, Path::P2pdirect, &rand),
                find(rs, Path::Upstream, &rand),
                Res::iops,
            ),
            0.9,
            true,
        ),
        (
            "seq-read-1M CPU s/GiB: p2pdirect / bounce".into(),
            pair(
                find(rs, Path::P2pdirect, "seq-read-1M"),
                find(rs, Path::Bounce, "seq-read-1M"),
                Res::cpu_s_per_gib,
            ),
            0.25,
            false,
        ),
    ]
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
    m.num(
        "cpus",
        cpuinfo
            .lines()
            .filter(|l| l.starts_with("processor"))
            .count() as f64,
    );
    m.end()
}

pub fn run(dev: &Device, args: &Args) -> Result<(), String> {
    let ns = args.namespace()?;
    let gpu = args.gpu(dev)?;
    let secs = args.seconds.unwrap_or(1.5);
    let threads = args.threads.unwrap_or(4);
    // The upper half of the namespace: the lower half is left to
    // `p2pd verify` and the tests.
    let base = (ns.size / 2) & !((4 << 20) - 1);
    let span = (ns.size / 4).min(64 << 20) & !((4 << 20) - 1);
    if span < 8 << 20 {
        return Err(format!("{}: too small for the benchmark", ns.name));
    }
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
    let mut wls = Vec::new();
    for write in [false, true] {
        for bs in [4u64 << 10, 128 << 10, 1 << 20, 4 << 20] {
            wls.push(Workload {
                write,
                random: false,
                bs,
                threads: 1,
            });
        }
    }
    wls.push(Workload {
        write: false,
        random: true,
        bs: 4 << 10,
        threads,
    });
    let wanted = |path: Path, wl: &Workload| {
        let name = format!("{} {}", path.name(), wl.name());
        args.only.is_empty() || args.only.iter().any(|o| name.contains(o.as_str()))
    };
    let todo: Vec<(Path, &Workload)> = wls
        .iter()
        .flat_map(|wl| PATHS.iter().map(move |p| (*p, wl)))
        .filter(|(p, wl)| wanted(*p, wl))
        .collect();
    if todo.is_empty() {
        return Err("--only matches no run (runs are named like 'p2pdirect seq-read-4K')".into());
    }
    let mut progress = Progress::new(todo.len());
    let mut rs = Vec::new();
    for (path, wl) in todo {
        progress.step(&format!("{} {}", path.name(), wl.name()));
        rs.push(run_one(&ctx, path, wl, secs));
    }
    let ratios = ratios(&rs, threads);

    println!(
        "p2pd bench: {} (nsid {}, {}) <-> GPU {}; {secs} s per run",
        ns.name, ns.nsid, ns.serial, gpu.pci_addr
    );
    println!(
        "{:<18} {:<16} {:>9} {:>9} {:>10} {:>10} {:>11}",
        "workload", "path", "MiB/s", "IOPS", "mean us", "p99 us", "CPU s/GiB"
    );
    for r in &rs {
        if let Some(e) = &r.error {
            println!("{:<18} {:<16} error: {e}", r.wl.name(), r.path.name());
            continue;
        }
        println!(
            "{:<18} {:<16} {:>9.1} {:>9.0} {:>10.1} {:>10.1} {:>11.3}",
            r.wl.name(),
            r.path.name(),
            r.mib_s(),
            r.iops(),
            r.mean_us(),
            r.p99_us(),
            r.cpu_s_per_gib()
        );
    }
    println!("targets:");
    for (what, v, target, higher) in &ratios {
        let (verdict, shown) = match v {
            Some(v) if (*higher && *v >= *target) || (!*higher && *v <= *target) => ("met", *v),
            Some(v) => ("MISSED", *v),
            None => ("not measured", f64::NAN),
        };
        println!(
            "  {what}: {shown:.3} (target {} {target}) {verdict}",
            if *higher { ">=" } else { "<=" }
        );
    }

    let runs: Vec<String> = rs
        .iter()
        .map(|r| {
            let mut o = Json::obj();
            o.str("path", r.path.name());
            o.str("workload", &r.wl.name());
            o.raw("write", if r.wl.write { "true" } else { "false" });
            o.raw("random", if r.wl.random { "true" } else { "false" });
            o.num("block_size", r.wl.bs as f64);
            o.num("threads", r.wl.threads as f64);
            o.num("ops", r.ops as f64);
            o.num("bytes", r.bytes as f64);
            o.num("seconds", r.secs);
            o.num("mib_s", r.mib_s());
            o.num("iops", r.iops());
            o.num("lat_mean_us", r.mean_us());
            o.num("lat_p99_us", r.p99_us());
            o.num("cpu_s_per_gib", r.cpu_s_per_gib());
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
    j.num("seconds_per_run", secs);
    j.raw("runs", &Json::array(&runs));
    j.raw("ratios", &Json::array(&rat));
    let text = j.end();
    if let Some(out) = &args.out {
        fs::write(out, &text).map_err(|e| format!("{}: {e}", out.display()))?;
    }
    if args.json {
        println!("{text}");
    }
    Ok(())
}
