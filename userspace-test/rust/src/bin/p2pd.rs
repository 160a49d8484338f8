// SPDX-License-Identifier: GPL-2.0
//! p2pd: command-line tool for p2pdirect.
//!
//! - `p2pd version`: module and ABI version.
//! - `p2pd info`: version, device-memory providers, NVMe namespaces and the
//!   P2P reachability matrix between them (gdscheck's role).
//! - `p2pd stats [--reset]`: the module's I/O statistics.
//! - `p2pd verify`: moves a data set NVMe -> device memory -> NVMe with
//!   p2pdirect and checks every byte.
//! - `p2pd bench`: gdsio's role: p2pdirect against the upstream P2PDMA
//!   sysfs path, a bounce through RAM and buffered reads (see bench.rs).
//!
//! Every command takes `--json` for machine-readable output.

/// `println!` that does not panic: a standard output that cannot be
/// written (a closed pipe, a full disk) ends p2pd with status 1.
macro_rules! outln {
    ($($t:tt)*) => {{
        use std::io::Write as _;
        if let Err(e) = writeln!(std::io::stdout(), $($t)*) {
            $crate::stdout_failed(e)
        }
    }};
}

/// `print!` as [`outln!`] is `println!`.
macro_rules! out {
    ($($t:tt)*) => {{
        use std::io::Write as _;
        if let Err(e) = write!(std::io::stdout(), $($t)*) {
            $crate::stdout_failed(e)
        }
    }};
}

/// `eprintln!` that does not panic: a standard error that cannot be
/// written (`2>/dev/full`, closed) loses the message, not the exit status.
macro_rules! errln {
    ($($t:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($t)*);
    }};
}

/// Standard output failed: status 1, with the reason unless the reader
/// went away (`p2pd info | head -1`), which needs none.
fn stdout_failed(e: std::io::Error) -> ! {
    if e.kind() != std::io::ErrorKind::BrokenPipe {
        errln!("p2pd: standard output: {e}");
    }
    std::process::exit(1)
}

#[path = "../bench.rs"]
mod bench;
#[path = "../cli.rs"]
mod cli;

use cli::{Args, CommandLine, Json, Namespace, Stacked};
use p2pdirect::{fill, sys, Device, Io, IoDone, Memory, Version};
use std::{os::fd::AsRawFd, process::ExitCode, time::Instant};

const USAGE: &str = "usage: p2pd <command> [options]
  version [--json]             module and ABI version
  info [--json]                providers, NVMe namespaces, stacked block devices,
                               provider x namespace reachability matrix
  stats [--json] [--reset]     I/O statistics per provider and block device
  verify [--dev NS] [--gpu I] [--offset B] [--size B] [--records] [--json]
                               NVMe -> device memory -> NVMe, every byte checked
  bench [--dev NS] [--gpu I] [--seconds S] [--rounds R] [--threads N] [--qd N[,N...]]
        [--offset B] [--size B] [--only 'PATH WORKLOAD']... [--out FILE] [--json]
                               p2pdirect vs upstream sysfs P2PDMA vs bounce vs buffered,
                               and the io_uring paths at each queue depth
  help [COMMAND], COMMAND --help, COMMAND -h
                               this text, on standard output
options:
  --dev NS         namespace (nvme0n1 or /dev/nvme0n1); default: the first by NSID that
                   the provider reaches and that has no partition, holder or mount
  --gpu I          provider index (p2pd info); default: the first BAR provider
  --offset B       verify: default 40M; bench: a multiple of 4M, default the middle of NS
  --size B         verify: default 16M; bench: a multiple of 4M, at least 8M, default a
                   quarter of NS, at most 64M (writes use as much again after it)
  --seconds S      bench: per run, 0.001 <= S < 3600, default 1
  --rounds R       bench: each run R times, the median kept; odd, 1-15, default 3
  --threads N      bench: the multi-threaded 4K runs, 1-64, default 4
  --qd N[,N...]    bench: io_uring queue depths, each 1-256, default 1,4,16,32,64
  --only 'PATH WORKLOAD'   bench: the runs whose name contains it
  --out FILE       bench: the results as JSON, in FILE
  --records        verify: the lines the host checks
  --reset          stats: zero the counters after reading them
  --json           one JSON document on standard output
Sizes B: bytes, decimal or 0x hex, with an optional k, M or G suffix. An option and
its value are two words (--size 16M); a value is never an option (--dev --json is
--dev without a value); only --qd and --only may be repeated. verify and bench write
over the namespace's data in their regions.
Exit status: 0 done, 1 failed (the message says why), 2 bad command line.";

fn usage() -> ExitCode {
    errln!("{USAGE}");
    ExitCode::from(2)
}

fn version(dev: &Device) -> Result<Version, String> {
    let v = dev.version().map_err(|e| format!("GET_VERSION: {e}"))?;
    if !v.is_compatible() {
        return Err(format!(
            "built for ABI {}.{}, module speaks {}.{}",
            sys::P2PDIRECT_ABI_MAJOR,
            sys::P2PDIRECT_ABI_MINOR,
            v.abi_major,
            v.abi_minor
        ));
    }
    Ok(v)
}

/// The module's version and ABI, as `info --json` and `version --json` give them.
fn version_json(o: &mut Json, v: &Version) {
    o.str("module_version", &v.module);
    o.str("abi", &format!("{}.{}", v.abi_major, v.abi_minor));
}

/// `p2pd version`: the module's version and ABI, as text or one JSON object.
fn show_version(dev: &Device, args: &Args) -> Result<(), String> {
    let v = version(dev)?;
    if args.json {
        let mut o = Json::obj();
        version_json(&mut o, &v);
        o.str(
            "tool_abi",
            &format!("{}.{}", sys::P2PDIRECT_ABI_MAJOR, sys::P2PDIRECT_ABI_MINOR),
        );
        outln!("{}", o.end());
    } else {
        outln!("{v}");
    }
    Ok(())
}

fn info(dev: &Device, args: &Args) -> Result<(), String> {
    let v = version(dev)?;
    let providers = dev
        .providers()
        .map_err(|e| format!("LIST_PROVIDERS: {e}"))?;
    let namespaces = Namespace::all();
    let stacked = Stacked::all();
    // For each leg of a stacked device, the providers it cannot reach (none
    // of a device the module refuses, whose legs are not all known, nor of
    // one that takes no P2PDMA pages at all, dm).
    let unreachable = |st: &Stacked| -> Vec<(String, Vec<u32>)> {
        if st.over_limit.is_some() || !st.p2pdma() {
            return Vec::new();
        }
        st.legs
            .iter()
            .filter_map(|leg| {
                let from: Vec<u32> = providers
                    .iter()
                    .filter(|p| {
                        !p.clients
                            .iter()
                            .any(|c| Some(c.pci_addr) == leg.pci && c.distance.is_some())
                    })
                    .map(|p| p.index)
                    .collect();
                (!from.is_empty()).then(|| (leg.name.clone(), from))
            })
            .collect()
    };
    // Distance from each provider to each namespace's controller.
    let distance = |p: &p2pdirect::Provider, ns: &Namespace| ns.distance_from(p);
    if args.json {
        let mut j = Json::obj();
        version_json(&mut j, &v);
        let mut ps = Vec::new();
        for p in &providers {
            let mut o = Json::obj();
            o.int("index", p.index);
            o.str("kind", cli::provider_kind(p.kind));
            o.str("pci", &p.pci_addr.to_string());
            o.int("bar", p.bar);
            o.int("bar_size", p.bar_size);
            o.int("bus_addr", p.bus_addr);
            o.int("bytes_total", p.bytes_total);
            o.int("bytes_free", p.bytes_free);
            o.int("bytes_used", p.bytes_used);
            let mut reach = Json::obj();
            for ns in &namespaces {
                match distance(p, ns) {
                    Some(d) => reach.int(&ns.name, d),
                    None => reach.raw(&ns.name, "null"),
                }
            }
            o.raw("distance", &reach.end());
            ps.push(o.end());
        }
        j.raw("providers", &Json::array(&ps));
        let nss: Vec<String> = namespaces.iter().map(Namespace::json).collect();
        j.raw("namespaces", &Json::array(&nss));
        let sts: Vec<String> = stacked
            .iter()
            .map(|st| stacked_json(st, &unreachable(st)))
            .collect();
        j.raw("stacked", &Json::array(&sts));
        outln!("{}", j.end());
        return Ok(());
    }
    outln!("{v}");
    outln!("device-memory providers: {}", providers.len());
    // Sizes exact, in the largest unit that divides them (12345 bytes used
    // are not "0 MiB").
    let size = cli::exact_bytes;
    outln!(
        "  {:>3}  {:<9}  {:<12}  {:>4}  {:>10}  {:>12}  {:>10}  {:>10}  {:>10}",
        "idx",
        "kind",
        "pci",
        "bar",
        "bar size",
        "bus addr",
        "total",
        "free",
        "used"
    );
    for p in &providers {
        outln!(
            "  {:>3}  {:<9}  {:<12}  {:>4}  {:>10}  {:>#12x}  {:>10}  {:>10}  {:>10}",
            p.index,
            cli::provider_kind(p.kind),
            p.pci_addr.to_string(),
            p.bar,
            size(p.bar_size),
            p.bus_addr,
            size(p.bytes_total),
            size(p.bytes_free),
            size(p.bytes_used)
        );
    }
    outln!("NVMe namespaces: {}", namespaces.len());
    outln!(
        "  {:<10}  {:>4}  {:<12}  {:<16}  {:>10}  {:>5}",
        "device",
        "nsid",
        "controller",
        "serial",
        "size",
        "lbs"
    );
    for ns in &namespaces {
        outln!(
            "  {:<10}  {:>4}  {:<12}  {:<16}  {:>10}  {:>5}",
            ns.name,
            ns.nsid,
            ns.pci.map_or("-".into(), |a| a.to_string()),
            ns.serial,
            size(ns.size),
            ns.lbs
        );
    }
    outln!("stacked block devices: {}", stacked.len());
    for st in &stacked {
        outln!(
            "{}",
            stacked_line(st, &unreachable(st), providers.is_empty())
        );
    }
    outln!("P2P reachability (kernel P2PDMA distance; '-' = not reachable, I/O needs COMPAT):");
    // Each row starts with the provider's index and PCI address (a label as
    // wide as the header's "provider"), each column as wide as its name.
    let label = 2 + 3 + 1 + 12;
    let width = |ns: &Namespace| ns.name.len().max(10);
    out!("{:<label$}", "  provider");
    for ns in &namespaces {
        out!(" {:>w$}", ns.name, w = width(ns));
    }
    outln!();
    for p in &providers {
        out!("  {:<3} {:<12}", p.index, p.pci_addr.to_string());
        for ns in &namespaces {
            let d = distance(p, ns).map_or("-".to_string(), |d| d.to_string());
            out!(" {:>w$}", d, w = width(ns));
        }
        outln!();
    }
    Ok(())
}

/// `p2pd info --json`'s object of stacked device `st` (see [`stacked_line`]).
fn stacked_json(st: &Stacked, bad: &[(String, Vec<u32>)]) -> String {
    let mut o = Json::obj();
    o.str("device", &st.name);
    o.str("kind", &st.kind);
    // A dm device's name, `null` for the others.
    o.opt_str("name", st.dm_name.as_deref());
    // false: the block layer takes no P2PDMA pages for it (dm): I/O gets
    // EOPNOTSUPP, or bounces with COMPAT.
    o.bool("p2pdma", st.p2pdma());
    let legs: Vec<String> = st
        .legs
        .iter()
        .map(|l| {
            let mut lo = Json::obj();
            lo.str("device", &l.name);
            lo.opt_str("controller", l.pci.map(|a| a.to_string()).as_deref());
            lo.end()
        })
        .collect();
    o.raw("legs", &Json::array(&legs));
    let names: Vec<String> = bad.iter().map(|(leg, _)| Json::quote(leg)).collect();
    o.raw("unreachable_legs", &Json::array(&names));
    // Each of those legs with the providers it cannot reach, as the text
    // says them.
    let which: Vec<String> = bad
        .iter()
        .map(|(leg, from)| {
            let mut lo = Json::obj();
            lo.str("leg", leg);
            let idx: Vec<String> = from.iter().map(u32::to_string).collect();
            lo.raw("providers", &Json::array(&idx));
            lo.end()
        })
        .collect();
    o.raw("unreachable", &Json::array(&which));
    o.opt_str("refused", st.over_limit.as_deref());
    o.end()
}

/// `p2pd info`'s line of stacked device `st`, whose legs `bad` cannot reach
/// the providers with those indices: its legs, whether it takes P2PDMA
/// pages at all (dm does not), how the providers reach it, and past the
/// stacking limits, p2pdirect's refusal (last).
fn stacked_line(st: &Stacked, bad: &[(String, Vec<u32>)], no_providers: bool) -> String {
    let legs: Vec<String> = st
        .legs
        .iter()
        .map(|l| {
            let pci = l.pci.map_or("no PCI device".into(), |a| a.to_string());
            format!("{} ({pci})", l.name)
        })
        .collect();
    let mut reach = Vec::new();
    if !st.p2pdma() {
        reach.push("no P2PDMA (EOPNOTSUPP; COMPAT bounces)".to_string());
    } else if st.over_limit.is_none() {
        reach.push(if no_providers {
            "no device-memory provider to reach it".to_string()
        } else if bad.is_empty() {
            "reachable by all providers".to_string()
        } else {
            let what: Vec<String> = bad
                .iter()
                .map(|(leg, from)| {
                    let from: Vec<String> = from.iter().map(u32::to_string).collect();
                    format!("{leg} from provider {}", from.join(","))
                })
                .collect();
            format!("unreachable: {} (I/O needs COMPAT)", what.join("; "))
        });
    }
    if let Some(why) = &st.over_limit {
        reach.push(format!("refused by p2pdirect: {why}"));
    }
    // A dm device's kind is "dm": its name is its creator's choice, not
    // its target type, which sysfs does not show.
    let kind = match &st.dm_name {
        Some(n) => format!("{} named {n}", st.kind),
        None => st.kind.clone(),
    };
    format!(
        "  {} {kind}: {}; {}",
        st.name,
        legs.join(", "),
        reach.join("; ")
    )
}

fn stats(dev: &Device, args: &Args) -> Result<(), String> {
    let rows = dev.stats(args.reset).map_err(|e| format!("STATS: {e}"))?;
    if args.json {
        let items: Vec<String> = rows
            .iter()
            .map(|r| {
                let mut o = Json::obj();
                o.str(
                    "kind",
                    match r.device {
                        p2pdirect::StatDevice::Provider(_) => "provider",
                        _ => "block",
                    },
                );
                o.str("device", &r.device.to_string());
                // A block device's name as the text shows it (`null` if
                // /sys/dev/block does not name it).
                if let p2pdirect::StatDevice::Block { major, minor } = r.device {
                    match Namespace::name_of(major, minor) {
                        Some(n) => o.str("name", &n),
                        None => o.raw("name", "null"),
                    }
                }
                for (k, v) in [
                    ("reads", r.reads),
                    ("writes", r.writes),
                    ("errors", r.errors),
                    ("bytes_read", r.bytes_read),
                    ("bytes_written", r.bytes_written),
                    ("p2p_bytes", r.p2p_bytes),
                    ("bounce_bytes", r.bounce_bytes),
                    ("zeroed_bytes", r.zeroed_bytes),
                    ("pinned_bytes", r.pinned_bytes),
                    ("lat_min_ns", r.lat_min_ns),
                    ("lat_avg_ns", r.lat_avg_ns),
                    ("lat_max_ns", r.lat_max_ns),
                ] {
                    o.int(k, v);
                }
                o.end()
            })
            .collect();
        outln!("{}", Json::array(&items));
        return Ok(());
    }
    outln!(
        "{:<8} {:<12} {:>7} {:>7} {:>6} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>9} {:>9} {:>9}",
        "kind",
        "device",
        "reads",
        "writes",
        "errors",
        "read MiB",
        "write MiB",
        "p2p MiB",
        "bounce MiB",
        "zero MiB",
        "pinned MiB",
        "min us",
        "avg us",
        "max us"
    );
    let mib = |b: u64| format!("{:.1}", b as f64 / 1048576.0);
    for r in &rows {
        let kind = match r.device {
            p2pdirect::StatDevice::Provider(_) => "provider",
            _ => "block",
        };
        let dev = match r.device {
            p2pdirect::StatDevice::Block { major, minor } => {
                Namespace::name_of(major, minor).unwrap_or_else(|| r.device.to_string())
            }
            _ => r.device.to_string(),
        };
        outln!(
            "{:<8} {:<12} {:>7} {:>7} {:>6} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>9} {:>9} {:>9}",
            kind,
            dev,
            r.reads,
            r.writes,
            r.errors,
            mib(r.bytes_read),
            mib(r.bytes_written),
            mib(r.p2p_bytes),
            mib(r.bounce_bytes),
            mib(r.zeroed_bytes),
            mib(r.pinned_bytes),
            r.lat_min_ns / 1000,
            r.lat_avg_ns / 1000,
            r.lat_max_ns / 1000
        );
    }
    if args.reset {
        outln!("(counters reset)");
    }
    Ok(())
}

/// NVMe -> device memory -> NVMe: a data set written to the namespace from
/// host memory, READ into device memory, checked, WRITTEN back from device
/// memory to a second region, READ again and checked.
fn verify(dev: &Device, args: &Args) -> Result<(), String> {
    // The provider first: the default namespace is one it reaches.
    let gpu = args.gpu(dev)?;
    let ns = args.namespace(&gpu)?;
    // A --dev the provider cannot reach is refused before anything is
    // written (the default is always one it reaches).
    Args::require_reach(&ns, &gpu)?;
    let size = args.size.unwrap_or(16 << 20);
    let src = args.offset.unwrap_or(40 << 20);
    // The data set at `src`, its copy written back at `dst` (`src` plus
    // `size` rounded up to a whole MiB): both inside the namespace.
    let dst = size
        .checked_next_multiple_of(1 << 20)
        .and_then(|s| src.checked_add(s));
    let end = dst.and_then(|d| d.checked_add(size));
    let (Some(dst), Some(end), Ok(len)) = (dst, end, usize::try_from(size)) else {
        return Err(format!(
            "--offset {src} and --size {size} do not fit a namespace"
        ));
    };
    if size == 0 {
        return Err("--size must be more than 0".into());
    }
    // O_DIRECT and the device move whole logical blocks.
    let lbs = u64::from(ns.lbs.max(1));
    if !src.is_multiple_of(lbs) || !size.is_multiple_of(lbs) {
        return Err(format!(
            "--offset {src} and --size {size} must be multiples of {}'s logical block \
             size ({lbs} bytes)",
            ns.name
        ));
    }
    if end > ns.size {
        return Err(format!(
            "{}: --offset {src} and --size {size}{}, with the copy at {dst} (--offset plus \
             --size rounded up to a MiB), do not fit its {} bytes ({})",
            ns.name,
            match (args.offset, args.size) {
                (None, None) => " (the defaults, 40 MiB and 16 MiB)",
                (None, Some(_)) => " (--offset's default, 40 MiB)",
                (Some(_), None) => " (--size's default, 16 MiB)",
                (Some(_), Some(_)) => "",
            },
            ns.size,
            cli::human_bytes(ns.size)
        ));
    }
    let seed = 0x600;
    // The namespace is written over: nobody else may use it (and nothing,
    // not even device memory, is taken when someone does).
    let _claim = ns.claim()?;
    // Device memory first (twice the size: the READ, then the read-back),
    // so that nothing is written when there is not enough of it.
    let mem = size * 2;
    let a = dev.alloc(gpu.index, mem, 0).map_err(|e| {
        format!(
            "ALLOC {mem} bytes (2 x --size) on provider {}: {e}",
            gpu.index
        )
    })?;
    let m = dev.map(&a).map_err(|e| format!("mmap: {e}"))?;
    let file = ns.open(true, true)?;
    // 1. The data set, from host memory.
    let mut data = cli::AlignedBuf::new(len)?;
    fill(data.as_mut(), src, seed);
    cli::pwrite_all(&file, data.as_ref(), src)?;
    // 2. NVMe -> device memory with p2pdirect.
    let io = Io {
        fd: file.as_raw_fd(),
        memory: Memory::Pointer(m.as_ptr()),
        size,
        file_offset: src,
        buf_offset: 0,
        compat: false,
    };
    let t = Instant::now();
    let io_err = |what: &str, e: std::io::Error| io_error(what, &e, &ns, &gpu);
    let r = dev.read(&io).map_err(|e| io_err("READ", e))?;
    let read_s = t.elapsed().as_secs_f64();
    let mut got = vec![0u8; len];
    m.read(0, &mut got).map_err(|e| e.to_string())?;
    let bad_read = cli::count_diff(&got, data.as_ref());
    // 3. Device memory -> NVMe, and back into the second half.
    let t = Instant::now();
    let w = dev
        .write(&Io {
            file_offset: dst,
            ..io
        })
        .map_err(|e| io_err("WRITE", e))?;
    let write_s = t.elapsed().as_secs_f64();
    let r2 = dev
        .read(&Io {
            file_offset: dst,
            buf_offset: size,
            ..io
        })
        .map_err(|e| io_err("READ back", e))?;
    m.read(len, &mut got).map_err(|e| e.to_string())?;
    let mut want = vec![0u8; len];
    fill(&mut want, src, seed);
    let bad_back = cli::count_diff(&got, &want);
    let failures = verify_failures(
        size,
        [("READ", &r), ("WRITE", &w), ("READ back", &r2)],
        bad_read,
        bad_back,
    );
    let ok = failures.is_empty();
    // For the host: what device memory and the namespace must hold, and
    // that the P2P commands' pointers lay in this GPU's BAR.
    let records = if args.records {
        let (bdf, off, nsid) = (gpu.pci_addr, a.provider_offset, ns.nsid);
        vec![
            format!("# HOSTCHECK gpu={bdf} off={off} len={size} ns={nsid} nsoff={src} guard=0"),
            format!(
                "# HOSTCHECK gpu={bdf} off={} len={size} ns={nsid} nsoff={dst} guard=0",
                off + size
            ),
            format!("# NVMECHECK ns={nsid} off={dst} len={size} fill={seed} pos={src}"),
            format!("# DMACHECK ns={nsid} off={src} len={size} where=gpu:{bdf} op=read"),
            format!("# DMACHECK ns={nsid} off={dst} len={size} where=gpu:{bdf}"),
        ]
    } else {
        Vec::new()
    };
    let mibs = |s: f64| size as f64 / 1048576.0 / s;
    if args.json {
        let mut j = Json::obj();
        j.raw("ok", if ok { "true" } else { "false" });
        j.str("namespace", &ns.name);
        j.str("gpu", &gpu.pci_addr.to_string());
        j.int("bytes", size);
        j.num("read_mib_s", mibs(read_s));
        j.num("write_mib_s", mibs(write_s));
        j.int("p2p_bytes", r.p2p_bytes + w.p2p_bytes + r2.p2p_bytes);
        j.int("bad_bytes", (bad_read + bad_back) as u64);
        let why: Vec<String> = failures.iter().map(|f| Json::quote(f)).collect();
        j.raw("failures", &Json::array(&why));
        if args.records {
            // In the one JSON document, not printed before it.
            let quoted: Vec<String> = records.iter().map(|r| Json::quote(r)).collect();
            j.raw("records", &Json::array(&quoted));
        }
        outln!("{}", j.end());
    } else {
        for r in &records {
            outln!("{r}");
        }
        outln!(
            "verify: {}, {} [{:#x}] -> GPU {} -> {} [{:#x}] -> GPU",
            cli::human_bytes(size),
            ns.name,
            src,
            gpu.pci_addr,
            ns.name,
            dst
        );
        outln!(
            "  READ  {:>8.1} MiB/s  p2p {:>9}  {} bytes differ",
            mibs(read_s),
            cli::human_bytes(r.p2p_bytes),
            bad_read
        );
        outln!(
            "  WRITE {:>8.1} MiB/s  p2p {:>9}  (read back: {} bytes differ)",
            mibs(write_s),
            cli::human_bytes(w.p2p_bytes),
            bad_back
        );
        if ok {
            outln!("  OK");
        } else {
            outln!("  FAILED: {}", failures.join("; "));
        }
    }
    if ok {
        Ok(())
    } else {
        Err(format!("verification failed: {}", failures.join("; ")))
    }
}

/// What makes a verify fail, each condition named: every transfer must
/// move all `size` bytes, by P2P DMA, and every byte read must be the one
/// written.
fn verify_failures(
    size: u64,
    done: [(&str, &IoDone); 3],
    bad_read: usize,
    bad_back: usize,
) -> Vec<String> {
    let mut failures = Vec::new();
    for (what, d) in done {
        if d.bytes != size {
            failures.push(format!("{what} moved {} of {size} bytes", d.bytes));
        }
        if d.p2p_bytes != size {
            failures.push(format!(
                "{what} moved {} of {size} bytes by P2P DMA ({} bounced through host memory, \
                 {} zeroed)",
                d.p2p_bytes, d.bounce_bytes, d.zeroed_bytes
            ));
        }
    }
    if bad_read > 0 {
        failures.push(format!("{bad_read} bytes READ into device memory differ"));
    }
    if bad_back > 0 {
        failures.push(format!("{bad_back} bytes WRITTEN and read back differ"));
    }
    failures
}

/// A READ's or WRITE's error; `EREMOTEIO` says what it means.
fn io_error(what: &str, e: &std::io::Error, ns: &Namespace, gpu: &p2pdirect::Provider) -> String {
    let hint = if e.raw_os_error() == Some(libc::EREMOTEIO) {
        format!(
            " ({} cannot reach provider {} ({}) by P2P DMA; see p2pd info's reachability \
             matrix)",
            ns.name, gpu.index, gpu.pci_addr
        )
    } else {
        String::new()
    };
    format!("{what}: {e}{hint}")
}

fn main() -> ExitCode {
    // Any bytes: a word that is not UTF-8 is refused with a message (or,
    // as --out's file name, taken as it is), never a panic.
    let argv: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    // `p2pd help [COMMAND]`, `p2pd COMMAND --help`: the usage, which
    // describes every command, on standard output.
    let (cmd, args) = match cli::parse_command_line(&argv) {
        Ok(CommandLine::Help) => {
            outln!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Ok(CommandLine::Run(cmd, args)) => (cmd, args),
        Err(e) => {
            errln!("p2pd: {e}");
            return usage();
        }
    };
    let run: fn(&Device, &Args) -> Result<(), String> = match cmd.as_str() {
        "version" => show_version,
        "info" => info,
        "stats" => stats,
        "verify" => verify,
        "bench" => bench::run,
        _ => return usage(),
    };
    // What only looks opens the device read-only, so that a node widened
    // for reading serves it; what allocates or resets needs O_RDWR.
    let looks = matches!(cmd.as_str(), "version" | "info") || (cmd == "stats" && !args.reset);
    let open = if looks {
        Device::open_read_only
    } else {
        Device::open
    };
    // Every command first checks that the module speaks the tool's ABI.
    let result = open()
        .map_err(|e| {
            let hint = match e.raw_os_error() {
                Some(libc::ENOENT) => " (is p2pdirect.ko loaded? insmod p2pdirect.ko)",
                Some(libc::EACCES) => {
                    " (root only by default: run as root, or widen the node with a udev rule)"
                }
                _ => "",
            };
            format!("{}: {e}{hint}", p2pdirect::DEVICE_PATH)
        })
        .and_then(|d| version(&d).and_then(|_| run(&d, &args)));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            errln!("p2pd: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cli::Leg;
    use p2pdirect::PciAddr;

    fn stacked(name: &str, kind: &str, dm: Option<&str>, over: Option<&str>) -> Stacked {
        Stacked {
            name: name.into(),
            kind: kind.into(),
            dm_name: dm.map(str::to_string),
            legs: vec![
                Leg {
                    name: "nvme7n1p2".into(),
                    pci: Some(PciAddr(0x0b00)),
                },
                Leg {
                    name: "dm-3".into(),
                    pci: None,
                },
            ],
            over_limit: over.map(str::to_string),
        }
    }

    const ELOOP: &str = "more than 4 levels of stacking (ELOOP)";

    #[test]
    fn dm_has_no_p2pdma_and_its_name_is_a_name() {
        let deep5 = stacked("dm-5", "dm", Some("p2pdeep5"), Some(ELOOP));
        let line = stacked_line(&deep5, &[], false);
        assert!(
            line.starts_with(
                "  dm-5 dm named p2pdeep5: nvme7n1p2 (0000:0b:00.0), dm-3 (no PCI device); "
            ),
            "{line}"
        );
        assert!(
            line.contains("no P2PDMA (EOPNOTSUPP; COMPAT bounces)"),
            "{line}"
        );
        // The guest's grep: the refusal ends the line.
        assert!(
            line.ends_with(&format!("refused by p2pdirect: {ELOOP}")),
            "{line}"
        );
        let deep4 = stacked("dm-4", "dm", Some("p2pdeep4"), None);
        let line = stacked_line(&deep4, &[], false);
        assert!(
            line.ends_with("; no P2PDMA (EOPNOTSUPP; COMPAT bounces)"),
            "{line}"
        );
        assert!(
            !line.contains("refused") && !line.contains("reachable by all"),
            "{line}"
        );
        assert_eq!(
            stacked_json(&deep5, &[]),
            format!(
                "{{\"device\":\"dm-5\",\"kind\":\"dm\",\"name\":\"p2pdeep5\",\"p2pdma\":false,\
                 \"legs\":[{{\"device\":\"nvme7n1p2\",\"controller\":\"0000:0b:00.0\"}},\
                 {{\"device\":\"dm-3\",\"controller\":null}}],\"unreachable_legs\":[],\
                 \"unreachable\":[],\"refused\":\"{ELOOP}\"}}"
            )
        );
    }

    #[test]
    fn md_reachability_and_no_providers() {
        let md1 = stacked("md1", "md raid1", None, None);
        assert!(stacked_line(&md1, &[], false).ends_with("; reachable by all providers"));
        let none = stacked_line(&md1, &[], true);
        assert!(
            none.ends_with("; no device-memory provider to reach it"),
            "{none}"
        );
        let bad = vec![("nvme9n1p1".to_string(), vec![0, 1])];
        let md2 = stacked("md2", "md raid1", None, None);
        let line = stacked_line(&md2, &bad, false);
        assert!(
            line.ends_with("; unreachable: nvme9n1p1 from provider 0,1 (I/O needs COMPAT)"),
            "{line}"
        );
        let json = stacked_json(&md2, &bad);
        assert!(
            json.starts_with(
                "{\"device\":\"md2\",\"kind\":\"md raid1\",\"name\":null,\"p2pdma\":true,"
            ),
            "{json}"
        );
        assert!(json.ends_with("\"unreachable_legs\":[\"nvme9n1p1\"],\"unreachable\":[{\"leg\":\"nvme9n1p1\",\"providers\":[0,1]}],\"refused\":null}"), "{json}");
        let md6 = stacked("md6", "md raid1", None, Some(ELOOP));
        let line = stacked_line(&md6, &[], false);
        assert!(
            line.ends_with(&format!("; refused by p2pdirect: {ELOOP}")),
            "{line}"
        );
        assert!(!line.contains("reachable"), "{line}");
    }

    #[test]
    fn usage_documents_every_option() {
        for cmd in ["version", "info", "stats", "verify", "bench"] {
            let opts = cli::options_of(cmd).unwrap_or(&[]);
            for opt in opts {
                let line = USAGE.lines().find(|l| l.starts_with(&format!("  {opt} ")));
                assert!(line.is_some(), "{cmd} {opt}");
            }
        }
        assert!(USAGE.contains(&format!(
            "--seconds S      bench: per run, {} <= S < {}, default 1",
            cli::MIN_SECONDS,
            cli::MAX_SECONDS
        )));
        assert!(USAGE.contains(&format!(
            "each 1-{}, default 1,4,16,32,64",
            p2pdirect::uring::MAX_INFLIGHT
        )));
        assert!(USAGE.contains("help [COMMAND], COMMAND --help, COMMAND -h"));
    }

    #[test]
    fn eremoteio_says_what_it_means() {
        let ns = cli::tests::namespace(256 << 20);
        let gpu = cli::tests::provider(None);
        let e = io_error(
            "READ",
            &std::io::Error::from_raw_os_error(libc::EREMOTEIO),
            &ns,
            &gpu,
        );
        assert!(e.starts_with("READ: Remote I/O error"), "{e}");
        assert!(
            e.contains("nvme4n1 cannot reach provider 1 (0000:03:00.0)") && e.contains("p2pd info"),
            "{e}"
        );
        let e = io_error(
            "WRITE",
            &std::io::Error::from_raw_os_error(libc::EIO),
            &ns,
            &gpu,
        );
        assert!(!e.contains("p2pd info"), "{e}");
    }

    #[test]
    fn verify_names_why_it_failed() {
        let size = 8 << 20;
        let p2p = IoDone {
            bytes: size,
            p2p_bytes: size,
            ..IoDone::default()
        };
        assert!(verify_failures(
            size,
            [("READ", &p2p), ("WRITE", &p2p), ("READ back", &p2p)],
            0,
            0
        )
        .is_empty());
        let bounced = IoDone {
            bytes: size,
            bounce_bytes: size,
            ..IoDone::default()
        };
        let f = verify_failures(
            size,
            [("READ", &bounced), ("WRITE", &p2p), ("READ back", &p2p)],
            0,
            0,
        );
        assert_eq!(f, [format!("READ moved 0 of {size} bytes by P2P DMA ({size} bounced through host memory, 0 zeroed)")]);
        let short = IoDone {
            bytes: 4096,
            p2p_bytes: 4096,
            ..IoDone::default()
        };
        let f = verify_failures(
            size,
            [("READ", &p2p), ("WRITE", &short), ("READ back", &p2p)],
            0,
            3,
        );
        assert_eq!(f[0], format!("WRITE moved 4096 of {size} bytes"));
        assert_eq!(f[2], "3 bytes WRITTEN and read back differ");
    }
}
