// SPDX-License-Identifier: GPL-2.0
//! p2pd's plumbing: arguments, NVMe namespaces from sysfs, aligned host
//! buffers, a JSON writer (no dependencies), progress.

use p2pdirect::{sys, Device, PciAddr, Provider};
use std::{
    ffi::{OsStr, OsString},
    fs,
    io::Write,
    os::unix::{ffi::OsStrExt, fs::OpenOptionsExt},
    path::PathBuf,
};

/// Options shared by the commands.
#[derive(Default, Debug)]
pub struct Args {
    pub json: bool,
    pub reset: bool,
    pub records: bool,
    pub dev: Option<String>,
    pub gpu: Option<u32>,
    pub offset: Option<u64>,
    pub size: Option<u64>,
    pub seconds: Option<f64>,
    pub threads: Option<usize>,
    /// bench --out: any file name, UTF-8 or not.
    pub out: Option<PathBuf>,
    /// bench: only the runs whose "PATH WORKLOAD" contains one of these.
    pub only: Vec<String>,
    /// bench: the queue depths of the io_uring runs.
    pub qd: Vec<u32>,
    /// bench: how many times each run is repeated (interleaved).
    pub rounds: Option<usize>,
    /// The options given, in order (a value option other than `--qd` and
    /// `--only` may be given once).
    pub given: Vec<String>,
}

/// What a command line asks for.
#[derive(Debug)]
pub enum CommandLine {
    /// `p2pd help [COMMAND]`, `p2pd COMMAND --help`: the usage.
    Help,
    /// A command and its options.
    Run(String, Box<Args>),
}

/// The commands that take options (see [`options_of`]).
const COMMANDS: &[&str] = &["version", "info", "stats", "verify", "bench"];

/// The options that take a value (the next word, whatever it is: the word
/// after `--out` is never the help flag).
const VALUE_OPTIONS: &[&str] = &[
    "--dev",
    "--gpu",
    "--offset",
    "--size",
    "--seconds",
    "--rounds",
    "--threads",
    "--qd",
    "--only",
    "--out",
];

/// bench --seconds: at least a millisecond per run, under an hour.
pub const MIN_SECONDS: f64 = 0.001;
pub const MAX_SECONDS: f64 = 3600.0;

/// The options that may be given more than once (their values add up).
const REPEATABLE: &[&str] = &["--qd", "--only"];

/// The options each command takes (`None`: no such command).
pub fn options_of(cmd: &str) -> Option<&'static [&'static str]> {
    Some(match cmd {
        "version" | "info" => &["--json"],
        "stats" => &["--json", "--reset"],
        "verify" => &[
            "--dev",
            "--gpu",
            "--offset",
            "--size",
            "--records",
            "--json",
        ],
        "bench" => &[
            "--dev",
            "--gpu",
            "--seconds",
            "--rounds",
            "--threads",
            "--qd",
            "--offset",
            "--size",
            "--only",
            "--out",
            "--json",
        ],
        "help" | "--help" | "-h" => &[],
        _ => return None,
    })
}

/// A whole number as p2pd takes it: decimal digits, or `0x` or `0X` and
/// hex digits; no sign, space or `_` (Rust's own parser takes a leading
/// `+`, which p2pd refuses like any other stray character).
fn parse_whole(s: &str) -> Result<u64, std::num::IntErrorKind> {
    use std::num::IntErrorKind;
    let (digits, radix) = match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(h) => (h, 16),
        None => (s, 10),
    };
    if digits.is_empty() {
        return Err(IntErrorKind::Empty);
    }
    if !digits.chars().all(|c| c.is_digit(radix)) {
        return Err(IntErrorKind::InvalidDigit);
    }
    u64::from_str_radix(digits, radix).map_err(|e| *e.kind())
}

/// A count given to option `opt`: a whole number in `range`, or a
/// message that repeats the value and says what is taken.
fn parse_count(opt: &str, v: &str, range: std::ops::RangeInclusive<u32>) -> Result<u32, String> {
    parse_whole(v)
        .ok()
        .and_then(|n| u32::try_from(n).ok())
        .filter(|n| range.contains(n))
        .ok_or_else(|| {
            format!(
                "{opt} takes a whole number {}..{} ('{v}' given)",
                range.start(),
                range.end()
            )
        })
}

/// `4096`, `128k`, `1M`, `4m`, `0x1000`.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let (num, mult) = match s.as_bytes().last() {
        Some(b'k' | b'K') => (&s[..s.len() - 1], 1u64 << 10),
        Some(b'm' | b'M') => (&s[..s.len() - 1], 1 << 20),
        Some(b'g' | b'G') => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    let v = parse_whole(num).map_err(|e| match e {
        std::num::IntErrorKind::PosOverflow => format!("'{s}' is too big"),
        _ => format!(
            "'{s}' is not a size (a number of bytes, decimal or 0x hex, with an optional \
             k, M or G suffix)"
        ),
    })?;
    v.checked_mul(mult).ok_or(format!("'{s}' is too big"))
}

/// The help flag, in an option's position.
fn is_help_flag(w: &OsStr) -> bool {
    w == "--help" || w == "-h"
}

/// A word that is an option wherever it stands, so never a value:
/// `--dev --json` is `--dev` without its value, and so is `--out -h`.
fn is_option_word(w: &OsStr) -> bool {
    w.as_bytes().starts_with(b"--") || w == "-h"
}

/// An argument as a message shows it: as given when it is UTF-8, with
/// `\xNN` escapes where it is not.
fn shown(w: &OsStr) -> String {
    match w.to_str() {
        Some(s) => format!("'{s}'"),
        None => format!("{w:?}"),
    }
}

/// The argument as a string: p2pd's arguments are UTF-8 (but `--out`'s
/// file name, which may be any bytes).
fn utf8<'a>(w: &'a OsStr, what: &str) -> Result<&'a str, String> {
    w.to_str().ok_or_else(|| {
        format!(
            "{what}{} is not valid UTF-8 (only the FILE of --out may be any bytes)",
            shown(w)
        )
    })
}

/// Whether `argv`, the words after a command, ask for help: `--help` or
/// `-h` in an option's position (the word after an option that takes a
/// value is that value's position: `--out -h` is `--out` without a value).
fn wants_help(argv: &[OsString]) -> bool {
    let mut it = argv.iter();
    while let Some(w) = it.next() {
        if is_help_flag(w) {
            return true;
        }
        if w.to_str().is_some_and(|o| VALUE_OPTIONS.contains(&o)) {
            it.next();
        }
    }
    false
}

/// The command line (without the program's name): help, or a command and
/// its options. An error is a command line that does not parse (exit 2).
pub fn parse_command_line(argv: &[OsString]) -> Result<CommandLine, String> {
    let Some((first, rest)) = argv.split_first() else {
        return Err("no command given".into());
    };
    let cmd = utf8(first, "command ")?;
    if matches!(cmd, "help" | "--help" | "-h") {
        // `p2pd help [COMMAND]`: the words after it name commands.
        for w in rest {
            let w = utf8(w, "argument ")?;
            if options_of(w).is_none() {
                return Err(if w.starts_with('-') {
                    format!("help takes a command name, not an option ('{w}' given)")
                } else {
                    format!("unknown command '{w}'")
                });
            }
        }
        return Ok(CommandLine::Help);
    }
    if options_of(cmd).is_none() {
        return Err(format!("unknown command '{cmd}'"));
    }
    if wants_help(rest) {
        return Ok(CommandLine::Help);
    }
    Ok(CommandLine::Run(
        cmd.to_string(),
        Box::new(Args::parse(cmd, rest)?),
    ))
}

/// The value of option `opt`: the next word, unless there is none or it is
/// an option.
fn value<'a>(it: &mut std::slice::Iter<'a, OsString>, opt: &str) -> Result<&'a OsStr, String> {
    match it.next() {
        None => Err(format!("{opt} needs a value")),
        Some(v) if is_option_word(v) => Err(format!(
            "{opt} needs a value ({} is an option, never a value)",
            shown(v)
        )),
        Some(v) => Ok(v),
    }
}

/// The value of option `opt` as a string.
fn value_str<'a>(it: &mut std::slice::Iter<'a, OsString>, opt: &str) -> Result<&'a str, String> {
    utf8(value(it, opt)?, &format!("{opt}: the value "))
}

impl Args {
    /// The options of `cmd` (whose help flags [`parse_command_line`] has
    /// handled); one it does not take is refused before any value is
    /// looked at (`stats --qd 0`: "stats does not take --qd").
    pub fn parse(cmd: &str, argv: &[OsString]) -> Result<Self, String> {
        let mut a = Args::default();
        let mut it = argv.iter();
        while let Some(word) = it.next() {
            let opt = utf8(word, "argument ")?;
            if is_help_flag(word) {
                continue;
            }
            let takes = options_of(cmd).unwrap_or(&[]);
            // Only options: a word that is none is out of place.
            if !opt.starts_with('-') || opt == "-" {
                return Err(format!(
                    "unexpected argument '{opt}' ({cmd} takes {})",
                    if takes.is_empty() {
                        "nothing".to_string()
                    } else {
                        format!("options only: {}", takes.join(" "))
                    }
                ));
            }
            // An option of another command: refused for this one.
            let known = |o: &str| {
                COMMANDS
                    .iter()
                    .any(|c| options_of(c).is_some_and(|t| t.contains(&o)))
            };
            // `--size=16M`: the option and its value are two words.
            if let Some((name, v)) = opt.split_once('=').filter(|(n, _)| known(n)) {
                Self::check_one(cmd, name)?;
                return Err(if VALUE_OPTIONS.contains(&name) {
                    format!("unknown option '{opt}' (use {name} {v}: an option and its value are two words)")
                } else {
                    format!("unknown option '{opt}' ({name} takes no value)")
                });
            }
            if known(opt) {
                Self::check_one(cmd, opt)?;
            }
            if VALUE_OPTIONS.contains(&opt)
                && !REPEATABLE.contains(&opt)
                && a.given.iter().any(|g| g == opt)
            {
                return Err(format!(
                    "{opt} given twice (only {} may be repeated)",
                    REPEATABLE.join(" and ")
                ));
            }
            a.given.push(opt.to_string());
            match opt {
                "--json" => a.json = true,
                "--reset" => a.reset = true,
                "--records" => a.records = true,
                "--dev" => a.dev = Some(value_str(&mut it, opt)?.to_string()),
                "--gpu" => {
                    let v = value_str(&mut it, opt)?;
                    a.gpu = Some(
                        parse_whole(v)
                            .ok()
                            .and_then(|n| u32::try_from(n).ok())
                            .ok_or_else(|| {
                                format!(
                                    "--gpu takes an index, as `p2pd info` shows it ('{v}' given)"
                                )
                            })?,
                    )
                }
                "--offset" | "--size" => {
                    let v = Some(
                        parse_size(value_str(&mut it, opt)?).map_err(|e| format!("{opt}: {e}"))?,
                    );
                    if opt == "--offset" {
                        a.offset = v
                    } else {
                        a.size = v
                    }
                }
                "--seconds" => {
                    let v = value_str(&mut it, opt)?;
                    // f64's syntax (`0.5`, `5e-1`; `inf` and `NaN` fail the
                    // range below) without a sign, as the counts.
                    let s = Some(v)
                        .filter(|v| !v.starts_with('+'))
                        .and_then(|v| v.parse::<f64>().ok())
                        .ok_or_else(|| {
                            format!("--seconds takes a number such as 2 or 0.5 ('{v}' given)")
                        })?;
                    if !(MIN_SECONDS..MAX_SECONDS).contains(&s) {
                        return Err(format!(
                            "--seconds must be at least {MIN_SECONDS} and under {MAX_SECONDS} ('{v}' given)"
                        ));
                    }
                    a.seconds = Some(s)
                }
                "--threads" => {
                    let n = parse_count(opt, value_str(&mut it, opt)?, 1..=64)?;
                    a.threads = Some(n as usize)
                }
                "--out" => a.out = Some(PathBuf::from(value(&mut it, opt)?)),
                "--only" => a.only.push(value_str(&mut it, opt)?.to_string()),
                "--rounds" => {
                    let v = value_str(&mut it, opt)?;
                    let n = parse_count(opt, v, 1..=15)?;
                    if n.is_multiple_of(2) {
                        return Err(format!(
                            "--rounds must be odd, 1..15 (the median round is kept; '{v}' given)"
                        ));
                    }
                    a.rounds = Some(n as usize)
                }
                // Repeated, the depths add up: `--qd 1,4 --qd 16` runs three.
                "--qd" => {
                    for q in value_str(&mut it, opt)?.split(',') {
                        let n = parse_count(opt, q, 1..=p2pdirect::uring::MAX_INFLIGHT).map_err(
                            |e| format!("{e}; depths are comma-separated: 32 or 1,4,16"),
                        )?;
                        // `--qd 4,4` runs QD 4 once.
                        if !a.qd.contains(&n) {
                            a.qd.push(n);
                        }
                    }
                }
                _ => return Err(format!("unknown option '{opt}'")),
            }
        }
        Ok(a)
    }

    /// Refuses option `opt` if `cmd` does not take it (`stats --qd 4`
    /// would otherwise be ignored without a word).
    fn check_one(cmd: &str, opt: &str) -> Result<(), String> {
        let takes = options_of(cmd).ok_or(format!("unknown command '{cmd}'"))?;
        if takes.contains(&opt) {
            Ok(())
        } else if takes.is_empty() {
            Err(format!("{cmd} takes no option ({opt} given)"))
        } else {
            Err(format!(
                "{cmd} does not take {opt} (it takes {})",
                takes.join(" ")
            ))
        }
    }

    /// `--dev`, else the first namespace provider `gpu` can reach.
    pub fn namespace(&self, gpu: &Provider) -> Result<Namespace, String> {
        let all = Namespace::all();
        if let Some(d) = &self.dev {
            let name = d.trim_start_matches("/dev/");
            return all
                .into_iter()
                .find(|n| n.name == name)
                .ok_or(format!("{d}: not an NVMe namespace"));
        }
        let dev = Device::open().map_err(|e| e.to_string())?;
        let providers = dev.providers().map_err(|e| e.to_string())?;
        // A namespace the provider the command uses reaches.
        let reach = |n: &Namespace| {
            providers
                .iter()
                .any(|p| p.index == gpu.index && n.distance_from(p).is_some())
        };
        let mut cands: Vec<Namespace> = all.into_iter().filter(reach).collect();
        cands.sort_by_key(|n| n.nsid);
        if cands.is_empty() {
            return Err(format!(
                "no NVMe namespace is P2P-reachable from provider {} ({}); use --dev",
                gpu.index, gpu.pci_addr
            ));
        }
        // Never a default that has data someone uses: partitioned, held by
        // md or dm, or mounted.
        cands
            .into_iter()
            .find(|n| !n.has_users() && n.claim().is_ok())
            .ok_or(format!(
                "every NVMe namespace P2P-reachable from provider {} ({}) is partitioned or \
                 in use; name one with --dev (its data in the region used is overwritten)",
                gpu.index, gpu.pci_addr
            ))
    }

    /// Refuses namespace `ns` if provider `gpu` cannot reach it: the check
    /// the default choice makes, so that `--dev` of an unreachable
    /// namespace is refused before anything is written to it (its READ
    /// would fail with `EREMOTEIO`).
    pub fn require_reach(ns: &Namespace, gpu: &Provider) -> Result<(), String> {
        if ns.distance_from(gpu).is_some() {
            return Ok(());
        }
        Err(format!(
            "provider {} ({}) cannot reach {} by P2P DMA (no P2PDMA distance between them; \
             see p2pd info's reachability matrix): refused, nothing written; choose another \
             --dev or --gpu",
            gpu.index, gpu.pci_addr, ns.name
        ))
    }

    /// `--gpu`, else the first BAR provider.
    pub fn gpu(&self, dev: &Device) -> Result<Provider, String> {
        let providers = dev
            .providers()
            .map_err(|e| format!("LIST_PROVIDERS: {e}"))?;
        if let Some(p) = providers
            .iter()
            .find(|p| Some(p.index) == self.gpu && p.kind != sys::P2PDIRECT_PROVIDER_BAR)
        {
            return Err(format!(
                "provider {} is {} memory of {}, not a BAR provider (device memory to \
                 allocate); see p2pd info",
                p.index,
                provider_kind(p.kind),
                p.pci_addr
            ));
        }
        providers
            .into_iter()
            .filter(|p| p.kind == sys::P2PDIRECT_PROVIDER_BAR)
            .find(|p| self.gpu.is_none_or(|g| g == p.index))
            .ok_or(match self.gpu {
                Some(g) => format!("--gpu {g}: no such device-memory provider (see p2pd info)"),
                None => "no device-memory provider (see p2pd info)".into(),
            })
    }
}

pub fn provider_kind(kind: u32) -> &'static str {
    match kind {
        sys::P2PDIRECT_PROVIDER_BAR => "bar",
        sys::P2PDIRECT_PROVIDER_PUBLISHED => "published",
        _ => "?",
    }
}

/// An NVMe namespace, from /sys/block.
#[derive(Clone, Debug)]
pub struct Namespace {
    pub name: String,
    pub nsid: u32,
    pub serial: String,
    /// The controller's PCI function (`None` for a multipath head).
    pub pci: Option<PciAddr>,
    /// A multipath head's paths: their controllers' PCI functions.
    pub paths: Vec<PciAddr>,
    pub size: u64,
    pub lbs: u32,
}

fn read_trim(p: impl AsRef<std::path::Path>) -> Option<String> {
    fs::read_to_string(p).ok().map(|s| s.trim().to_string())
}

/// The PCI functions of the controllers of the paths of the multipath head
/// `head` (its legs).
fn mpath_controllers(head: &str) -> Vec<PciAddr> {
    legs_of(head).iter().filter_map(|p| pci_above(p)).collect()
}

/// A path of an NVMe multipath head (`nvme1c2n1`): hidden, no device node.
fn is_mpath_path(name: &str) -> bool {
    let Some(rest) = name.strip_prefix("nvme") else {
        return false;
    };
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    rest.split_once('c').is_some_and(|(subsys, tail)| {
        digits(subsys)
            && tail
                .split_once('n')
                .is_some_and(|(c, n)| digits(c) && digits(n))
    })
}

/// A stacked block device (md, dm, an NVMe multipath head), from /sys/block:
/// the leaves under it that sit on a PCI controller.
#[derive(Clone, Debug)]
pub struct Stacked {
    pub name: String,
    /// `md raid1` (md's level), `dm`, `nvme multipath`.
    pub kind: String,
    /// A device-mapper device's name (`dm/name`, which its creator chose;
    /// sysfs does not say its target type).
    pub dm_name: Option<String>,
    pub legs: Vec<Leg>,
    /// Why p2pdirect refuses the device (DMA_PROBE's `ELOOP` or `E2BIG`):
    /// it is stacked past the UAPI's limits.
    pub over_limit: Option<String>,
}

/// A leaf under a stacked device: a namespace, a partition, an NVMe path.
#[derive(Clone, Debug)]
pub struct Leg {
    pub name: String,
    pub pci: Option<PciAddr>,
}

/// The PCI function closest above a block device in the sysfs device tree.
fn pci_above(block: &str) -> Option<PciAddr> {
    let real = fs::canonicalize(format!("/sys/class/block/{block}")).ok()?;
    real.components()
        .filter_map(|c| parse_bdf(&c.as_os_str().to_string_lossy()))
        .next_back()
}

/// The block devices a stacked device lists as its legs (md, dm: slaves/;
/// NVMe multipath: multipath/).
fn legs_of(block: &str) -> Vec<String> {
    // A partition's legs are its disk's.
    let dir = fs::canonicalize(format!("/sys/class/block/{block}")).ok();
    let disk = match &dir {
        Some(d) if d.join("partition").exists() => d.parent().map(|p| p.to_path_buf()),
        d => d.clone(),
    };
    let Some(disk) = disk else { return Vec::new() };
    let mut out: Vec<String> = ["slaves", "multipath"]
        .iter()
        .filter_map(|sub| fs::read_dir(disk.join(sub)).ok())
        .flat_map(|d| d.flatten())
        .map(|e| e.file_name().to_string_lossy().to_string())
        .collect();
    out.sort();
    out
}

/// The leaves under `block`, `depth` levels below the device asked about,
/// followed as the module follows them: a device with no PCI function above
/// it at depth `P2PDIRECT_STACK_MAX_DEPTH` is a leaf here and sets
/// `too_deep` (the module refuses it, legs or not).
fn leaves(block: &str, depth: u32, out: &mut Vec<Leg>, too_deep: &mut bool) {
    if let Some(pci) = pci_above(block) {
        out.push(Leg {
            name: block.to_string(),
            pci: Some(pci),
        });
        return;
    }
    let legs = legs_of(block);
    if legs.is_empty() || depth >= sys::P2PDIRECT_STACK_MAX_DEPTH {
        *too_deep |= depth >= sys::P2PDIRECT_STACK_MAX_DEPTH;
        out.push(Leg {
            name: block.to_string(),
            pci: None,
        });
        return;
    }
    for l in legs {
        leaves(&l, depth + 1, out, too_deep);
    }
}

/// What the module says of a stack with these leaves, if it refuses it,
/// counting the leaves on a PCI function as it does. A stack past both
/// limits is named too deep here; the module returns whichever error its
/// walk meets first.
fn over_limit(legs: &[Leg], too_deep: bool) -> Option<String> {
    let pci_legs = legs.iter().filter(|l| l.pci.is_some()).count();
    if too_deep {
        Some(format!(
            "more than {} levels of stacking (ELOOP)",
            sys::P2PDIRECT_STACK_MAX_DEPTH
        ))
    } else if pci_legs > sys::P2PDIRECT_STACK_MAX_LEGS as usize {
        Some(format!(
            "more than {} legs (E2BIG)",
            sys::P2PDIRECT_STACK_MAX_LEGS
        ))
    } else {
        None
    }
}

impl Stacked {
    /// Whether the block layer takes P2PDMA pages for the device: not for
    /// device-mapper, which does not advertise `BLK_FEAT_PCI_P2PDMA` in
    /// Linux 7.2 and 7.3, so p2pdirect gives `EOPNOTSUPP` (COMPAT bounces).
    pub fn p2pdma(&self) -> bool {
        self.dm_name.is_none()
    }

    pub fn all() -> Vec<Stacked> {
        let mut out = Vec::new();
        let Ok(dir) = fs::read_dir("/sys/block") else {
            return out;
        };
        for e in dir.flatten() {
            let name = e.file_name().to_string_lossy().to_string();
            if legs_of(&name).is_empty() || pci_above(&name).is_some() {
                continue;
            }
            let p = e.path();
            let mut dm_name = None;
            let kind = if let Some(level) = read_trim(p.join("md/level")) {
                format!("md {level}")
            } else if p.join("dm").exists() {
                dm_name = Some(read_trim(p.join("dm/name")).unwrap_or_default());
                "dm".to_string()
            } else {
                "nvme multipath".to_string()
            };
            let mut legs = Vec::new();
            let mut too_deep = false;
            leaves(&name, 0, &mut legs, &mut too_deep);
            let over_limit = over_limit(&legs, too_deep);
            out.push(Stacked {
                name,
                kind,
                dm_name,
                legs,
                over_limit,
            });
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        out
    }
}

/// `dddd:bb:dd.f` -> the UAPI's PCI address.
pub fn parse_bdf(s: &str) -> Option<PciAddr> {
    let (dom, rest) = s.split_once(':')?;
    let (bus, rest) = rest.split_once(':')?;
    let (dev, func) = rest.split_once('.')?;
    let n = |x: &str| u32::from_str_radix(x, 16).ok();
    Some(PciAddr(
        (n(dom)? << 16) | (n(bus)? << 8) | (n(dev)? << 3) | n(func)?,
    ))
}

impl Namespace {
    pub fn all() -> Vec<Namespace> {
        let mut out = Vec::new();
        let Ok(dir) = fs::read_dir("/sys/block") else {
            return out;
        };
        for e in dir.flatten() {
            let name = e.file_name().to_string_lossy().to_string();
            if !name.starts_with("nvme") {
                continue;
            }
            if is_mpath_path(&name) {
                continue;
            }
            let p = e.path();
            let Some(nsid) = read_trim(p.join("nsid")).and_then(|s| s.parse().ok()) else {
                continue;
            };
            let ctrl = fs::canonicalize(p.join("device")).ok();
            let pci = ctrl
                .as_ref()
                .and_then(|c| fs::canonicalize(c.join("device")).ok())
                .and_then(|d| d.file_name().map(|f| f.to_string_lossy().to_string()))
                .and_then(|b| parse_bdf(&b));
            // A multipath head's `device` is its subsystem, with no PCI
            // function: its paths have the controllers.
            let paths = if pci.is_none() {
                mpath_controllers(&name)
            } else {
                Vec::new()
            };
            let serial = ctrl
                .as_ref()
                .and_then(|c| read_trim(c.join("serial")))
                .unwrap_or_default();
            let size = read_trim(p.join("size"))
                .and_then(|s| s.parse::<u64>().ok())
                .unwrap_or(0)
                * 512;
            let lbs = read_trim(p.join("queue/logical_block_size"))
                .and_then(|s| s.parse().ok())
                .unwrap_or(512);
            out.push(Namespace {
                name,
                nsid,
                paths,
                serial,
                pci,
                size,
                lbs,
            });
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        out
    }

    /// The name of block device `major:minor` (`/sys/dev/block`'s link:
    /// a namespace, partition, md or dm device alike).
    pub fn name_of(major: u32, minor: u32) -> Option<String> {
        fs::read_link(format!("/sys/dev/block/{major}:{minor}"))
            .ok()
            .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
    }

    pub fn open(&self, write: bool, direct: bool) -> Result<fs::File, String> {
        fs::OpenOptions::new()
            .read(true)
            .write(write)
            .custom_flags(if direct { libc::O_DIRECT } else { 0 })
            .open(format!("/dev/{}", self.name))
            .map_err(|e| format!("/dev/{}: {e}", self.name))
    }

    /// The namespace claimed for writing over its data (`O_EXCL`): refused
    /// while it is mounted (or a partition of it is) or an md or dm device
    /// holds it, and nobody can mount or claim it while the file is open.
    pub fn claim(&self) -> Result<fs::File, String> {
        fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_EXCL)
            .open(format!("/dev/{}", self.name))
            .map_err(|e| match e.raw_os_error() {
                Some(libc::EBUSY) => format!(
                    "/dev/{}: in use (mounted, a partition of it mounted, or part of an md or \
                     dm device): refused, since verify and bench write over data in it",
                    self.name
                ),
                _ => format!("/dev/{}: {e}", self.name),
            })
    }

    /// Whether the namespace has partitions or holders (md, dm): data that
    /// a default choice must not write over.
    fn has_users(&self) -> bool {
        let dir = PathBuf::from("/sys/block").join(&self.name);
        let partitioned = fs::read_dir(&dir).is_ok_and(|d| {
            d.flatten()
                .any(|e| e.file_name().to_string_lossy().starts_with(&self.name))
        });
        let held = fs::read_dir(dir.join("holders")).is_ok_and(|mut d| d.next().is_some());
        partitioned || held
    }

    /// The P2P distance from provider `p` to the namespace's controller;
    /// for a multipath head, the longest to its paths' controllers (`None`
    /// if any of them is out of reach: I/O goes down every path).
    pub fn distance_from(&self, p: &Provider) -> Option<u32> {
        let to = |pci: PciAddr| {
            p.clients
                .iter()
                .find(|c| c.pci_addr == pci)
                .and_then(|c| c.distance)
        };
        match self.pci {
            Some(pci) => to(pci),
            None if self.paths.is_empty() => None,
            None => self
                .paths
                .iter()
                .map(|&pci| to(pci))
                .try_fold(0, |max, d| d.map(|d| max.max(d))),
        }
    }

    pub fn json(&self) -> String {
        let mut o = Json::obj();
        o.str("device", &self.name);
        o.int("nsid", self.nsid);
        o.str("serial", &self.serial);
        // A multipath head has no one controller: `null`.
        o.opt_str("controller", self.pci.map(|a| a.to_string()).as_deref());
        o.int("size", self.size);
        o.int("logical_block_size", self.lbs);
        o.end()
    }
}

/// Page-aligned host memory, for O_DIRECT.
pub struct AlignedBuf {
    ptr: std::ptr::NonNull<u8>,
    len: usize,
}

impl AlignedBuf {
    pub fn new(len: usize) -> Result<Self, String> {
        let layout =
            std::alloc::Layout::from_size_align(len.max(1), 4096).map_err(|e| e.to_string())?;
        // SAFETY: the layout has a non-zero size.
        let p = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr = std::ptr::NonNull::new(p).ok_or("out of memory")?;
        Ok(Self { ptr, len })
    }

    pub fn as_ref(&self) -> &[u8] {
        // SAFETY: `ptr` is a live allocation of `len` initialised bytes.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    pub fn as_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_ref`; `&mut self` makes the borrow unique.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        if let Ok(layout) = std::alloc::Layout::from_size_align(self.len.max(1), 4096) {
            // SAFETY: allocated in `new` with this layout.
            unsafe { std::alloc::dealloc(self.ptr.as_ptr(), layout) };
        }
    }
}

/// pwrite(2) of all of `buf` at `off`.
pub fn pwrite_all(f: &fs::File, buf: &[u8], off: u64) -> Result<(), String> {
    use std::os::unix::fs::FileExt;
    f.write_all_at(buf, off).map_err(|e| format!("pwrite: {e}"))
}

pub fn count_diff(a: &[u8], b: &[u8]) -> usize {
    a.iter().zip(b).filter(|(x, y)| x != y).count() + a.len().abs_diff(b.len())
}

/// A JSON object under construction.
pub struct Json(String);

impl Json {
    pub fn obj() -> Self {
        Json(String::from("{"))
    }

    fn key(&mut self, k: &str) {
        if self.0.len() > 1 {
            self.0.push(',');
        }
        self.0.push_str(&Self::quote(k));
        self.0.push(':');
    }

    pub fn quote(s: &str) -> String {
        let mut o = String::from("\"");
        for c in s.chars() {
            match c {
                '"' => o.push_str("\\\""),
                '\\' => o.push_str("\\\\"),
                c if (c as u32) < 0x20 => o.push_str(&format!("\\u{:04x}", c as u32)),
                c => o.push(c),
            }
        }
        o.push('"');
        o
    }

    pub fn str(&mut self, k: &str, v: &str) {
        self.key(k);
        self.0.push_str(&Self::quote(v));
    }

    /// A string, or `null` for `None`.
    pub fn opt_str(&mut self, k: &str, v: Option<&str>) {
        match v {
            Some(v) => self.str(k, v),
            None => self.raw(k, "null"),
        }
    }

    pub fn bool(&mut self, k: &str, v: bool) {
        self.raw(k, if v { "true" } else { "false" });
    }

    pub fn num(&mut self, k: &str, v: f64) {
        self.key(k);
        self.0.push_str(&Self::number(v));
    }

    /// An exact integer (an address, a byte count): never through `f64`,
    /// which would round values past 2^53.
    pub fn int(&mut self, k: &str, v: impl Into<i128>) {
        self.key(k);
        self.0.push_str(&v.into().to_string());
    }

    /// A JSON number: whole numbers without a fraction, others to four
    /// places, `null` for NaN and infinities.
    pub fn number(v: f64) -> String {
        if !v.is_finite() {
            "null".into()
        } else if v.fract() == 0.0 && v.abs() < 9.0e15 {
            format!("{}", v as i64)
        } else {
            format!("{v:.4}")
        }
    }

    pub fn raw(&mut self, k: &str, v: &str) {
        self.key(k);
        self.0.push_str(v);
    }

    pub fn end(mut self) -> String {
        self.0.push('}');
        self.0
    }

    pub fn array(items: &[String]) -> String {
        format!("[{}]", items.join(","))
    }
}

/// A progress bar on stderr: redrawn in place on a terminal, one line per
/// step otherwise (a serial console, a log).
pub struct Progress {
    total: usize,
    done: usize,
    tty: bool,
}

impl Progress {
    pub fn new(total: usize) -> Self {
        // SAFETY: isatty only inspects the descriptor.
        let tty = unsafe { libc::isatty(2) } == 1;
        Self {
            total,
            done: 0,
            tty,
        }
    }

    pub fn step(&mut self, what: &str) {
        self.done += 1;
        let width = 30;
        let filled = width * self.done / self.total.max(1);
        let bar = format!(
            "[{}{}] {:>3}/{} {}",
            "#".repeat(filled),
            ".".repeat(width - filled),
            self.done,
            self.total,
            what
        );
        let mut e = std::io::stderr();
        if self.tty {
            let _ = write!(e, "\r\x1b[K{bar}");
            if self.done == self.total {
                let _ = writeln!(e);
            }
        } else {
            let _ = writeln!(e, "{bar}");
        }
    }
}

/// `size` exactly, in the largest of GiB, MiB, KiB and bytes that divides
/// it: a table's sizes, which hide no byte (12345 bytes used are not
/// "0 MiB").
pub fn exact_bytes(size: u64) -> String {
    match size {
        0 => "0".into(),
        s if s.is_multiple_of(1 << 30) => format!("{} GiB", s >> 30),
        s if s.is_multiple_of(1 << 20) => format!("{} MiB", s >> 20),
        s if s.is_multiple_of(1 << 10) => format!("{} KiB", s >> 10),
        s => format!("{s} B"),
    }
}

/// `size` for a person: bytes, KiB, MiB or GiB, whichever divides it (else
/// MiB with a fraction).
pub fn human_bytes(size: u64) -> String {
    match size {
        s if s >= 1 << 30 && s.is_multiple_of(1 << 30) => format!("{} GiB", s >> 30),
        s if s >= 1 << 20 && s.is_multiple_of(1 << 20) => format!("{} MiB", s >> 20),
        s if s >= 1 << 20 => format!("{:.2} MiB", s as f64 / 1048576.0),
        s if s >= 1 << 10 && s.is_multiple_of(1 << 10) => format!("{} KiB", s >> 10),
        s => format!("{s} bytes"),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::os::unix::ffi::OsStringExt;

    fn words(s: &[&str]) -> Vec<OsString> {
        s.iter().map(OsString::from).collect()
    }

    fn parse(s: &[&str]) -> Result<CommandLine, String> {
        parse_command_line(&words(s))
    }

    fn args(s: &[&str]) -> Args {
        match parse(s) {
            Ok(CommandLine::Run(_, a)) => *a,
            other => panic!("{s:?}: {other:?}"),
        }
    }

    fn err(s: &[&str]) -> String {
        match parse(s) {
            Err(e) => e,
            other => panic!("{s:?}: {other:?}"),
        }
    }

    fn is_help(s: &[&str]) -> bool {
        matches!(parse(s), Ok(CommandLine::Help))
    }

    #[test]
    fn help_in_every_documented_form() {
        for s in [
            &["help"][..],
            &["help", "bench"],
            &["--help"],
            &["-h"],
            &["bench", "--help"],
            &["verify", "-h"],
            &["info", "--json", "--help"],
            // Help wins over a bad value elsewhere on the line.
            &["bench", "--qd", "0", "--help"],
        ] {
            assert!(is_help(s), "{s:?}");
        }
    }

    #[test]
    fn help_of_no_command_is_an_unknown_command() {
        assert_eq!(err(&["help", "foo"]), "unknown command 'foo'");
        let e = err(&["help", "bench", "--json"]);
        assert!(
            e.contains("help takes a command name") && e.contains("--json"),
            "{e}"
        );
    }

    #[test]
    fn help_flag_only_in_an_option_position() {
        // The word after --out is its value's position: never help.
        let e = err(&["bench", "--out", "-h"]);
        assert!(e.starts_with("--out needs a value"), "{e}");
        let e = err(&["bench", "--out", "--help"]);
        assert!(e.starts_with("--out needs a value"), "{e}");
        let e = err(&["verify", "--dev", "--json"]);
        assert!(e.starts_with("--dev needs a value"), "{e}");
        // A value may start with one dash (a run name's part).
        assert_eq!(args(&["bench", "--only", "-t4"]).only, ["-t4"]);
    }

    #[test]
    fn positional_arguments_are_unexpected() {
        let e = err(&["info", "extra"]);
        assert!(e.starts_with("unexpected argument 'extra'"), "{e}");
        assert!(err(&["verify", "-"]).starts_with("unexpected argument '-'"));
        assert_eq!(err(&["info", "--bogus"]), "unknown option '--bogus'");
        assert_eq!(err(&["nosuch"]), "unknown command 'nosuch'");
        assert_eq!(err(&[]), "no command given");
    }

    #[test]
    fn option_with_equals_sign_gets_a_hint() {
        let e = err(&["verify", "--size=16M"]);
        assert!(e.contains("use --size 16M"), "{e}");
        assert!(err(&["info", "--json=1"]).contains("--json takes no value"));
        // An option the command does not take is refused as such.
        assert!(err(&["stats", "--qd=4"]).starts_with("stats does not take --qd"));
    }

    #[test]
    fn single_value_options_once_qd_and_only_repeated() {
        let e = err(&["verify", "--dev", "a", "--dev", "b"]);
        assert!(e.starts_with("--dev given twice"), "{e}");
        assert!(err(&["bench", "--size", "8M", "--size", "16M"]).starts_with("--size given twice"));
        let a = args(&[
            "bench", "--qd", "1,4", "--qd", "4", "--only", "x", "--only", "y",
        ]);
        assert_eq!(a.qd, [1, 4]);
        assert_eq!(a.only, ["x", "y"]);
        // A flag given twice is as once.
        assert!(args(&["info", "--json", "--json"]).json);
    }

    #[test]
    fn seconds_range() {
        for bad in ["1e-20", "0", "-1", "0.0009", "3600", "NaN", "inf"] {
            let e = err(&["bench", "--seconds", bad]);
            assert!(
                e.starts_with("--seconds must be") || e.contains("number"),
                "{bad}: {e}"
            );
        }
        assert_eq!(args(&["bench", "--seconds", "0.001"]).seconds, Some(0.001));
        assert_eq!(
            args(&["bench", "--seconds", "3599.5"]).seconds,
            Some(3599.5)
        );
    }

    #[test]
    fn foreign_options_refused_before_their_value() {
        assert!(err(&["stats", "--qd", "0"]).starts_with("stats does not take --qd"));
        assert!(err(&["version", "--size", "1T"]).starts_with("version does not take --size"));
        assert!(err(&["version", "--reset"]).starts_with("version does not take --reset"));
    }

    #[test]
    fn non_utf8_refused_but_in_out_file() {
        let bad = || OsString::from_vec(b"\xff".to_vec());
        let e = parse_command_line(&[OsString::from("info"), bad()]).unwrap_err();
        assert!(e.contains("\\xFF") && e.contains("not valid UTF-8"), "{e}");
        let e = parse_command_line(&[bad()]).unwrap_err();
        assert!(e.contains("not valid UTF-8"), "{e}");
        let e = parse_command_line(&[OsString::from("verify"), "--dev".into(), bad()]).unwrap_err();
        assert!(
            e.starts_with("--dev: the value") && e.contains("not valid UTF-8"),
            "{e}"
        );
        let file = OsString::from_vec(b"/tmp/\xff.json".to_vec());
        match parse_command_line(&[OsString::from("bench"), "--out".into(), file.clone()]) {
            Ok(CommandLine::Run(_, a)) => assert_eq!(a.out, Some(PathBuf::from(file))),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("16M"), Ok(16 << 20));
        assert_eq!(parse_size("0x1000"), Ok(4096));
        assert!(parse_size("abc").is_err());
        assert!(parse_size("99999999999999999999")
            .unwrap_err()
            .contains("too big"));
        assert!(parse_size("ÿ").is_err());
        assert_eq!(parse_size("0X1000"), Ok(4096));
        assert_eq!(parse_size("0x10k"), Ok(16 << 10));
        for bad in ["+4096", "-1", "0x+10", "0x", "k", " 4096", "4_096", "1.5M"] {
            assert!(
                parse_size(bad).unwrap_err().contains(&format!("'{bad}'")),
                "{bad}"
            );
        }
    }

    #[test]
    fn counts_are_digits_and_errors_repeat_the_value() {
        let run = |w: &[&str]| match parse(w) {
            Ok(CommandLine::Run(_, a)) => Ok(a),
            Ok(other) => panic!("{other:?}"),
            Err(e) => Err(e),
        };
        let a = run(&[
            "bench",
            "--threads",
            "0x4",
            "--rounds",
            "3",
            "--qd",
            "1,0X10",
        ])
        .unwrap();
        assert_eq!((a.threads, a.rounds, a.qd), (Some(4), Some(3), vec![1, 16]));
        assert_eq!(run(&["verify", "--gpu", "1"]).unwrap().gpu, Some(1));
        assert_eq!(
            run(&["bench", "--seconds", "0.5"]).unwrap().seconds,
            Some(0.5)
        );
        for (w, msg) in [
            (
                ["bench", "--threads", "+4"],
                "--threads takes a whole number 1..64 ('+4' given)",
            ),
            (
                ["bench", "--threads", "65"],
                "--threads takes a whole number 1..64 ('65' given)",
            ),
            (["bench", "--rounds", "4"], "'4' given"),
            (
                ["bench", "--rounds", "x"],
                "--rounds takes a whole number 1..15 ('x' given)",
            ),
            (
                ["bench", "--qd", "4,+8"],
                "('+8' given); depths are comma-separated",
            ),
            (["bench", "--qd", "4,,8"], "('' given)"),
            (
                ["verify", "--gpu", "+1"],
                "--gpu takes an index, as `p2pd info` shows it ('+1' given)",
            ),
            (["verify", "--gpu", "4294967296"], "('4294967296' given)"),
            (["bench", "--seconds", "inf"], "under 3600 ('inf' given)"),
            (
                ["bench", "--seconds", "1e-20"],
                "at least 0.001 and under 3600 ('1e-20' given)",
            ),
            (
                ["bench", "--seconds", "x"],
                "--seconds takes a number such as 2 or 0.5 ('x' given)",
            ),
            (["bench", "--seconds", "+2"], "('+2' given)"),
            (["bench", "--seconds", "5000"], "under 3600 ('5000' given)"),
        ] {
            let e = run(&w).unwrap_err();
            assert!(e.contains(msg), "{w:?}: {e}");
        }
    }

    #[test]
    fn exact_bytes_hides_nothing() {
        assert_eq!(exact_bytes(0), "0");
        assert_eq!(exact_bytes(12345), "12345 B");
        assert_eq!(exact_bytes(12288), "12 KiB");
        assert_eq!(exact_bytes(64 << 20), "64 MiB");
        assert_eq!(exact_bytes((64 << 20) - 4096), "65532 KiB");
        assert_eq!(exact_bytes(2 << 30), "2 GiB");
    }

    #[test]
    fn json_quotes_and_nulls() {
        assert_eq!(Json::quote("a\"b\\c\n"), "\"a\\\"b\\\\c\\u000a\"");
        let mut o = Json::obj();
        o.opt_str("controller", None);
        o.opt_str("name", Some("p2p\"x"));
        o.bool("p2pdma", false);
        assert_eq!(
            o.end(),
            "{\"controller\":null,\"name\":\"p2p\\\"x\",\"p2pdma\":false}"
        );
        let mut o = Json::obj();
        o.raw("unreachable_legs", &Json::array(&[Json::quote("nvme\"1")]));
        assert_eq!(o.end(), "{\"unreachable_legs\":[\"nvme\\\"1\"]}");
    }

    /// Provider 1 (0000:03:00.0), reaching 0000:0b:00.0 at `reaches`.
    pub(crate) fn provider(reaches: Option<u32>) -> Provider {
        Provider {
            index: 1,
            kind: sys::P2PDIRECT_PROVIDER_BAR,
            pci_addr: PciAddr(0x0300),
            bar: 2,
            bar_size: 64 << 20,
            bus_addr: 0,
            bytes_total: 64 << 20,
            bytes_free: 64 << 20,
            bytes_used: 0,
            clients: vec![p2pdirect::Client {
                pci_addr: PciAddr(0x0b00),
                distance: reaches,
            }],
        }
    }

    /// nvme4n1 on 0000:0b:00.0, `size` bytes.
    pub(crate) fn namespace(size: u64) -> Namespace {
        Namespace {
            name: "nvme4n1".into(),
            nsid: 4,
            serial: "s".into(),
            pci: Some(PciAddr(0x0b00)),
            paths: Vec::new(),
            size,
            lbs: 512,
        }
    }

    #[test]
    fn unreachable_dev_refused_naming_provider_and_namespace() {
        let ns = namespace(128 << 20);
        assert!(Args::require_reach(&ns, &provider(Some(2))).is_ok());
        let e = Args::require_reach(&ns, &provider(None)).unwrap_err();
        for want in [
            "provider 1",
            "0000:03:00.0",
            "nvme4n1",
            "p2pd info",
            "nothing written",
        ] {
            assert!(e.contains(want), "{want}: {e}");
        }
    }
}
