// SPDX-License-Identifier: GPL-2.0
//! p2pd: command-line tool for p2pdirect.

use std::process::ExitCode;

fn usage() -> ExitCode {
    eprintln!("usage: p2pd version");
    ExitCode::from(2)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("version") => match p2pdirect::Device::open().and_then(|d| d.version()) {
            Ok(v) => {
                println!("{v}");
                if !v.is_compatible() {
                    eprintln!(
                        "p2pd: built for ABI {}.{}, module speaks {}.{}",
                        p2pdirect::sys::P2PDIRECT_ABI_MAJOR,
                        p2pdirect::sys::P2PDIRECT_ABI_MINOR,
                        v.abi_major,
                        v.abi_minor
                    );
                    return ExitCode::FAILURE;
                }
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("p2pd: {}: {e}", p2pdirect::DEVICE_PATH);
                ExitCode::FAILURE
            }
        },
        _ => usage(),
    }
}
