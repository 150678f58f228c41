//! Shared code for the roce-dp command-line tools.

pub mod capture;
pub mod dump;
pub mod incast;
pub mod perftest;

/// Parses the command line: `--help` / `--version` print and exit 0 (`Err(SUCCESS)`); bad arguments print one line
/// `TOOL: what (see --help)` and exit 2.
pub fn parse_cli<C: clap::Parser>(tool: &str) -> Result<C, std::process::ExitCode> {
    use clap::error::ErrorKind;
    match C::try_parse() {
        Ok(c) => Ok(c),
        Err(e) if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) => {
            let _ = e.print();
            Err(std::process::ExitCode::SUCCESS)
        }
        Err(e) => {
            let text = e.to_string();
            let line = text.lines().next().unwrap_or("bad arguments").trim_start_matches("error: ");
            eprintln!("{tool}: {line} (see --help)");
            Err(std::process::ExitCode::from(2))
        }
    }
}
