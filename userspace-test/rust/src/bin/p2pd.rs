// SPDX-License-Identifier: GPL-2.0
//! p2pd: command-line tool for p2pdirect.
//!
//! `p2pd version`: module and ABI version. `p2pd info`: that, plus every
//! device-memory provider and its P2P reachability to each NVMe controller.

use p2pdirect::{sys, Device, Version};
use std::process::ExitCode;

fn usage() -> ExitCode {
    eprintln!("usage: p2pd version | p2pd info");
    ExitCode::from(2)
}

fn version(dev: &Device) -> Result<Version, String> {
    let v = dev.version().map_err(|e| format!("GET_VERSION: {e}"))?;
    println!("{v}");
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

fn info(dev: &Device) -> Result<(), String> {
    version(dev)?;
    let providers = dev
        .providers()
        .map_err(|e| format!("LIST_PROVIDERS: {e}"))?;
    println!("device-memory providers: {}", providers.len());
    println!(
        "  {:>3}  {:<9}  {:<12}  {:>4}  {:>8}  {:>12}  {:>8}  {:>8}",
        "idx", "kind", "pci", "bar", "size MiB", "bus addr", "free MiB", "used MiB"
    );
    for p in &providers {
        let kind = match p.kind {
            sys::P2PDIRECT_PROVIDER_BAR => "bar",
            sys::P2PDIRECT_PROVIDER_PUBLISHED => "published",
            _ => "?",
        };
        println!(
            "  {:>3}  {:<9}  {:<12}  {:>4}  {:>8}  {:>#12x}  {:>8}  {:>8}",
            p.index,
            kind,
            p.pci_addr.to_string(),
            p.bar,
            p.bar_size >> 20,
            p.bus_addr,
            p.bytes_free >> 20,
            p.bytes_used >> 20
        );
    }
    println!("P2P reachability (kernel P2PDMA distance; '-' = cannot reach):");
    for p in &providers {
        for c in &p.clients {
            let d = c.distance.map_or("-".to_string(), |d| d.to_string());
            println!("  provider {} -> nvme {}: {}", p.index, c.pci_addr, d);
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    let cmd = std::env::args().nth(1);
    let run: fn(&Device) -> Result<(), String> = match cmd.as_deref() {
        Some("version") => |d| version(d).map(|_| ()),
        Some("info") => info,
        _ => return usage(),
    };
    let result = Device::open()
        .map_err(|e| format!("{}: {e}", p2pdirect::DEVICE_PATH))
        .and_then(|d| run(&d));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("p2pd: {e}");
            ExitCode::FAILURE
        }
    }
}
