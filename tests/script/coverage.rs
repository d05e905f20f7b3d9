//! Which scripts exercise which command, LOCK option and ERR code: computed from the scripts,
//! checked against proto.md (everything it lists that one server can produce is covered) and
//! against the table in tests/scripts/README.md (which must say exactly that).

use std::collections::{BTreeMap, BTreeSet};

use super::parse::{Action, Line, Script, Step};

/// Codes of proto.md's Errors table that no script can produce on a single healthy server.
pub const NOT_SCRIPTED: &[(&str, &str)] = &[
    (
        "UNAVAILABLE",
        "cluster mode only, when etcd can't be reached or has no quorum",
    ),
    ("TLS", "TLS ports only: the scripts speak plain TCP"),
];

/// Flags of proto.md's Limits table that no script sets, and why.
pub const FLAGS_NOT_SCRIPTED: &[(&str, &str)] = &[
    (
        "--status-copies",
        "needs STATUS answers held unread by many clients",
    ),
    (
        "--tls-handshake-timeout",
        "TLS: the scripts speak plain TCP",
    ),
    (
        "--web-locks",
        "the web view: HTTP on its own port, not the line protocol",
    ),
    (
        "--web-viewers",
        "the web view: HTTP on its own port, not the line protocol",
    ),
];

/// The README's table is between these lines.
pub const BEGIN: &str = "<!-- coverage: begin -->";
pub const END: &str = "<!-- coverage: end -->";

/// Every ERR code in proto.md's Errors table, in its order.
pub fn proto_codes(proto: &str) -> Vec<String> {
    let section = proto
        .split("\n## Errors")
        .nth(1)
        .expect("proto.md has an Errors section");
    let section = section.split("\n### ").next().unwrap_or(section);
    section
        .lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| l.split('`').next())
        .filter(|c| c.chars().all(|ch| ch.is_ascii_uppercase()))
        .map(str::to_owned)
        .collect()
}

/// Every flag of proto.md's Limits table (`| \`--max-line\` | ...`), in its order.
pub fn proto_limit_flags(proto: &str) -> Vec<String> {
    let section = proto
        .split("\n## Limits")
        .nth(1)
        .expect("proto.md has a Limits section");
    let section = section.split("\n## ").next().unwrap_or(section);
    section
        .lines()
        .filter_map(|l| l.strip_prefix("| `--"))
        .filter_map(|l| l.split('`').next())
        .map(|f| format!("--{f}"))
        .collect()
}

/// Every command of proto.md's `### \`CMD ...\`` headings under Commands.
pub fn proto_commands(proto: &str) -> Vec<String> {
    let section = proto
        .split("\n## Commands")
        .nth(1)
        .expect("proto.md has a Commands section");
    let section = section.split("\n## ").next().unwrap_or(section);
    let mut out = Vec::new();
    for heading in section.lines().filter_map(|l| l.strip_prefix("### ")) {
        for quoted in heading.split('`').skip(1).step_by(2) {
            let cmd = quoted.split(' ').next().unwrap_or("");
            if !cmd.is_empty()
                && cmd.chars().all(|c| c.is_ascii_uppercase())
                && !out.iter().any(|c| c == cmd)
            {
                out.push(cmd.to_owned());
            }
        }
    }
    out
}

/// The rows the README must show: what, then the scripts that exercise it.
pub fn rows(
    scripts: &[Script],
    commands: &[String],
    codes: &[String],
    flags: &[String],
) -> Vec<(String, String)> {
    let mut seen: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for s in scripts {
        for flag in s.flags.iter().filter(|f| f.starts_with("--")) {
            seen.entry(flag.clone()).or_default().insert(s.name.clone());
        }
        let mut sent = Vec::new();
        let mut expected = Vec::new();
        collect(&s.steps, &mut sent, &mut expected);
        for line in sent {
            for what in request_forms(&line) {
                seen.entry(what).or_default().insert(s.name.clone());
            }
        }
        for p in expected {
            let w: Vec<&str> = p.split_whitespace().collect();
            if let ["ERR", code, ..] = w[..] {
                seen.entry(format!("ERR {code}"))
                    .or_default()
                    .insert(s.name.clone());
            }
        }
    }
    let mut wanted: Vec<String> = Vec::new();
    for c in commands {
        wanted.push(format!("`{c}`"));
        match c.as_str() {
            "LOCK" => wanted.extend(
                [
                    "ttl=",
                    "wait=",
                    "session",
                    "session=",
                    "detach",
                    "shared",
                    "limit=",
                    "supersede",
                    "and=",
                ]
                .iter()
                .map(|o| format!("`LOCK {o}`")),
            ),
            "RENEW" => {
                wanted.push("`RENEW ttl=`".into());
                wanted.push("`RENEW detach`".into());
            }
            "STATUS" => {
                wanted.push("`STATUS <name>`".into());
                wanted.push("`STATUS <name> detail`".into());
            }
            "WATCH" => wanted.push("`WATCH <name>`".into()),
            _ => {}
        }
    }
    wanted.extend(codes.iter().map(|c| format!("`ERR {c}`")));
    wanted.extend(flags.iter().map(|f| format!("`{f}`")));
    wanted
        .into_iter()
        .map(|w| {
            let key = w.trim_matches('`').to_owned();
            let names = seen
                .get(&key)
                .map(|s| s.iter().cloned().collect::<Vec<_>>().join(", "))
                .unwrap_or_default();
            (w, names)
        })
        .collect()
}

/// The table as the README writes it.
pub fn table(rows: &[(String, String)]) -> String {
    let mut out = String::from("| what | scripts |\n|---|---|\n");
    for (what, names) in rows {
        let names = if names.is_empty() { "(none)" } else { names };
        out.push_str(&format!("| {what} | {names} |\n"));
    }
    out
}

fn collect(steps: &[Line], sent: &mut Vec<String>, expected: &mut Vec<String>) {
    for line in steps {
        match &line.step {
            Step::Send { text, .. } => sent.push(text.clone()),
            Step::Poll {
                request, pattern, ..
            } => {
                sent.push(request.clone());
                expected.push(pattern.clone());
            }
            Step::Expect { pattern, .. } => expected.push(pattern.clone()),
            Step::Act {
                action: Action::SendRaw(raw),
                ..
            } => sent.extend(raw.split("\\n").map(str::to_owned)),
            Step::Act {
                action: Action::SkipUntil(p),
                ..
            } => expected.push(p.clone()),
            Step::Repeat { body, .. } => collect(body, sent, expected),
            _ => {}
        }
    }
}

/// The command of a request line, and its forms and options: `LOCK`, `LOCK ttl=`,
/// `STATUS <name> detail` and so on.
fn request_forms(line: &str) -> Vec<String> {
    let words: Vec<&str> = line.split_whitespace().collect();
    let Some(cmd) = words.first().map(|w| w.to_ascii_uppercase()) else {
        return Vec::new();
    };
    let mut out = vec![cmd.clone()];
    match (cmd.as_str(), words.len()) {
        ("LOCK", n) if n > 3 => {
            for opt in &words[3..] {
                let opt = opt.to_ascii_lowercase();
                let form = match opt.split_once('=') {
                    Some((key, _)) => format!("{key}="),
                    None => opt,
                };
                out.push(format!("LOCK {form}"));
            }
        }
        ("RENEW", n) if n > 3 => {
            for opt in &words[3..] {
                let opt = opt.to_ascii_lowercase();
                match opt.split_once('=') {
                    Some(("ttl", _)) => out.push("RENEW ttl=".into()),
                    None if opt == "detach" => out.push("RENEW detach".into()),
                    _ => {}
                }
            }
        }
        ("STATUS", 2) => out.push("STATUS <name>".into()),
        ("STATUS", 3) => out.push("STATUS <name> detail".into()),
        ("WATCH", 2) => out.push("WATCH <name>".into()),
        _ => {}
    }
    out
}
