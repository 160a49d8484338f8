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

/// Standard output failed: status 1, with the reason unless the reader
/// went away (`p2pd info | head -1`), which needs none.
fn stdout_failed(e: std::io::Error) -> ! {
    if e.kind() != std::io::ErrorKind::BrokenPipe {
        eprintln!("p2pd: standard output: {e}");
    }
    std::process::exit(1)
}

#[path = "../bench.rs"]
mod bench;
#[path = "../cli.rs"]
mod cli;

use cli::{Args, Json, Namespace, Stacked};
use p2pdirect::{fill, sys, Device, Io, Memory, Version};
use std::{os::fd::AsRawFd, process::ExitCode, time::Instant};

const USAGE: &str = "usage: p2pd <command> [options]
  version [--json]             module and ABI version
  info [--json]                providers, NVMe namespaces, reachability matrix
  stats [--json] [--reset]     I/O statistics per provider and block device
  verify [--dev NS] [--gpu I] [--offset B] [--size B] [--records] [--json]
                               NVMe -> device memory -> NVMe, every byte checked
  bench [--dev NS] [--gpu I] [--seconds S] [--rounds R] [--threads N] [--qd N[,N...]]
        [--offset B] [--size B] [--only 'PATH WORKLOAD']... [--out FILE] [--json]
                               p2pdirect vs upstream sysfs P2PDMA vs bounce vs buffered;
                               io_uring paths at each queue depth (default 1,4,16,32,64);
                               each run repeated R times (default 3), the median kept
  help                         this text
Exit status: 0 done, 1 failed (the message says why), 2 bad command line.";

fn usage() -> ExitCode {
    eprintln!("{USAGE}");
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
    // of a device the module refuses: its legs are not all known).
    let unreachable = |st: &Stacked| -> Vec<(String, Vec<u32>)> {
        if st.over_limit.is_some() {
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
            .map(|st| {
                let mut o = Json::obj();
                o.str("device", &st.name);
                o.str("kind", &st.kind);
                let legs: Vec<String> = st
                    .legs
                    .iter()
                    .map(|l| {
                        let mut lo = Json::obj();
                        lo.str("device", &l.name);
                        lo.str(
                            "controller",
                            &l.pci.map_or(String::new(), |a| a.to_string()),
                        );
                        lo.end()
                    })
                    .collect();
                o.raw("legs", &Json::array(&legs));
                let bad = unreachable(st);
                let names: Vec<String> = bad.iter().map(|(leg, _)| format!("\"{leg}\"")).collect();
                o.raw("unreachable_legs", &Json::array(&names));
                // Each of those legs with the providers it cannot reach, as
                // the text says them.
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
                match &st.over_limit {
                    Some(why) => o.str("refused", why),
                    None => o.raw("refused", "null"),
                }
                o.end()
            })
            .collect();
        j.raw("stacked", &Json::array(&sts));
        outln!("{}", j.end());
        return Ok(());
    }
    outln!("{v}");
    outln!("device-memory providers: {}", providers.len());
    outln!(
        "  {:>3}  {:<9}  {:<12}  {:>4}  {:>8}  {:>12}  {:>8}  {:>8}",
        "idx",
        "kind",
        "pci",
        "bar",
        "size MiB",
        "bus addr",
        "free MiB",
        "used MiB"
    );
    for p in &providers {
        outln!(
            "  {:>3}  {:<9}  {:<12}  {:>4}  {:>8}  {:>#12x}  {:>8}  {:>8}",
            p.index,
            cli::provider_kind(p.kind),
            p.pci_addr.to_string(),
            p.bar,
            p.bar_size >> 20,
            p.bus_addr,
            p.bytes_free >> 20,
            p.bytes_used >> 20
        );
    }
    outln!("NVMe namespaces: {}", namespaces.len());
    outln!(
        "  {:<10}  {:>4}  {:<12}  {:<16}  {:>9}  {:>5}",
        "device",
        "nsid",
        "controller",
        "serial",
        "size MiB",
        "lbs"
    );
    for ns in &namespaces {
        outln!(
            "  {:<10}  {:>4}  {:<12}  {:<16}  {:>9}  {:>5}",
            ns.name,
            ns.nsid,
            ns.pci.map_or("-".into(), |a| a.to_string()),
            ns.serial,
            ns.size >> 20,
            ns.lbs
        );
    }
    outln!("stacked block devices: {}", stacked.len());
    for st in &stacked {
        let legs: Vec<String> = st
            .legs
            .iter()
            .map(|l| {
                let pci = l.pci.map_or("no PCI device".into(), |a| a.to_string());
                format!("{} ({pci})", l.name)
            })
            .collect();
        let bad = unreachable(st);
        let reach = if let Some(why) = &st.over_limit {
            format!("refused by p2pdirect: {why}")
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
        };
        outln!("  {} {}: {}; {reach}", st.name, st.kind, legs.join(", "));
    }
    outln!("P2P reachability (kernel P2PDMA distance; '-' = not reachable, I/O needs COMPAT):");
    out!("  {:<14}", "provider");
    for ns in &namespaces {
        out!(" {:>10}", ns.name);
    }
    outln!();
    for p in &providers {
        out!("  {:<3} {:<10}", p.index, p.pci_addr.to_string());
        for ns in &namespaces {
            let d = distance(p, ns).map_or("-".to_string(), |d| d.to_string());
            out!(" {:>10}", d);
        }
        outln!();
    }
    Ok(())
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
            "{}: --offset {src} and --size {size}, with the copy at {dst} (--offset plus \
             --size rounded up to a MiB), do not fit its {} bytes",
            ns.name, ns.size
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
    let r = dev.read(&io).map_err(|e| format!("READ: {e}"))?;
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
        .map_err(|e| format!("WRITE: {e}"))?;
    let write_s = t.elapsed().as_secs_f64();
    let r2 = dev
        .read(&Io {
            file_offset: dst,
            buf_offset: size,
            ..io
        })
        .map_err(|e| format!("READ back: {e}"))?;
    m.read(len, &mut got).map_err(|e| e.to_string())?;
    let mut want = vec![0u8; len];
    fill(&mut want, src, seed);
    let bad_back = cli::count_diff(&got, &want);
    let ok = bad_read == 0
        && bad_back == 0
        && r.bytes == size
        && w.bytes == size
        && r2.bytes == size
        && r.p2p_bytes == size
        && w.p2p_bytes == size;
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
        outln!("  {}", if ok { "OK" } else { "FAILED" });
    }
    if ok {
        Ok(())
    } else {
        Err("verification failed".into())
    }
}

fn main() -> ExitCode {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let Some((cmd, rest)) = argv.split_first() else {
        return usage();
    };
    // `p2pd help [COMMAND]`, `p2pd COMMAND --help`: the usage, which
    // describes every command, on standard output.
    // (`options_of` knows every command, `help` among them.)
    let is_help = |a: &String| matches!(a.as_str(), "help" | "--help" | "-h");
    let is_command = |a: &String| cli::options_of(a).is_some();
    if (is_help(cmd) && rest.iter().all(is_command))
        || (is_command(cmd) && rest.iter().any(|a| a == "--help" || a == "-h"))
    {
        outln!("{USAGE}");
        return ExitCode::SUCCESS;
    }
    if cli::options_of(cmd).is_none() {
        eprintln!("p2pd: unknown command '{cmd}'");
        return usage();
    }
    let args = match Args::parse(cmd, rest) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("p2pd: {e}");
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
            eprintln!("p2pd: {e}");
            ExitCode::FAILURE
        }
    }
}
