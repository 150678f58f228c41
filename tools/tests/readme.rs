//! The README's commands against the tools as built, so that the README cannot rot:
//! - every invocation of one of our tools or scripts in a code block or an inline code span (after `$ `, `flock
//!   LOCK`, or `target/release/`) uses only flags and subcommands that the tool's own `--help` (clap's, or the
//!   script's header) lists, and every `--daemon`-less `rdp-client`/`rdp-nic`/... subcommand exists;
//! - the cheap, deterministic examples (`rdp-sim`, two-node and incast, `roce-dump` on a vendored capture) print what
//!   the README shows (lines ending in `...` are prefixes, a line `...` skips output; a block may hold several `$ `
//!   commands, each followed by its output);
//! - every repository path the README and conf/README.md name (`conf/...`, `scripts/...`, links) exists, and so do
//!   the tool invocations' flags in conf/README.md;
//! - every configuration key the two name (`[daemon] socket_mode`, `worker.sleep_us`, `rp_dce_tcp_g`) is one the
//!   port-profile and congestion-control parsers take.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("workspace root").to_path_buf()
}

fn readme() -> String {
    std::fs::read_to_string(root().join("README.md")).expect("README.md")
}

fn conf_readme() -> String {
    std::fs::read_to_string(root().join("conf/README.md")).expect("conf/README.md")
}

/// The directory the test binaries' tools are in (all of the package's binaries are built for its tests).
fn bin_dir() -> PathBuf {
    Path::new(env!("CARGO_BIN_EXE_roce-dump")).parent().unwrap().to_path_buf()
}

const TOOLS: &[&str] = &[
    "rdp-sim",
    "roce-dump",
    "roce-stat",
    "rdp-client",
    "rdp-nic",
    "roce-dpd",
    "rdp-porttest",
    "rdp_write_bw",
    "rdp_write_lat",
    "rdp_read_bw",
    "rdp_read_lat",
    "rdp_send_bw",
    "rdp_send_lat",
    "rdp_atomic_bw",
    "rdp_atomic_lat",
];

const SCRIPTS: &[&str] = &[
    "scripts/run.sh",
    "scripts/test.sh",
    "scripts/bench.sh",
    "scripts/bench-daemon.sh",
    "scripts/interop-rxe.sh",
    "scripts/setup.sh",
];

/// Code blocks (each line) and inline code spans (whitespace folded), in order.
fn snippets(md: &str) -> (Vec<Vec<String>>, Vec<String>) {
    let (mut blocks, mut spans) = (Vec::new(), Vec::new());
    let mut block: Option<Vec<String>> = None;
    let mut prose = String::new();
    for line in md.lines() {
        if line.starts_with("```") {
            match block.take() {
                Some(b) => blocks.push(b),
                None => block = Some(Vec::new()),
            }
            continue;
        }
        match block.as_mut() {
            Some(b) => b.push(line.to_string()),
            None => {
                prose.push_str(line);
                prose.push('\n');
            }
        }
    }
    for (i, part) in prose.split('`').enumerate() {
        if i % 2 == 1 {
            spans.push(part.split_whitespace().collect::<Vec<_>>().join(" "));
        }
    }
    (blocks, spans)
}

/// A command line as the README writes it -> (tool or script, its arguments), if it runs one of ours.
fn invocation(cmd: &str) -> Option<(String, Vec<String>)> {
    let mut words: Vec<&str> = cmd.split_whitespace().collect();
    if words.first() == Some(&"$") {
        words.remove(0);
    }
    if words.first() == Some(&"flock") && words.len() > 2 {
        words.drain(..2);
    }
    let cut = words.iter().position(|w| w.starts_with('#') || *w == "&" || *w == "|").unwrap_or(words.len());
    words.truncate(cut);
    let first = *words.first()?;
    let name = first.strip_prefix("target/release/").unwrap_or(first);
    (TOOLS.contains(&name) || SCRIPTS.contains(&name))
        .then(|| (name.to_string(), words[1..].iter().map(|w| w.to_string()).collect()))
}

fn help(program: &Path, args: &[&str]) -> String {
    let o = Command::new(program).args(args).arg("--help").output().expect("run --help");
    assert!(o.status.success(), "{} {args:?} --help: {}", program.display(), String::from_utf8_lossy(&o.stderr));
    String::from_utf8(o.stdout).expect("utf-8 help")
}

/// Subcommand names under clap's `Commands:` heading.
fn subcommands(help: &str) -> Vec<String> {
    help.lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .filter(|c| c != "help")
        .collect()
}

fn lists_flag(help: &str, flag: &str) -> bool {
    help.split(|c: char| c.is_whitespace() || c == ',' || c == '[' || c == ']' || c == '=' || c == ':' || c == '(')
        .any(|w| w == flag || w.strip_suffix('.') == Some(flag))
}

#[derive(Default)]
struct Helps(HashMap<(String, String), String>);

impl Helps {
    /// The help text for a tool (and subcommand), cached.
    fn get(&mut self, tool: &str, sub: &str) -> String {
        let key = (tool.to_string(), sub.to_string());
        if let Some(h) = self.0.get(&key) {
            return h.clone();
        }
        let h = if tool.starts_with("scripts/") {
            help(&root().join(tool), &[])
        } else {
            let p = bin_dir().join(tool);
            assert!(p.exists(), "{} is not built next to the test binaries", p.display());
            help(&p, if sub.is_empty() { &[] } else { std::slice::from_ref(&sub) })
        };
        self.0.insert(key, h.clone());
        h
    }
}

/// What is wrong with one README invocation, if anything.
fn check(helps: &mut Helps, tool: &str, args: &[String]) -> Option<String> {
    // run.sh passes its arguments to rdp_write_bw on both sides.
    let (tool, mut args) =
        if tool == "scripts/run.sh" { ("rdp_write_bw", args.to_vec()) } else { (tool, args.to_vec()) };
    if tool == "scripts/test.sh" {
        let n = std::fs::read_dir(root().join("scripts/tiers")).unwrap().count();
        return args
            .iter()
            // (`N`: a placeholder in the prose.)
            .find(|a| *a != "N" && !a.parse::<usize>().is_ok_and(|t| (1..=n).contains(&t)))
            .map(|a| format!("scripts/test.sh takes tier numbers 1-{n}, not {a}"));
    }
    let top = helps.get(tool, "");
    let subs = subcommands(&top);
    let mut sub = String::new();
    if !subs.is_empty() {
        let first = args.first().cloned()?;
        if !first.starts_with('-') {
            // `ring|tap`: every alternative must be a subcommand; check the flags against the first.
            for alt in first.split('|') {
                if !subs.iter().any(|s| s == alt) {
                    return Some(format!("{tool} has no subcommand {alt} (it has {subs:?})"));
                }
            }
            sub = first.split('|').next().unwrap().to_string();
            args.remove(0);
        }
    }
    let h = helps.get(tool, &sub);
    for a in &args {
        if !a.starts_with('-') || a == "-" || a == "--" || a.contains('{') || a.contains('*') {
            continue;
        }
        let flag = a.split('=').next().unwrap();
        // rdp_*_bw's perftest short flags may be written together with their value (`-s65536`): not in the README.
        if !lists_flag(&h, flag) {
            return Some(format!("{tool} {sub}: {flag} is not in its --help"));
        }
    }
    None
}

#[test]
fn every_readme_invocation_uses_flags_the_tool_has() {
    let md = format!("{}\n{}", readme(), conf_readme());
    let (blocks, spans) = snippets(&md);
    let mut cmds: Vec<String> = Vec::new();
    for b in &blocks {
        for l in b {
            // In a block, a command is a `$ ` line, or an unindented line that starts with one of our tools.
            if l.starts_with("$ ") || (!l.starts_with(' ') && invocation(l).is_some()) {
                cmds.push(l.clone());
            }
        }
    }
    cmds.extend(spans.iter().cloned());
    let mut helps = Helps::default();
    let (mut checked, mut wrong) = (0, Vec::new());
    for c in &cmds {
        let Some((tool, args)) = invocation(c) else { continue };
        checked += 1;
        if let Some(w) = check(&mut helps, &tool, &args) {
            wrong.push(format!("{c}\n    -> {w}"));
        }
    }
    assert!(wrong.is_empty(), "README commands the tools do not accept:\n{}", wrong.join("\n"));
    // The README shows every tool: if the extraction found few invocations, it is the extraction that broke.
    assert!(checked >= 40, "only {checked} invocations found in the README");
    for t in TOOLS.iter().filter(|t| !t.starts_with("rdp_") || **t == "rdp_write_bw") {
        assert!(cmds.iter().any(|c| invocation(c).is_some_and(|(n, _)| n == *t)), "no invocation of {t} found");
    }
}

#[test]
fn the_check_catches_a_wrong_flag_and_subcommand() {
    let mut helps = Helps::default();
    let v = |s: &str| s.split_whitespace().map(str::to_string).collect::<Vec<_>>();
    assert_eq!(check(&mut helps, "rdp-sim", &v("--op write --loss 0.01")), None);
    assert!(check(&mut helps, "rdp-sim", &v("--op write --los 0.01")).is_some());
    assert_eq!(check(&mut helps, "rdp-nic", &v("ring|tap --steering auto")), None);
    assert!(check(&mut helps, "rdp-nic", &v("rings --qps 4")).is_some());
    assert!(check(&mut helps, "rdp-client", &v("active --oob /tmp/x --bogus")).is_some());
    assert_eq!(check(&mut helps, "scripts/run.sh", &v("-s 65536 -n 5000 -q 4 -m 1024")), None);
    assert_eq!(check(&mut helps, "scripts/bench-daemon.sh", &v("--rounds 3 --events")), None);
    assert!(check(&mut helps, "scripts/bench.sh", &v("--round 3")).is_some());
    assert!(check(&mut helps, "scripts/test.sh", &v("13")).is_some());
}

/// The README's output for a command, compared with the tool's: `...` lines skip, `X ...` is a prefix of a line.
/// The command runs in a directory of its own (`--plot incast.svg` writes there); an argument naming a file of the
/// repository (`roce-dp/tests/vectors/...`) is given whole.
fn assert_shows(cmd: &str, want_lines: &[String], tool: &str) {
    let (name, args) = invocation(cmd).unwrap_or_else(|| panic!("not a command: {cmd}"));
    assert_eq!(name, tool);
    let args: Vec<String> = args
        .iter()
        .map(|a| {
            if !a.starts_with('-') && root().join(a).exists() {
                root().join(a).display().to_string()
            } else {
                a.clone()
            }
        })
        .collect();
    let dir = std::env::temp_dir().join(format!("rdp-readme-{}-{}", std::process::id(), cmd.len()));
    std::fs::create_dir_all(&dir).unwrap();
    let o = Command::new(bin_dir().join(tool)).args(&args).current_dir(&dir).output().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(o.status.success(), "{cmd}: {}", String::from_utf8_lossy(&o.stderr));
    let out = String::from_utf8(o.stdout).unwrap();
    let mut lines = out.lines();
    for want in want_lines {
        if want == "..." {
            continue;
        }
        let found = match want.strip_suffix(" ...") {
            Some(prefix) => lines.any(|l| l.starts_with(prefix)),
            None => lines.any(|l| l == want),
        };
        assert!(found, "{cmd}: the README shows {want:?}, not in this order in the output:\n{out}");
    }
}

/// A block's `$ ` commands, each with the lines after it up to the next.
fn commands_with_output(block: &[String]) -> Vec<(&str, &[String])> {
    let starts: Vec<usize> = (0..block.len()).filter(|&i| block[i].starts_with("$ ")).collect();
    starts
        .iter()
        .enumerate()
        .map(|(k, &i)| (block[i].as_str(), &block[i + 1..*starts.get(k + 1).unwrap_or(&block.len())]))
        .collect()
}

#[test]
fn the_deterministic_examples_print_what_the_readme_shows() {
    let (blocks, _) = snippets(&readme());
    let (mut two_node, mut incast, mut dump) = (0, 0, 0);
    for b in &blocks {
        for (cmd, want) in commands_with_output(b) {
            if cmd.starts_with("$ target/release/rdp-sim ") {
                assert_shows(cmd, want, "rdp-sim");
                if cmd.contains("--incast") {
                    incast += 1;
                } else {
                    two_node += 1;
                }
            }
            if cmd.starts_with("$ target/release/roce-dump ") {
                assert_shows(cmd, want, "roce-dump");
                dump += 1;
            }
        }
    }
    // The incast block holds three commands: only its first was a block's first line, and only that one was run.
    assert_eq!((two_node, incast, dump), (1, 3, 1), "the rdp-sim (two-node, incast) and roce-dump examples");
}

#[test]
fn a_block_of_several_commands_is_split_into_each_with_its_output() {
    let b: Vec<String> = ["$ a", "x", "...", "$ b", "$ c", "y"].iter().map(|l| l.to_string()).collect();
    let got: Vec<(&str, Vec<&str>)> =
        commands_with_output(&b).into_iter().map(|(c, w)| (c, w.iter().map(String::as_str).collect())).collect();
    assert_eq!(got, vec![("$ a", vec!["x", "..."]), ("$ b", vec![]), ("$ c", vec!["y"])]);
}

/// Whether the port-profile parser knows `key` in `[section]` (its value aside: a key it does not know is refused
/// as "unknown field" before its value is looked at).
fn profile_takes(section: &str, key: &str) -> bool {
    let base = [
        ("port", "driver = \"net_ring\""),
        ("net", "ipv4 = \"10.0.0.1\"\nmtu = 1024"),
        ("eal", ""),
        ("worker", ""),
        ("mempool", ""),
        ("daemon", "socket = \"/run/x.sock\""),
    ];
    let text: String = base
        .iter()
        .map(|(s, body)| {
            format!("[{s}]\n{body}\n{}", if *s == section { format!("{key} = 0\n") } else { String::new() })
        })
        .collect();
    roce_dp::config::Profile::parse("t", &text).map_or_else(|e| !e.0.contains("unknown field"), |_| true)
}

/// Whether the congestion-control parser (`rdp-sim --cc-config`) knows `key`, at the top or in `[dcqcn]`.
fn cc_config_takes(key: &str) -> bool {
    ["", "[dcqcn]\n"].iter().any(|table| {
        toml::from_str::<roce_dp::CcConfig>(&format!("{table}{key} = 0\n"))
            .map_or_else(|e| !e.to_string().contains("unknown field"), |_| true)
    })
}

#[test]
fn every_config_key_the_readmes_name_is_one_the_parsers_take() {
    const SECTIONS: &[&str] = &["port", "net", "eal", "worker", "mempool", "daemon"];
    let key_chars =
        |k: &str| !k.is_empty() && k.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    let (mut checked, mut wrong) = (0, Vec::new());
    for md in [readme(), conf_readme()] {
        let (_, spans) = snippets(&md);
        for span in &spans {
            // `[daemon] socket_mode`, `[worker] idle = "sleep"`, `port.pci`, `worker.sleep_us`.
            let named = match span.strip_prefix('[').and_then(|r| r.split_once("] ")) {
                Some((sec, rest)) => Some((sec, rest.split([' ', '=']).next().unwrap_or(""))),
                None => span.split_once('.').filter(|(_, k)| !k.contains('.')),
            };
            if let Some((sec, key)) = named.filter(|(sec, key)| SECTIONS.contains(sec) && key_chars(key)) {
                checked += 1;
                if !profile_takes(sec, key) {
                    wrong.push(format!("`{span}`: the port profile has no key {key} in [{sec}]"));
                }
            } else if (span.starts_with("rp_") || span.starts_with("np_")) && key_chars(span) {
                checked += 1;
                if !cc_config_takes(span) {
                    wrong.push(format!("`{span}`: conf/dcqcn.toml's parser has no key {span}"));
                }
            }
        }
    }
    assert!(wrong.is_empty(), "configuration keys the READMEs name that do not exist:\n{}", wrong.join("\n"));
    assert!(checked >= 30, "only {checked} configuration keys found in the READMEs: the extraction broke");
    // The check itself: a key that is not there is caught, in either parser.
    assert!(profile_takes("daemon", "socket_mode") && !profile_takes("daemon", "socket_perms"));
    assert!(profile_takes("worker", "idle") && !profile_takes("eal", "idle"));
    assert!(cc_config_takes("rp_dce_tcp_g") && cc_config_takes("np_enabled") && !cc_config_takes("rp_dce_g"));
}

#[test]
fn every_path_the_readme_names_exists() {
    let md = format!("{}\n{}", readme(), conf_readme());
    let mut missing = Vec::new();
    for word in md.split(|c: char| c.is_whitespace() || "`()[],;:'\"".contains(c)) {
        let w = word.trim_end_matches('.');
        let Some(top) = w.split('/').next() else { continue };
        if !["conf", "scripts", "tools", "roce-dp", "bench", "dpdk-sys", "fuzz"].contains(&top) || !w.contains('/') {
            continue;
        }
        // Patterns and placeholders: `conf/memif-*.toml`, `tiers/NN-name.sh`, `{embedded,daemon}.rs`, `<time>`.
        if w.contains(['*', '{', '<', '|']) || w.contains("NN-") || w.contains("NAME") {
            continue;
        }
        let w = w.split('#').next().unwrap();
        if !root().join(w).exists() {
            missing.push(w.to_string());
        }
    }
    missing.sort();
    missing.dedup();
    assert!(missing.is_empty(), "README names paths that do not exist: {missing:?}");
}

#[test]
fn every_profile_in_conf_is_described_in_both_readmes() {
    let (md, conf_md) = (readme(), conf_readme());
    let mut files: Vec<String> = std::fs::read_dir(root().join("conf"))
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.ends_with(".toml"))
        .collect();
    files.sort();
    let (_, spans) = snippets(&conf_md);
    let (_, readme_spans) = snippets(&md);
    for f in &files {
        assert!(spans.iter().any(|s| s == f), "conf/{f} has no entry (`{f}`) in conf/README.md");
        assert!(readme_spans.iter().any(|s| s == f), "conf/{f} is not in the README's table of conf/ (`{f}`)");
    }
    // And what conf/README.md names as a file of conf/ is one.
    for s in spans.iter().filter(|s| s.ends_with(".toml") && !s.contains(['/', '*', ' '])) {
        assert!(files.contains(s), "conf/README.md names {s}, which is not in conf/");
    }
    assert!(files.len() >= 14, "{files:?}");
}
