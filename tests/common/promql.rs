//! Checks contrib/grafana's dashboard and contrib/prometheus's alert rules against what a
//! real lockd exports: every PromQL expression in them names series, labels and label values
//! that lockd serves on /metrics, and the dashboard shows every series lockd has. A renamed
//! metric or label in src/metrics.rs fails a test instead of showing as an empty panel or an
//! alert that never fires. `tests/it/contrib/observability.rs` checks them against an
//! embedded lockd, `tests/cluster/observability.rs` against cluster front-ends.
//!
//! The expressions are read by a small PromQL scanner (selectors, matchers, `by (...)`
//! lists), not a full parser; its own tests (in the `it` binary) show that it catches what
//! it is for.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::{field, http_get, token, wait_waiters, Lockd, GUARD};

/// Series only cluster mode exports.
pub const CLUSTER_ONLY: [&str; 2] = ["lockd_cluster_", "lockd_etcd_"];

/// Series the files may use that are not lockd's: Prometheus's own `up` of each scrape
/// target, and the blackbox exporter's `probe_success` of the /readyz probe.
pub const NOT_LOCKDS: [&str; 2] = ["up", "probe_success"];

/// Labels Prometheus adds to every series it scrapes.
pub const TARGET_LABELS: [&str; 2] = ["job", "instance"];

/// Names in PromQL that are operators, modifiers or literals, never series.
pub const KEYWORDS: [&str; 20] = [
    "sum",
    "min",
    "max",
    "avg",
    "group",
    "stddev",
    "stdvar",
    "count",
    "count_values",
    "bottomk",
    "topk",
    "quantile",
    "limitk",
    "limit_ratio",
    "and",
    "or",
    "unless",
    "atan2",
    "bool",
    "offset",
];

/// Keywords followed by a list of label names.
pub const GROUPING: [&str; 6] = [
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
];

pub type Labels = BTreeMap<String, String>;

/// What lockd exports: each sample name with the label sets it has.
pub struct Exported {
    /// Each sample name with the label sets it has.
    pub samples: BTreeMap<String, Vec<Labels>>,
    /// Prefixes of series lockd exports in another mode only (cluster mode's, for a scrape
    /// of an embedded lockd), which another test checks against that mode's scrape.
    pub elsewhere: Vec<&'static str>,
}

impl Exported {
    /// Reads an exposition (Prometheus text or OpenMetrics).
    pub fn parse(text: &str) -> Exported {
        let mut samples: BTreeMap<String, Vec<Labels>> = BTreeMap::new();
        for line in text
            .lines()
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
        {
            let mut c = Cursor::new(line);
            let name = c
                .ident()
                .unwrap_or_else(|| panic!("no sample name: {line}"));
            let labels = if c.peek() == Some(b'{') {
                c.matchers()
                    .unwrap_or_else(|e| panic!("{e}: {line}"))
                    .into_iter()
                    .map(|m| (m.label, m.value))
                    .collect()
            } else {
                Labels::new()
            };
            samples.entry(name.to_string()).or_default().push(labels);
        }
        Exported {
            samples,
            elsewhere: Vec::new(),
        }
    }

    /// Whether `metric` is exported in another mode only (see [`Exported::elsewhere`]).
    pub fn is_elsewhere(&self, metric: &str) -> bool {
        self.elsewhere.iter().any(|p| metric.starts_with(p))
    }

    pub fn label_names(&self, metric: &str) -> BTreeSet<&str> {
        self.samples
            .get(metric)
            .into_iter()
            .flatten()
            .flat_map(|labels| labels.keys().map(String::as_str))
            .collect()
    }

    /// The family a sample name belongs to: a histogram's `_bucket`, `_sum` and `_count`
    /// are one.
    pub fn family<'a>(&self, sample: &'a str) -> &'a str {
        ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|suffix| {
                let base = sample.strip_suffix(suffix)?;
                self.samples
                    .contains_key(&format!("{base}_bucket"))
                    .then_some(base)
            })
            .unwrap_or(sample)
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Matcher {
    pub label: String,
    pub op: &'static str,
    pub value: String,
}

#[derive(Debug, PartialEq)]
pub struct Selector {
    pub metric: String,
    pub matchers: Vec<Matcher>,
}

/// The parts of a PromQL expression that refer to series.
#[derive(Debug, Default, PartialEq)]
pub struct Query {
    pub selectors: Vec<Selector>,
    /// Label names in `by (...)`, `without (...)`, `on (...)` and the like.
    pub grouping: Vec<String>,
}

pub struct Cursor<'a> {
    text: &'a str,
    at: usize,
}

impl<'a> Cursor<'a> {
    fn new(text: &'a str) -> Self {
        Cursor { text, at: 0 }
    }

    fn peek(&self) -> Option<u8> {
        self.text.as_bytes().get(self.at).copied()
    }

    fn rest(&self) -> &'a str {
        &self.text[self.at..]
    }

    fn skip_space(&mut self) {
        while self.peek().is_some_and(|c| c.is_ascii_whitespace()) {
            self.at += 1;
        }
    }

    /// A metric, label or function name.
    fn ident(&mut self) -> Option<&'a str> {
        let start = self.at;
        let first = |c: u8| c.is_ascii_alphabetic() || c == b'_' || c == b':';
        if !self.peek().is_some_and(first) {
            return None;
        }
        while self.peek().is_some_and(|c| first(c) || c.is_ascii_digit()) {
            self.at += 1;
        }
        Some(&self.text[start..self.at])
    }

    /// A quoted string at the cursor, unescaped.
    fn string(&mut self) -> Result<String, String> {
        let quote = self.peek().ok_or("a string, not the end")?;
        if !matches!(quote, b'"' | b'\'' | b'`') {
            return Err(format!("a quoted string at {:?}", self.rest()));
        }
        self.at += 1;
        let mut out = String::new();
        let mut chars = self.rest().char_indices();
        while let Some((i, c)) = chars.next() {
            match c {
                '\\' if quote != b'`' => match chars.next() {
                    Some((_, 'n')) => out.push('\n'),
                    Some((_, escaped)) => out.push(escaped),
                    None => break,
                },
                c if c as u32 == u32::from(quote) => {
                    self.at += i + 1;
                    return Ok(out);
                }
                c => out.push(c),
            }
        }
        Err(format!("an unterminated string in {:?}", self.text))
    }

    /// Moves past the next `close`.
    fn skip_past(&mut self, close: u8) -> Result<(), String> {
        let found = self.text.as_bytes()[self.at..]
            .iter()
            .position(|&c| c == close)
            .ok_or_else(|| format!("no closing {:?} in {:?}", close as char, self.text))?;
        self.at += found + 1;
        Ok(())
    }

    /// `{label op "value", ...}` at the cursor.
    fn matchers(&mut self) -> Result<Vec<Matcher>, String> {
        self.at += 1;
        let mut out = Vec::new();
        loop {
            self.skip_space();
            match self.peek() {
                Some(b'}') => {
                    self.at += 1;
                    return Ok(out);
                }
                Some(b',') => {
                    self.at += 1;
                    continue;
                }
                _ => {}
            }
            let label = self
                .ident()
                .ok_or_else(|| format!("a label name at {:?}", self.rest()))?
                .to_string();
            self.skip_space();
            let op = ["=~", "!~", "!=", "="]
                .into_iter()
                .find(|op| self.rest().starts_with(op))
                .ok_or_else(|| format!("a matcher operator after {label}"))?;
            self.at += op.len();
            self.skip_space();
            let value = self.string()?;
            out.push(Matcher { label, op, value });
        }
    }

    /// `(label, ...)` at the cursor.
    fn label_list(&mut self) -> Result<Vec<String>, String> {
        self.at += 1;
        let mut out = Vec::new();
        loop {
            self.skip_space();
            match self.peek() {
                Some(b')') => {
                    self.at += 1;
                    return Ok(out);
                }
                Some(b',') => self.at += 1,
                _ => out.push(
                    self.ident()
                        .ok_or_else(|| format!("a label name at {:?}", self.rest()))?
                        .to_string(),
                ),
            }
        }
    }
}

/// The selectors and grouping labels of a PromQL expression.
pub fn scan(expr: &str) -> Result<Query, String> {
    let mut c = Cursor::new(expr);
    let mut query = Query::default();
    // Whether the last thing read was a metric name, which a `{...}` then belongs to.
    let mut after_metric = false;
    while let Some(b) = c.peek() {
        match b {
            b if b.is_ascii_whitespace() => c.skip_space(),
            b'"' | b'\'' | b'`' => {
                c.string()?;
                after_metric = false;
            }
            b'{' => {
                let mut matchers = c.matchers()?;
                if let Some(selector) = query.selectors.last_mut().filter(|_| after_metric) {
                    selector.matchers = matchers;
                } else {
                    // `{__name__=~"a|b", ...}`: a selector of each of the names listed.
                    let at = matchers
                        .iter()
                        .position(|m| m.label == "__name__" && matches!(m.op, "=" | "=~"))
                        .ok_or_else(|| format!("a selector without a metric name in {expr:?}"))?;
                    let names = matchers.remove(at).value;
                    for name in names.split('|') {
                        query.selectors.push(Selector {
                            metric: name.to_string(),
                            matchers: matchers.iter().map(Matcher::clone).collect(),
                        });
                    }
                }
                after_metric = false;
            }
            // A range or subquery, or a Grafana variable (`$__rate_interval`, `${x}`).
            b'[' | b'$' => {
                c.at += 1;
                if b == b'[' {
                    c.skip_past(b']')?;
                } else if c.peek() == Some(b'{') {
                    c.skip_past(b'}')?;
                } else {
                    c.ident();
                }
                after_metric = false;
            }
            b'0'..=b'9' | b'.' => {
                while c
                    .peek()
                    .is_some_and(|c| c.is_ascii_alphanumeric() || c == b'.')
                {
                    c.at += 1;
                }
                after_metric = false;
            }
            b if b.is_ascii_alphabetic() || b == b'_' || b == b':' => {
                let name = c.ident().unwrap_or_default();
                c.skip_space();
                after_metric = false;
                if GROUPING.contains(&name) {
                    if c.peek() == Some(b'(') {
                        query.grouping.extend(c.label_list()?);
                    }
                } else if KEYWORDS.contains(&name)
                    || name.eq_ignore_ascii_case("inf")
                    || name.eq_ignore_ascii_case("nan")
                    || c.peek() == Some(b'(')
                {
                    // An operator, a literal, or a function call.
                } else {
                    query.selectors.push(Selector {
                        metric: name.to_string(),
                        matchers: Vec::new(),
                    });
                    after_metric = true;
                }
            }
            _ => {
                c.at += 1;
                after_metric = false;
            }
        }
    }
    Ok(query)
}

/// What is wrong with `expr` against what lockd exports; `used` collects the series it names.
pub fn check(expr: &str, exported: &Exported, used: &mut BTreeSet<String>) -> Vec<String> {
    let query = match scan(expr) {
        Ok(q) => q,
        Err(e) => return vec![e],
    };
    let mut problems = Vec::new();
    if query.selectors.is_empty() {
        problems.push(format!("{expr:?} names no series"));
    }
    let mut known_labels: BTreeSet<&str> = TARGET_LABELS.into_iter().collect();
    for sel in &query.selectors {
        if NOT_LOCKDS.contains(&sel.metric.as_str()) || exported.is_elsewhere(&sel.metric) {
            continue;
        }
        let Some(samples) = exported.samples.get(&sel.metric) else {
            problems.push(format!("{expr:?}: lockd exports no {}", sel.metric));
            continue;
        };
        used.insert(sel.metric.clone());
        let labels = exported.label_names(&sel.metric);
        known_labels.extend(&labels);
        for m in &sel.matchers {
            if TARGET_LABELS.contains(&m.label.as_str()) {
                continue;
            }
            if !labels.contains(m.label.as_str()) {
                problems.push(format!(
                    "{expr:?}: {} has no label {} (it has {labels:?})",
                    sel.metric, m.label
                ));
            } else if m.op == "="
                && !m.value.contains('$')
                && !samples.iter().any(|l| l.get(&m.label) == Some(&m.value))
            {
                problems.push(format!(
                    "{expr:?}: no {} series has {}=\"{}\"",
                    sel.metric, m.label, m.value
                ));
            }
        }
    }
    // Labels of another mode's series are checked against that mode's scrape.
    let foreign = query
        .selectors
        .iter()
        .any(|s| exported.is_elsewhere(&s.metric));
    for label in query.grouping.iter().filter(|_| !foreign) {
        if !known_labels.contains(label.as_str()) {
            problems.push(format!(
                "{expr:?}: groups by {label}, which none of its series has"
            ));
        }
    }
    problems
}

/// `label_values(<selector>, <label>)` (a Grafana variable's query) or a plain expression.
pub fn check_variable_query(
    query: &str,
    exported: &Exported,
    used: &mut BTreeSet<String>,
) -> Vec<String> {
    let Some(args) = query
        .trim()
        .strip_prefix("label_values(")
        .and_then(|a| a.strip_suffix(')'))
    else {
        return check(query, exported, used);
    };
    let Some((selector, label)) = args.rsplit_once(',') else {
        return vec![format!(
            "{query:?}: label_values needs a selector and a label"
        )];
    };
    let mut problems = check(selector, exported, used);
    let label = label.trim();
    let metric = scan(selector)
        .ok()
        .and_then(|q| q.selectors.into_iter().next())
        .map(|s| s.metric)
        .unwrap_or_default();
    if !TARGET_LABELS.contains(&label) && !exported.label_names(&metric).contains(label) {
        problems.push(format!("{query:?}: {metric} has no label {label}"));
    }
    problems
}

pub fn read(file: &str) -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(file);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Every panel, rows' nested panels included.
pub fn panels(dashboard: &Value) -> Vec<&Value> {
    fn walk<'a>(list: &'a Value, out: &mut Vec<&'a Value>) {
        for panel in list.as_array().into_iter().flatten() {
            out.push(panel);
            walk(&panel["panels"], out);
        }
    }
    let mut out = Vec::new();
    walk(&dashboard["panels"], &mut out);
    out
}

/// Prometheus durations: `30s`, `1h30m`, ...
pub fn is_duration(text: &str) -> bool {
    let mut units = ["y", "w", "d", "h", "m", "s", "ms"].as_slice();
    let mut rest = text;
    while !rest.is_empty() {
        let digits = rest.len() - rest.trim_start_matches(|c: char| c.is_ascii_digit()).len();
        if digits == 0 {
            return false;
        }
        rest = &rest[digits..];
        // "ms" before "m"; each unit at most once, largest first.
        let Some(i) = units
            .iter()
            .enumerate()
            .filter(|(_, u)| rest.starts_with(**u))
            .max_by_key(|(_, u)| u.len())
            .map(|(i, _)| i)
        else {
            return false;
        };
        rest = &rest[units[i].len()..];
        units = &units[i + 1..];
    }
    !text.is_empty()
}

/// The rule file as JSON, read by Debian's python3-yaml (.ci/run installs it).
pub fn load_yaml(file: &str) -> Value {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(file);
    let out = Command::new("/usr/bin/python3")
        .args([
            "-c",
            "import json, sys, yaml; json.dump(yaml.safe_load(open(sys.argv[1])), sys.stdout)",
        ])
        .arg(&path)
        .stderr(Stdio::piped())
        .output()
        .expect("/usr/bin/python3 with python3-yaml is needed: apt-get install python3-yaml");
    assert!(
        out.status.success(),
        "{file} does not load as YAML (is python3-yaml installed?): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("JSON from python")
}

pub fn keys(object: &Value) -> Vec<&str> {
    object
        .as_object()
        .map(|o| o.keys().map(String::as_str).collect())
        .unwrap_or_default()
}

/// What is wrong with contrib/grafana's dashboard against `exported`: an expression that
/// names what lockd does not export, or a series lockd exports that no panel shows.
pub fn dashboard_problems(exported: &Exported) -> Vec<String> {
    let file = "contrib/grafana/lockd-dashboard.json";
    let dashboard: Value =
        serde_json::from_str(&read(file)).unwrap_or_else(|e| panic!("{file} is not JSON: {e}"));
    let mut problems = Vec::new();
    let mut used = BTreeSet::new();

    assert!(dashboard["schemaVersion"].as_u64().unwrap_or(0) >= 36);
    let vars = dashboard["templating"]["list"]
        .as_array()
        .expect("variables");
    let var = |name: &str| vars.iter().find(|v| v["name"] == name);
    let datasource = var("datasource").expect("a datasource variable");
    assert_eq!(datasource["type"], "datasource");
    assert_eq!(datasource["query"], "prometheus");
    assert!(var("instance").is_some(), "an instance variable");
    for v in vars.iter().filter(|v| v["type"] == "query") {
        let query = v["query"]["query"].as_str().or(v["query"].as_str());
        let query = query.unwrap_or_else(|| panic!("variable {} has no query", v["name"]));
        problems.extend(check_variable_query(query, exported, &mut used));
    }

    let mut ids = BTreeSet::new();
    let mut exprs = 0;
    for panel in panels(&dashboard) {
        let title = &panel["title"];
        assert!(
            ids.insert(panel["id"].as_u64()),
            "panel id repeated: {title}"
        );
        let Some(targets) = panel["targets"].as_array() else {
            continue;
        };
        if panel["datasource"]["uid"] != "${datasource}" {
            problems.push(format!(
                "panel {title} does not use the datasource variable"
            ));
        }
        for target in targets {
            let Some(expr) = target["expr"].as_str() else {
                problems.push(format!("panel {title} has a target without expr"));
                continue;
            };
            exprs += 1;
            if !expr.contains("instance=~\"$instance\"") {
                problems.push(format!("{expr:?} ({title}) ignores the instance variable"));
            }
            problems.extend(check(expr, exported, &mut used));
        }
    }
    assert!(exprs >= 20, "only {exprs} expressions in {file}");

    let shown: BTreeSet<&str> = used.iter().map(|s| exported.family(s)).collect();
    for name in exported.samples.keys() {
        let family = exported.family(name);
        if !shown.contains(family) {
            problems.push(format!("lockd exports {family}, which no panel shows"));
        }
    }
    problems.dedup();
    problems
}

/// What is wrong with contrib/prometheus's alert rules against `exported`.
pub fn alert_problems(exported: &Exported) -> Vec<String> {
    let file = "contrib/prometheus/lockd-alerts.yml";
    let rules = load_yaml(file);
    let mut problems = Vec::new();
    let mut used = BTreeSet::new();
    let mut alerts = BTreeSet::new();

    assert_eq!(
        keys(&rules),
        ["groups"],
        "{file}: only `groups:` at the top"
    );
    for group in rules["groups"].as_array().expect("groups") {
        let name = &group["name"];
        for key in keys(group) {
            if !["name", "interval", "rules", "limit"].contains(&key) {
                problems.push(format!("group {name}: Prometheus knows no {key}"));
            }
        }
        let group_rules = group["rules"].as_array().expect("rules");
        assert!(!group_rules.is_empty(), "group {name} has no rules");
        for rule in group_rules {
            let alert = rule["alert"].as_str().expect("every rule is an alert");
            if !alerts.insert(alert) {
                problems.push(format!("{alert} is there twice"));
            }
            for key in keys(rule) {
                let known = ["alert", "expr", "for", "keep_firing_for", "labels"];
                if !known.contains(&key) && key != "annotations" {
                    problems.push(format!("{alert}: Prometheus knows no {key}"));
                }
            }
            let expr = rule["expr"].as_str().unwrap_or_default();
            let mut named = BTreeSet::new();
            problems.extend(check(expr, exported, &mut named));
            if !rule["for"].as_str().is_some_and(is_duration) {
                problems.push(format!("{alert}: `for:` {} is not a duration", rule["for"]));
            }
            let severity = rule["labels"]["severity"].as_str();
            if !matches!(severity, Some("critical" | "warning" | "info")) {
                problems.push(format!("{alert}: severity {severity:?}"));
            }
            // The labels an annotation may show: those of the series the rule names (another
            // mode's rules are checked against that mode's scrape).
            if scan(expr)
                .is_ok_and(|q| q.selectors.iter().any(|s| exported.is_elsewhere(&s.metric)))
            {
                continue;
            }
            let mut labels: BTreeSet<&str> = TARGET_LABELS.into_iter().collect();
            for metric in &named {
                labels.extend(exported.label_names(metric));
            }
            for key in ["summary", "description"] {
                let text = rule["annotations"][key].as_str().unwrap_or_default();
                if text.trim().is_empty() {
                    problems.push(format!("{alert}: no {key}"));
                }
                if text.matches("{{").count() != text.matches("}}").count() {
                    problems.push(format!("{alert}: unbalanced {{{{ }}}} in its {key}"));
                }
                for (at, _) in text.match_indices("$labels.") {
                    let label: String = text[at + "$labels.".len()..]
                        .chars()
                        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                        .collect();
                    if !labels.contains(label.as_str()) {
                        problems.push(format!(
                            "{alert}: its {key} shows $labels.{label}, which its series lack"
                        ));
                    }
                }
            }
            used.extend(named);
        }
    }
    // What operators asked for.
    for alert in [
        "LockdDown",
        "LockdNotReady",
        "LockdRefusingLimit",
        "LockdJournalSlow",
        "LockdQueueGrowing",
        "LockdLockHeldLong",
        "LockdHoldTimeJump",
        "LockdLeasesExpiring",
        "LockdGrantsDropped",
    ] {
        if !alerts.contains(alert) {
            problems.push(format!("no {alert} alert"));
        }
    }
    problems
}

/// Starts the real lockd with metrics, a tracked name and a data directory, drives a grant
/// at once, a wait, a grant after waiting and releases, and scrapes it.
pub async fn scrape_embedded() -> Exported {
    let data = std::env::temp_dir().join(format!(
        "lockd-contrib-observability-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    let _ = std::fs::remove_dir_all(&data);
    let lockd = Lockd::new()
        .args([
            "--metrics-listen",
            "127.0.0.1:0",
            "--metrics-names",
            "tracked",
            "--data-dir",
            data.to_str().unwrap(),
        ])
        .spawn();
    // The endpoint's task logs its address; it may do so after the lock port's "listening".
    let deadline = Instant::now() + GUARD;
    let http: SocketAddr = loop {
        let found = lockd
            .log()
            .iter()
            .find(|l| l.contains("serving metrics"))
            .and_then(|l| field(l, "addr"))
            .and_then(|a| a.parse().ok());
        match found {
            Some(addr) => break addr,
            None if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(20)).await
            }
            None => panic!("no metrics address in {:?}", lockd.log()),
        }
    };

    let mut a = lockd.raw().await;
    let mut b = lockd.raw().await;
    let first = a.lock("tracked a ttl=1m").await;
    b.send("LOCK tracked b ttl=1m").await;
    wait_waiters(&mut a, "tracked", 1).await;
    assert_eq!(a.req(&format!("UNLOCK tracked {first}")).await, "OK");
    let second = token(&b.line().await);
    assert_eq!(b.req(&format!("UNLOCK tracked {second}")).await, "OK");

    let (status, body) = http_get(http, "/metrics").await;
    assert_eq!(status, 200, "{body}");
    lockd.stop();
    let _ = std::fs::remove_dir_all(&data);
    let mut exported = Exported::parse(&body);
    exported.elsewhere = CLUSTER_ONLY.to_vec();
    assert!(
        exported.samples.contains_key("lockd_grants_total"),
        "not lockd's metrics:\n{body}"
    );
    exported
}
