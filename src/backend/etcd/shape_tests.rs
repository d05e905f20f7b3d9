//! The backend's shape, checked on its source so that it cannot rot unnoticed: no file over
//! 400 lines, no function over 120, its files import each other without a cycle, and
//! `Cluster`'s methods call each other without a cycle across files (a file of methods is a
//! layer: what it calls is below it). The file list is read from the directory, so a new file
//! is checked without being listed.

use std::collections::{BTreeMap, BTreeSet};

const MAX_FILE_LINES: usize = 400;
const MAX_FN_LINES: usize = 120;

/// Every `.rs` file of this directory, by module name, without its comments.
fn files() -> BTreeMap<String, String> {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/src/backend/etcd");
    let mut out = BTreeMap::new();
    for entry in std::fs::read_dir(dir).expect("the backend's directory") {
        let path = entry.expect("a directory entry").path();
        let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        if let Some(module) = name.strip_suffix(".rs") {
            let src = std::fs::read_to_string(&path).expect("a source file");
            out.insert(module.to_owned(), src);
        }
    }
    out
}

/// `src` without `//` comments (so a doc's words are not taken for code).
fn code(src: &str) -> String {
    src.lines()
        .map(|l| l.find("//").map_or(l, |at| &l[..at]))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The body of each function of `src`: (name, first line, lines, body).
fn functions(src: &str) -> Vec<(String, usize, usize, String)> {
    let lines: Vec<&str> = src.lines().collect();
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let Some(at) = line.find("fn ") else { continue };
        let before = line[..at].trim();
        let is_fn = before
            .split_whitespace()
            .all(|w| w == "pub" || w.starts_with("pub(") || w == "async" || w == "const");
        if !is_fn {
            continue;
        }
        let name: String = line[at + 3..]
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        let (mut depth, mut started, mut body) = (0i64, false, String::new());
        for (j, l) in lines.iter().enumerate().skip(i) {
            if !started && l.trim_end().ends_with(';') {
                break;
            }
            depth += l.matches('{').count() as i64 - l.matches('}').count() as i64;
            started |= l.contains('{');
            body.push_str(l);
            body.push('\n');
            if started && depth <= 0 {
                out.push((name.clone(), i + 1, j - i + 1, body));
                break;
            }
        }
    }
    out
}

/// The identifiers called as methods in `body` (`x.name(`).
fn method_calls(body: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for (at, _) in body.match_indices('.') {
        let rest = &body[at + 1..];
        let name: String = rest
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        let after = rest[name.len()..].trim_start();
        // `x.lock()` of a mutex is not `Cluster::lock(req)`.
        if !name.is_empty()
            && after.starts_with('(')
            && !(name == "lock" && after.starts_with("()"))
        {
            out.insert(name);
        }
    }
    out
}

/// The files each file reaches by `super::<file>` (mod.rs only declares them).
fn imports(files: &BTreeMap<String, String>) -> BTreeMap<String, BTreeSet<String>> {
    let mut graph = BTreeMap::new();
    for (module, src) in files.iter().filter(|(m, _)| *m != "mod") {
        let src = code(src);
        let mut to = BTreeSet::new();
        for (at, _) in src.match_indices("super::") {
            let rest = &src[at + 7..];
            let names: Vec<&str> = match rest.strip_prefix('{') {
                Some(list) => list[..list.find('}').unwrap_or(0)]
                    .split(',')
                    .map(|n| n.split("::").next().unwrap_or("").trim())
                    .collect(),
                None => vec![rest
                    .split(|c: char| !c.is_alphanumeric() && c != '_')
                    .next()
                    .unwrap_or("")],
            };
            to.extend(
                names
                    .into_iter()
                    .filter(|n| *n != module && files.contains_key(*n))
                    .map(str::to_owned),
            );
        }
        graph.insert(module.clone(), to);
    }
    graph
}

/// The files whose methods of `Cluster` each file's functions call.
fn method_layers(files: &BTreeMap<String, String>) -> BTreeMap<String, BTreeSet<String>> {
    // A method name defined in one file only (a name defined twice is not followed).
    let mut defined: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (module, src) in files {
        let src = code(src);
        for block in src.split("impl Cluster {").skip(1) {
            for (name, ..) in functions(block) {
                defined.entry(name).or_default().insert(module.clone());
            }
        }
    }
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (module, src) in files {
        let to = graph.entry(module.clone()).or_default();
        for (.., body) in functions(&code(src)) {
            for called in method_calls(&body) {
                match defined.get(&called) {
                    Some(at) if at.len() == 1 && !at.contains(module) => {
                        to.extend(at.iter().cloned())
                    }
                    _ => {}
                }
            }
        }
    }
    graph
}

/// A cycle of `graph`, if it has one (depth first, by colour).
fn cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|n| n == node) {
            let mut found = path[at..].to_vec();
            found.push(node.to_owned());
            return Some(found);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_owned());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(found) = visit(next, graph, path, done) {
                return Some(found);
            }
        }
        path.pop();
        done.insert(node.to_owned());
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|node| visit(node, graph, &mut Vec::new(), &mut done))
}

#[test]
fn no_file_is_over_400_lines_and_no_function_over_120() {
    let mut over = Vec::new();
    for (module, src) in files() {
        let lines = src.lines().count();
        if lines > MAX_FILE_LINES {
            over.push(format!("{module}.rs: {lines} lines"));
        }
        for (name, at, lines, _) in functions(&code(&src)) {
            if lines > MAX_FN_LINES {
                over.push(format!("{module}.rs:{at}: fn {name}, {lines} lines"));
            }
        }
    }
    assert!(over.is_empty(), "too long: {over:?}");
}

#[test]
fn the_files_import_each_other_without_a_cycle() {
    let graph = imports(&files());
    assert!(
        graph["grant"].contains("enqueue"),
        "the import reader reads nothing"
    );
    assert_eq!(cycle(&graph), None, "an import cycle");
}

#[test]
fn the_methods_call_each_other_without_a_cycle_across_files() {
    let graph = method_layers(&files());
    assert!(
        graph["grant"].contains("enqueue"),
        "the call reader reads nothing"
    );
    assert_eq!(cycle(&graph), None, "a cycle of calls across files");
}

#[test]
fn a_planted_cycle_is_found() {
    let mut files = files();
    // grant.rs's LOCK queues through enqueue.rs, which would call LOCK back.
    let enqueue = files.get_mut("enqueue").expect("enqueue.rs");
    enqueue
        .push_str("\nimpl Cluster {\n    fn planted(&self) {\n        self.lock(req);\n    }\n}\n");
    assert!(cycle(&method_layers(&files)).is_some());
    // grant.rs imports enqueue.rs's types, which would import one of grant.rs.
    let enqueue = files.get_mut("enqueue").expect("enqueue.rs");
    enqueue.push_str("\nuse super::grant::Planted;\n");
    assert!(cycle(&imports(&files)).is_some());
}
