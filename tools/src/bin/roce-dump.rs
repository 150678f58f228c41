//! roce-dump: decode the RoCEv2 frames of a pcap/pcapng capture (Ethernet, Linux cooked SLL/SLL2, raw IP).
//!
//! One line per RoCE frame; other frames are counted, not printed. The last line is
//! `frames=N roce=N icrc_ok=N icrc_bad=N malformed=N` (` snapped=N` when the capture cut frames short). Exit status:
//! 0 if every RoCE frame is well formed with a good ICRC (or snapped), 1 otherwise, 2 if the file cannot be read.
//! Frames of a pcapng interface whose link type is not decoded are counted, and named in one line on stderr per
//! link type at the end.

use clap::Parser;
use roce_dp_tools::capture::{for_each_frame, link_name};
use roce_dp_tools::dump::{Dumper, Options};
use std::io::{self, BufWriter};
use std::path::PathBuf;
use std::process::ExitCode;

/// Decode the RoCEv2 frames of a pcap or pcapng capture (Ethernet, Linux cooked SLL/SLL2 or raw IP) and verify every ICRC.
#[derive(Parser, Debug)]
#[command(name = "roce-dump", version)]
struct Args {
    /// The capture file.
    file: PathBuf,
    /// Also print Ethernet/IP details (MACs, VLAN, TTL, DSCP, IP ID) and the headers in hex.
    #[arg(short, long)]
    verbose: bool,
    /// Print one JSON object per frame (the summary line stays as in text mode).
    #[arg(long)]
    json: bool,
}

fn main() -> ExitCode {
    let args: Args = match roce_dp_tools::parse_cli("roce-dump") {
        Ok(a) => a,
        Err(code) => return code,
    };
    let stdout = io::stdout();
    let mut dumper = Dumper::new(BufWriter::new(stdout.lock()), Options { verbose: args.verbose, json: args.json });
    let mut write_err: Option<io::Error> = None;
    // Frames not decoded, per link type (`None`: a packet of an interface the file never described).
    let mut undecoded: Vec<(Option<u32>, u64)> = Vec::new();
    let read = for_each_frame(&args.file, |f| {
        if !f.ethernet {
            match undecoded.iter_mut().find(|e| e.0 == f.link) {
                Some(e) => e.1 += 1,
                None => undecoded.push((f.link, 1)),
            }
        }
        if write_err.is_none() {
            write_err = dumper.frame(f.time, f.ethernet, f.data, f.orig_len).err();
        }
    });
    if let Some(e) = write_err {
        // A closed pipe (`roce-dump x.pcap | head`) is not an error worth a message.
        if e.kind() == io::ErrorKind::BrokenPipe {
            return ExitCode::SUCCESS;
        }
        eprintln!("roce-dump: writing output: {e}");
        return ExitCode::from(2);
    }
    match read {
        Ok(()) => match dumper.finish() {
            Ok(s) => {
                for (link, n) in undecoded {
                    let what = match link {
                        Some(l) => format!("of link type {}", link_name(l)),
                        None => "of interfaces the file never described".to_string(),
                    };
                    eprintln!(
                        "roce-dump: {}: {n} frames {what} not decoded (Ethernet, Linux cooked and raw IP are)",
                        args.file.display()
                    );
                }
                ExitCode::from(s.exit_code() as u8)
            }
            Err(e) if e.kind() == io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("roce-dump: writing output: {e}");
                ExitCode::from(2)
            }
        },
        Err(e) => {
            // Frames read before a corrupt record keep their lines and get a summary; a file that could not be
            // read at all gets only the reason.
            if dumper.summary().frames > 0 {
                let _ = dumper.finish();
            }
            eprintln!("roce-dump: {}: {e}", args.file.display());
            ExitCode::from(2)
        }
    }
}
