//! Garbage port profiles: every profile in conf/ mutated (bytes flipped, inserted and deleted, multi-byte UTF-8
//! spliced in, lines dropped or repeated, values replaced by edge values of every TOML type) and handed to
//! `Profile::parse`. The rule: a valid profile or one `ConfigError` line naming what is wrong; never a panic. Every
//! accessor of a profile that parses must not panic either.
//!
//! Seeded (tests/seeded): `ROCE_HOSTILE_SEED`, `ROCE_HOSTILE_ITERS` (default 3000), `ROCE_HOSTILE_SOAK=1` (100x).

mod seeded;

use roce_dp::config::Profile;
use roce_dp::sim::SimRng;
use seeded::Seeds;

const EDGE_VALUES: &[&str] = &[
    "0",
    "-1",
    "4294967295",
    "4294967296",
    "18446744073709551615",
    "9223372036854775807",
    "-9223372036854775808",
    "65535",
    "65536",
    "1e300",
    "nan",
    "inf",
    "\"\"",
    "\"é\u{1F600}\"",
    "[]",
    "[1, \"a\"]",
    "{}",
    "true",
    "1979-05-27T07:32:00Z",
    "\"/\"",
    "\"aa:bb:cc:dd:ee:ff:00\"",
    "\"999.1.1.1\"",
    "\"1,1,1\"",
    "\"0000:00:00.8\"",
    "0o777",
    "0x10000",
];

const SPLICES: &[&str] =
    &["é", "\u{1F600}", "\u{0}", "\"", "[", "]]", "=", "\n[daemon]\n", "\\u12", "'''", "\r\n", "#"];

fn profiles() -> Vec<(String, String)> {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../conf");
    let mut v = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "toml") {
            let text = std::fs::read_to_string(&p).unwrap();
            // Only port profiles (conf/dcqcn.toml is a congestion-control file).
            if text.contains("[port]") {
                v.push((p.file_name().unwrap().to_string_lossy().into_owned(), text));
            }
        }
    }
    v.sort();
    assert!(v.len() >= 8, "the port profiles in conf/");
    v
}

/// A char boundary of `s` at or below `i`.
fn floor(s: &str, mut i: usize) -> usize {
    i = i.min(s.len());
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

fn mutate(text: &str, rng: &mut SimRng) -> String {
    let mut s = text.to_string();
    for _ in 0..1 + rng.below(3) {
        let at = floor(&s, rng.below(s.len() as u64 + 1) as usize);
        match rng.below(7) {
            0 => {
                // Replace one value (right of an '=') with an edge value.
                let lines: Vec<&str> = s.lines().collect();
                let i = rng.below(lines.len() as u64) as usize;
                let mut out = String::new();
                for (k, l) in lines.iter().enumerate() {
                    match l.split_once('=') {
                        Some((key, _)) if k == i => {
                            out += key;
                            out += "= ";
                            out += EDGE_VALUES[rng.below(EDGE_VALUES.len() as u64) as usize];
                        }
                        _ => out += l,
                    }
                    out.push('\n');
                }
                s = out;
            }
            1 => s.insert_str(at, SPLICES[rng.below(SPLICES.len() as u64) as usize]),
            2 => {
                let end = floor(&s, at + rng.below(16) as usize);
                let end = end.max(at);
                s.replace_range(at..end, "");
            }
            3 => {
                // Drop or repeat a line.
                let mut lines: Vec<String> = s.lines().map(str::to_string).collect();
                if !lines.is_empty() {
                    let i = rng.below(lines.len() as u64) as usize;
                    if rng.below(2) == 0 {
                        lines.remove(i);
                    } else {
                        let l = lines[i].clone();
                        lines.insert(i, l);
                    }
                }
                s = lines.join("\n");
            }
            4 => {
                // A byte flip that keeps the text UTF-8 (ASCII stays ASCII).
                let b = s.as_bytes();
                if let Some(i) = (0..b.len()).map(|k| (at + k) % b.len()).find(|&k| b[k].is_ascii()) {
                    let c = (b[i] ^ (1 << rng.below(7))) as char;
                    s.replace_range(i..i + 1, c.encode_utf8(&mut [0; 4]));
                }
            }
            5 => s.truncate(at),
            _ => {
                // Sections and keys every profile may hold, with random values.
                let v = EDGE_VALUES[rng.below(EDGE_VALUES.len() as u64) as usize];
                let k = [
                    "[mempool]\nmbufs",
                    "[mempool]\ndata_room",
                    "[worker]\nworkers",
                    "[worker]\nburst",
                    "[daemon]\nsocket = \"/x\"\nmax_depth",
                    "[daemon]\nsocket = \"/x\"\nsocket_mode",
                    "[daemon]\nsocket = \"/x\"\nworker_lcores",
                    "[eal]\nno_huge_mb",
                    "[[net.neighbours]]\nip = \"10.0.0.9\"\nmac",
                ][rng.below(9) as usize];
                s.push_str(&format!("\n{k} = {v}\n"));
            }
        }
    }
    s
}

#[test]
fn garbage_profiles_are_one_line_errors_never_panics() {
    let seeds = Seeds::from_env(0xc0_4f16, 3000);
    let profiles = profiles();
    let (mut ok, mut err) = (0u64, 0u64);
    let failures = seeds.run("profile", 3, |seed| {
        let mut rng = SimRng::new(seed);
        let (name, text) = &profiles[rng.below(profiles.len() as u64) as usize];
        let m = mutate(text, &mut rng);
        match Profile::parse(name, &m) {
            Ok(p) => {
                // Every accessor of an accepted profile.
                let _ = (p.max_frame(), p.data_room(), p.pool_data_room(), p.vdev(), p.pci_allow());
                let _ = (p.ipv4(), p.ipv6(), p.mac(), p.daemon.as_ref().map(|d| d.lcores()));
                ok += 1;
                Ok(())
            }
            Err(e) => {
                let s = e.to_string();
                err += 1;
                if s.is_empty() || s.contains('\n') || !s.starts_with(name.as_str()) {
                    Err(format!("{name}: not one line naming the file: {s:?}\n{m}"))
                } else {
                    Ok(())
                }
            }
        }
    });
    eprintln!("garbage profiles: {} mutations, {ok} accepted, {err} refused", seeds.iters);
    seeded::assert_none(&failures);
    if seeds.iters >= 1000 {
        assert!(ok > seeds.iters / 20 && err > seeds.iters / 4, "the mutations reach both outcomes: {ok} / {err}");
    }
}
