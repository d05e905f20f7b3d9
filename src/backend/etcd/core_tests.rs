//! The front-end's core, checked on its source: its files do no I/O, read no clock and
//! spawn nothing, and import nothing of the drivers, so that what decides can be stepped by
//! hand (`stepping.rs`) and the layering cannot rot unnoticed. A file joins the core by
//! being listed here.

/// The core's files: decisions, the state they decide over, and the records and guards they
/// are made of.
const CORE: &[(&str, &str)] = &[
    ("apply", include_str!("apply.rs")),
    ("at_once", include_str!("at_once.rs")),
    ("bound", include_str!("bound.rs")),
    ("breaking", include_str!("breaking.rs")),
    ("confirmation", include_str!("confirmation.rs")),
    ("delivery", include_str!("delivery.rs")),
    ("end", include_str!("end.rs")),
    ("expired", include_str!("expired.rs")),
    ("expiring", include_str!("expiring.rs")),
    ("footprints", include_str!("footprints.rs")),
    ("gap", include_str!("gap.rs")),
    ("guards", include_str!("guards.rs")),
    ("hashing", include_str!("hashing.rs")),
    ("head", include_str!("head.rs")),
    ("holder_events", include_str!("holder_events.rs")),
    ("holding", include_str!("holding.rs")),
    ("keys", include_str!("keys.rs")),
    ("leaving", include_str!("leaving.rs")),
    ("marks", include_str!("marks.rs")),
    ("mirror", include_str!("mirror.rs")),
    ("phase", include_str!("phase.rs")),
    ("planning", include_str!("planning.rs")),
    ("queued", include_str!("queued.rs")),
    ("reads", include_str!("reads.rs")),
    ("renewal", include_str!("renewal.rs")),
    ("resynced", include_str!("resynced.rs")),
    ("set_at_once", include_str!("set_at_once.rs")),
    ("set_queued", include_str!("set_queued.rs")),
    ("slot_answers", include_str!("slot_answers.rs")),
    ("slots", include_str!("slots.rs")),
    ("state", include_str!("state.rs")),
    ("supersede", include_str!("supersede.rs")),
    ("tokens", include_str!("tokens.rs")),
    ("values", include_str!("values.rs")),
    ("view", include_str!("view.rs")),
    ("waits", include_str!("waits.rs")),
    ("watched", include_str!("watched.rs")),
    ("words", include_str!("words.rs")),
];

/// What the core may take from the backend's own module besides its files: the etcd
/// client's values (transactions to build, answers to read; it sends nothing itself) and the
/// state's types, which `mod.rs` names.
const ALSO: &[&str] = &["rpc", "ClusterState", "Local", "Phase"];

/// What only a driver does: wait, spawn, time, read a clock, log, or be `Cluster`.
const DRIVER_ONLY: &[&str] = &[
    ".await",
    "async ",
    "tokio::spawn",
    "tokio::time",
    "tokio::task",
    "::now(",
    "backend::now",
    "SystemTime",
    "unix_ms",
    "wall_ms()",
    " now()",
    "(now()",
    "tracing::",
    "impl Cluster ",
    "Arc<Cluster>",
];

/// A file's code: its lines up to its tests, without comments.
fn code(src: &str) -> impl Iterator<Item = (usize, &str)> {
    src.lines()
        .enumerate()
        .take_while(|(_, l)| l.trim() != "#[cfg(test)]")
        .map(|(i, l)| (i + 1, l.split("//").next().unwrap_or("")))
        .filter(|(_, l)| !l.trim().is_empty())
}

#[test]
fn the_core_does_no_io_reads_no_clock_and_spawns_nothing() {
    let mut found = Vec::new();
    for (file, src) in CORE {
        for (n, line) in code(src) {
            for what in DRIVER_ONLY {
                if line.contains(what) {
                    found.push(format!("{file}.rs:{n}: {what:?} in {}", line.trim()));
                }
            }
        }
    }
    assert!(
        found.is_empty(),
        "driver's work in the core:\n{}",
        found.join("\n")
    );
}

#[test]
fn the_core_imports_nothing_of_its_drivers() {
    let core: Vec<&str> = CORE.iter().map(|(f, _)| *f).collect();
    let mut found = Vec::new();
    for (file, src) in CORE {
        for (n, line) in code(src) {
            for used in supers(line) {
                if !core.contains(&used) && !ALSO.contains(&used) {
                    found.push(format!("{file}.rs:{n}: super::{used}"));
                }
            }
        }
    }
    assert!(
        found.is_empty(),
        "the core uses a driver:\n{}",
        found.join("\n")
    );
}

/// The names a line takes from `super::`: `super::x`, or each of `super::{x, y::z}`.
fn supers(line: &str) -> Vec<&str> {
    let mut out = Vec::new();
    for (at, _) in line.match_indices("super::") {
        let rest = &line[at + "super::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let group = group.split('}').next().unwrap_or("");
            out.extend(group.split(',').filter_map(|p| first_name(p.trim())));
        } else {
            out.extend(first_name(rest));
        }
    }
    out
}

fn first_name(path: &str) -> Option<&str> {
    let end = path
        .find(|c: char| !(c.is_alphanumeric() || c == '_'))
        .unwrap_or(path.len());
    (end > 0).then(|| &path[..end])
}

#[test]
fn supers_reads_single_and_grouped_imports() {
    assert_eq!(supers("use super::keys::Layout;"), ["keys"]);
    assert_eq!(
        supers("use super::{guards, ClusterState};"),
        ["guards", "ClusterState"]
    );
    assert_eq!(supers("    let x = super::end::lease_keys(a);"), ["end"]);
}
