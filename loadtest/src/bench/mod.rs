//! Benchmark scenarios: one file says what a published result runs (its
//! driver), the gateway configurations, the loads, and the checks it is
//! judged by; one runner (`bench run`, `loadtest/run`) executes it, judges
//! every run and writes `loadtest/results/<name>/` (README.md and charts),
//! stamped with the commit and the machine.
//!
//! The rules the files and the runner follow are written once, in
//! `loadtest/README.md` ("Benchmark scenarios").

pub mod judge;
pub mod report;
pub mod soak_clients;
pub mod timeline;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_norway::{Mapping, Value};

pub use judge::{Check, Measured, Verdict};

/// One benchmark scenario file (`loadtest/scenarios/<name>.yaml`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BenchFile {
    /// The result's heading.
    pub title: String,
    /// What runs and why, for the result's reader (Markdown).
    #[serde(default)]
    pub about: String,
    /// `SCRIPT [ARGS...]`: a script in `loadtest/bench/` that performs one
    /// run and writes `$RUN/report.md`, `$RUN/measured.json` and its charts.
    pub driver: String,
    /// How many runs; each check is judged on the median run.
    #[serde(default = "three")]
    pub runs: u32,
    /// Gateway configurations by name, as slogate reads them but for what
    /// only the run knows: the listen addresses and each pool's replicas.
    #[serde(default)]
    pub gateway: BTreeMap<String, Value>,
    /// loadgen scenarios by name (`target` is given at run time).
    #[serde(default)]
    pub load: BTreeMap<String, Value>,
    /// The scenario's parameters: each `${var}` of a configuration or load,
    /// with its value. A driver sets those only a run knows (a rate from the
    /// measured capacity) and reads the others (`bench var`); `${seed}` is
    /// always the run's number. The test suite fills every configuration and
    /// load with these values and has slogate and loadgen read them.
    #[serde(default)]
    pub vars: BTreeMap<String, Value>,
    /// The claims the result is judged by.
    #[serde(default)]
    pub checks: Vec<Check>,
    /// The file's text: the result shows its configurations and loads as
    /// written, comments (the reasons) included.
    #[serde(skip)]
    pub source: String,
    /// Vars given for this result on the runner's command line
    /// (`loadtest/run NAME --set KEY=VALUE`), over the file's own; the
    /// result states them.
    #[serde(skip)]
    pub overrides: BTreeMap<String, String>,
}

fn three() -> u32 {
    3
}

impl BenchFile {
    pub fn load(path: &Path) -> Result<Self, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let mut f: BenchFile = serde_norway::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
        f.source = text;
        f.validate().map_err(|e| format!("{}: {e}", path.display()))?;
        Ok(f)
    }

    fn validate(&self) -> Result<(), String> {
        if self.runs == 0 {
            return Err("runs must be at least 1".into());
        }
        if self.driver.split_whitespace().next().is_none() {
            return Err("driver names no script".into());
        }
        for c in &self.checks {
            c.validate()?;
        }
        for (kind, items) in [("gateway", &self.gateway), ("load", &self.load)] {
            for (name, v) in items {
                if let Some(u) = var_names(v).into_iter().find(|u| u != "seed" && !self.vars.contains_key(u)) {
                    return Err(format!("{kind} {name} uses ${{{u}}}, which vars does not declare"));
                }
            }
        }
        let mut names: Vec<&str> = self.checks.iter().map(|c| c.name.as_str()).collect();
        names.sort_unstable();
        if let Some(w) = names.windows(2).find(|w| w[0] == w[1]) {
            return Err(format!("two checks are named {:?}", w[0]));
        }
        Ok(())
    }

    /// Give vars for this result over the file's own (`--set KEY=VALUE` of
    /// the runner): each must be a var the file declares.
    pub fn override_vars(&mut self, sets: BTreeMap<String, String>) -> Result<(), String> {
        if let Some(k) = sets.keys().find(|k| !self.vars.contains_key(*k)) {
            return Err(format!(
                "--set {k}: the scenario has no such var (its vars: {})",
                self.vars.keys().cloned().collect::<Vec<_>>().join(", ")
            ));
        }
        for (k, v) in &sets {
            self.vars.insert(k.clone(), Value::String(v.clone()));
        }
        self.overrides.extend(sets);
        Ok(())
    }

    /// The overrides as the runner hands them to its drivers (environment
    /// `BENCH_SET`: one `KEY=VALUE` a line), and back.
    pub fn overrides_env(&self) -> String {
        self.overrides.iter().map(|(k, v)| format!("{k}={v}\n")).collect()
    }

    /// The driver's script (under `loadtest/bench/`) and its arguments.
    pub fn driver_command(&self, root: &Path) -> (PathBuf, Vec<String>) {
        let mut words = self.driver.split_whitespace().map(str::to_string);
        let script = words.next().unwrap_or_default();
        (root.join("loadtest/bench").join(script), words.collect())
    }

    /// Gateway configuration NAME, ready for `slogate serve --config`:
    /// `${var}`s filled from `vars`, the listen addresses on free loopback
    /// ports unless given, and `replicas` set on each pool that has none
    /// (URLs, or vllm-sim's JSON lines: the URL and where the replica
    /// publishes its KV events).
    pub fn gateway_config(&self, name: &str, replicas: &[String], vars: &BTreeMap<String, String>) -> Result<String, String> {
        let raw = self.gateway.get(name).ok_or_else(|| missing("gateway", name, self.gateway.keys()))?;
        let mut v = fill(raw, &self.with_defaults(vars))?;
        let top = v.as_mapping_mut().ok_or_else(|| format!("gateway {name}: a configuration is a mapping"))?;
        let server = top.entry(Value::from("server")).or_insert_with(|| Value::Mapping(Mapping::new()));
        let server = server.as_mapping_mut().ok_or_else(|| format!("gateway {name}: server is a mapping"))?;
        // Free loopback ports; a run's gateway stops within 5 s.
        for (key, default) in [("listen", "127.0.0.1:0"), ("admin_listen", "127.0.0.1:0"), ("shutdown_grace", "5s")] {
            server.entry(Value::from(key)).or_insert_with(|| Value::from(default));
        }
        let pools = top.get_mut("pools").and_then(Value::as_sequence_mut).ok_or_else(|| format!("gateway {name}: no pools"))?;
        for pool in pools.iter_mut() {
            let pool = pool.as_mapping_mut().ok_or_else(|| format!("gateway {name}: a pool is a mapping"))?;
            if !pool.contains_key("replicas") {
                if replicas.is_empty() {
                    return Err(format!("gateway {name}: a pool has no replicas and none were given (--replicas)"));
                }
                let listed = replicas.iter().map(|r| replica_entry(r)).collect::<Result<Vec<_>, _>>()?;
                pool.insert(Value::from("replicas"), Value::Sequence(listed));
            }
        }
        serde_norway::to_string(&v).map_err(|e| e.to_string())
    }

    /// loadgen scenario NAME with its `${var}`s filled and `target` set
    /// (a load in the file names none: the run knows where it goes).
    pub fn load_scenario(&self, name: &str, target: &str, vars: &BTreeMap<String, String>) -> Result<String, String> {
        let raw = self.load.get(name).ok_or_else(|| missing("load", name, self.load.keys()))?;
        let mut v = fill(raw, &self.with_defaults(vars))?;
        let top = v.as_mapping_mut().ok_or_else(|| format!("load {name}: a load is a mapping"))?;
        top.insert(Value::from("target"), Value::from(target));
        serde_norway::to_string(&v).map_err(|e| e.to_string())
    }
}

/// A pool's replica: a URL as it is; a line vllm-sim printed (JSON) as its
/// URL and, where it publishes KV events, `kv_events` and `kv_events_replay`.
fn replica_entry(r: &str) -> Result<Value, String> {
    if !r.trim_start().starts_with('{') {
        return Ok(Value::from(r));
    }
    let line: serde_json::Value = serde_json::from_str(r).map_err(|e| format!("a replica line: {e}: {r}"))?;
    let mut m = Mapping::new();
    for key in ["url", "kv_events", "kv_events_replay"] {
        if let Some(v) = line.get(key).and_then(serde_json::Value::as_str) {
            m.insert(Value::from(key), Value::from(v));
        }
    }
    if !m.contains_key("url") {
        return Err(format!("a replica line without its url: {r}"));
    }
    Ok(if m.len() == 1 { m.remove("url").unwrap_or(Value::Null) } else { Value::Mapping(m) })
}

/// The `${var}` names used anywhere in `v`.
pub fn var_names(v: &Value) -> std::collections::BTreeSet<String> {
    let mut out = std::collections::BTreeSet::new();
    fn walk(v: &Value, out: &mut std::collections::BTreeSet<String>) {
        match v {
            Value::String(s) => {
                let mut rest = s.as_str();
                while let Some(i) = rest.find("${") {
                    let Some(end) = rest[i..].find('}') else { break };
                    out.insert(rest[i + 2..i + end].to_string());
                    rest = &rest[i + end + 1..];
                }
            }
            Value::Sequence(items) => items.iter().for_each(|i| walk(i, out)),
            Value::Mapping(m) => m.values().for_each(|i| walk(i, out)),
            _ => {}
        }
    }
    walk(v, &mut out);
    out
}

fn missing<'a>(what: &str, name: &str, have: impl Iterator<Item = &'a String>) -> String {
    let have: Vec<&str> = have.map(String::as_str).collect();
    format!("the scenario has no {what} named {name:?} (it has: {})", have.join(", "))
}

/// Fill `${var}`s: a string that is one `${var}` whole takes the variable's
/// value as YAML (a number stays a number); elsewhere the text is replaced.
/// A variable the run did not set is an error, never an empty string.
pub fn fill(v: &Value, vars: &BTreeMap<String, String>) -> Result<Value, String> {
    Ok(match v {
        Value::String(s) => {
            let whole = s.strip_prefix("${").and_then(|r| r.strip_suffix('}')).filter(|n| !n.contains(['$', '{', '}']));
            match whole {
                Some(n) => {
                    let val = vars.get(n).ok_or_else(|| unset(n))?;
                    serde_norway::from_str(val).map_err(|e| format!("${{{n}}} = {val:?}: {e}"))?
                }
                None => Value::String(fill_text(s, vars)?),
            }
        }
        Value::Sequence(items) => Value::Sequence(items.iter().map(|i| fill(i, vars)).collect::<Result<_, _>>()?),
        Value::Mapping(m) => {
            let mut out = Mapping::new();
            for (k, v) in m {
                out.insert(k.clone(), fill(v, vars)?);
            }
            Value::Mapping(out)
        }
        other => other.clone(),
    })
}

fn fill_text(s: &str, vars: &BTreeMap<String, String>) -> Result<String, String> {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find("${") {
        out.push_str(&rest[..i]);
        let end = rest[i..].find('}').ok_or_else(|| format!("{s:?}: an unclosed ${{"))?;
        let name = &rest[i + 2..i + end];
        out.push_str(vars.get(name).ok_or_else(|| unset(name))?);
        rest = &rest[i + end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

fn unset(name: &str) -> String {
    format!("${{{name}}} is used but not set (pass --set {name}=VALUE)")
}

/// The text of top-level section `key` (its lines up to the next top-level
/// key), as the file writes it; None when the file has no such section.
pub fn raw_section(source: &str, key: &str) -> Option<String> {
    let head = format!("{key}:");
    let mut lines = source.lines().skip_while(|l| l.trim_end() != head).skip(1);
    let body: Vec<&str> = lines.by_ref().take_while(|l| l.is_empty() || l.starts_with([' ', '#'])).collect();
    (!body.is_empty()).then(|| body.join("\n").trim_end().to_string())
}

impl BenchFile {
    /// The file's vars as text (and seed 1): what a run that sets none fills in.
    pub fn example_vars(&self) -> BTreeMap<String, String> {
        self.with_defaults(&BTreeMap::from([("seed".to_string(), "1".to_string())]))
    }

    /// `set` over the file's own vars.
    fn with_defaults(&self, set: &BTreeMap<String, String>) -> BTreeMap<String, String> {
        let mut out: BTreeMap<String, String> = self.vars.iter().map(|(k, v)| (k.clone(), var_text(v))).collect();
        out.extend(set.iter().map(|(k, v)| (k.clone(), v.clone())));
        out
    }

    /// Var NAME's value as a driver reads it.
    pub fn var(&self, name: &str) -> Result<String, String> {
        self.vars.get(name).map(var_text).ok_or_else(|| missing("var", name, self.vars.keys()))
    }
}

fn var_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => serde_norway::to_string(other).unwrap_or_default().trim_end().to_string(),
    }
}

/// `KEY=VALUE` pairs from the command line.
pub fn parse_sets(sets: &[String]) -> Result<BTreeMap<String, String>, String> {
    sets.iter()
        .map(|s| s.split_once('=').map(|(k, v)| (k.to_string(), v.to_string())).ok_or_else(|| format!("--set {s}: write KEY=VALUE")))
        .collect()
}

/// Every scenario file under `dir`, by name (its path below `dir`, without `.yaml`).
pub fn scenario_names(dir: &Path) -> Result<Vec<String>, String> {
    fn walk(base: &Path, dir: &Path, out: &mut Vec<String>) -> Result<(), String> {
        let entries = std::fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        for e in entries {
            let p = e.map_err(|e| e.to_string())?.path();
            if p.is_dir() {
                walk(base, &p, out)?;
            } else if p.extension().is_some_and(|x| x == "yaml") {
                if let Some(name) = p.strip_prefix(base).ok().and_then(|r| r.with_extension("").to_str().map(str::to_string)) {
                    out.push(name);
                }
            }
        }
        Ok(())
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out)?;
    out.sort();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    const FILE: &str = r#"
title: t
driver: admission.sh breaker
gateway:
  main:
    pools:
      - name: default
        models: [auto]
        max_inflight_per_replica: "${slots}"
    breaker: { window: 10s }
  pinned:
    server: { listen: 127.0.0.1:9 }
    pools: [{ name: p, models: [auto], replicas: [http://127.0.0.1:1] }]
load:
  main:
    duration: 10s
    seed: "${seed}"
    streams: [{ name: chat, class: chat, model: "m-${seed}", arrival: { kind: poisson, rate: "${rate}" } }]
vars: { slots: 64, rate: 1.5 }
checks:
  - { name: fast, measure: p99, at_most: 300 }
"#;

    fn file() -> BenchFile {
        let f: BenchFile = serde_norway::from_str(FILE).expect("parses");
        f.validate().expect("valid");
        f
    }

    #[test]
    fn a_config_gets_loopback_listeners_and_the_runs_replicas() {
        let out = file()
            .gateway_config("main", &["http://127.0.0.1:5".into(), "http://127.0.0.1:6".into()], &vars(&[("slots", "64")]))
            .expect("fills");
        let set = file().gateway_config("main", &["http://127.0.0.1:5".into()], &vars(&[("slots", "8")])).expect("fills");
        assert!(set.contains("max_inflight_per_replica: 8"), "a run's value wins over the file's: {set}");
        let v: Value = serde_norway::from_str(&out).expect("yaml");
        assert_eq!(v["server"]["listen"], Value::from("127.0.0.1:0"));
        assert_eq!(v["server"]["admin_listen"], Value::from("127.0.0.1:0"));
        assert_eq!(v["pools"][0]["replicas"][1], Value::from("http://127.0.0.1:6"));
        assert_eq!(v["pools"][0]["max_inflight_per_replica"], Value::from(64), "a whole ${{var}} keeps its type");
        let own = file().gateway_config("main", &["http://127.0.0.1:5".into()], &vars(&[])).expect("the file's own value");
        let v: Value = serde_norway::from_str(&own).expect("yaml");
        assert_eq!(v["pools"][0]["max_inflight_per_replica"], Value::from(64), "vars: {{ slots: 64 }}");
        assert_eq!(file().var("rate").as_deref(), Ok("1.5"));
        assert!(file().var("speed").is_err());
        assert_eq!(v["breaker"]["window"], Value::from("10s"));
    }

    #[test]
    fn what_a_config_says_itself_is_kept() {
        let out = file().gateway_config("pinned", &["http://127.0.0.1:5".into()], &vars(&[])).expect("fills");
        let v: Value = serde_norway::from_str(&out).expect("yaml");
        assert_eq!(v["server"]["listen"], Value::from("127.0.0.1:9"));
        assert_eq!(v["pools"][0]["replicas"], Value::Sequence(vec![Value::from("http://127.0.0.1:1")]));
    }

    #[test]
    fn a_section_is_shown_as_written() {
        let text = "title: t\ngateway:\n  main:   # why\n    pools: []\n\nload:\n  x: {}\nchecks: []\n";
        assert_eq!(raw_section(text, "gateway").as_deref(), Some("  main:   # why\n    pools: []"));
        assert_eq!(raw_section(text, "load").as_deref(), Some("  x: {}"));
        assert_eq!(raw_section(text, "about"), None);
    }

    #[test]
    fn a_line_vllm_sim_printed_gives_the_replica_and_where_it_publishes_its_kv_events() {
        let plain = r#"{"url":"http://127.0.0.1:5","model":"m","kv_events":null,"kv_events_replay":null}"#;
        assert_eq!(replica_entry(plain), Ok(Value::from("http://127.0.0.1:5")));
        let publishing =
            r#"{"url":"http://127.0.0.1:5","model":"m","kv_events":"tcp://127.0.0.1:7","kv_events_replay":"tcp://127.0.0.1:8"}"#;
        let v = replica_entry(publishing).expect("an entry");
        assert_eq!(
            (&v["url"], &v["kv_events"], &v["kv_events_replay"]),
            (&Value::from("http://127.0.0.1:5"), &Value::from("tcp://127.0.0.1:7"), &Value::from("tcp://127.0.0.1:8"))
        );
        assert!(replica_entry(r#"{"model":"m"}"#).is_err());
        assert_eq!(replica_entry("http://127.0.0.1:6"), Ok(Value::from("http://127.0.0.1:6")));
    }

    #[test]
    fn a_pool_without_replicas_needs_them_from_the_run() {
        let e = file().gateway_config("main", &[], &vars(&[("slots", "1")])).expect_err("no replicas");
        assert!(e.contains("no replicas"), "{e}");
    }

    #[test]
    fn unset_and_unknown_names_are_errors() {
        let e = file().load_scenario("main", "http://127.0.0.1:7", &vars(&[("rate", "2")])).expect_err("seed unset");
        assert!(e.contains("${seed}") && e.contains("--set seed="), "{e}");
        let e = file().gateway_config("other", &[], &vars(&[])).expect_err("no such config");
        assert!(e.contains("\"other\"") && e.contains("main, pinned"), "{e}");
    }

    #[test]
    fn a_load_is_filled_whole_and_inside_text() {
        let out = file().load_scenario("main", "http://127.0.0.1:7", &vars(&[("seed", "2"), ("rate", "7.64")])).expect("fills");
        let v: Value = serde_norway::from_str(&out).expect("yaml");
        assert_eq!(v["target"], Value::from("http://127.0.0.1:7"));
        let names: Vec<String> = var_names(&file().load["main"]).into_iter().collect();
        assert_eq!(names, ["rate", "seed"]);
        assert_eq!(v["seed"], Value::from(2));
        assert_eq!(v["streams"][0]["arrival"]["rate"], Value::from(7.64));
        assert_eq!(v["streams"][0]["model"], Value::from("m-2"));
    }

    #[test]
    fn a_file_with_two_checks_of_one_name_or_no_runs_is_refused() {
        let two = FILE.replace("checks:\n", "checks:\n  - { name: fast, measure: p50, at_most: 1 }\n");
        let f: BenchFile = serde_norway::from_str(&two).expect("parses");
        assert!(f.validate().expect_err("duplicate").contains("two checks"));
        let zero = format!("{FILE}runs: 0\n");
        let f: BenchFile = serde_norway::from_str(&zero).expect("parses");
        assert!(f.validate().is_err());
        assert!(serde_norway::from_str::<BenchFile>(&format!("{FILE}colour: red\n")).is_err(), "unknown fields are refused");
        let undeclared = FILE.replace("vars: { slots: 64, rate: 1.5 }", "vars: { slots: 64 }");
        let f: BenchFile = serde_norway::from_str(&undeclared).expect("parses");
        assert!(f.validate().expect_err("rate undeclared").contains("${rate}"));
    }

    #[test]
    fn a_given_var_replaces_the_files_and_an_unknown_one_is_refused() {
        let mut f = file();
        f.override_vars(vars(&[("slots", "8")])).expect("declared");
        assert_eq!(f.var("slots").expect("set"), "8");
        let out = f.gateway_config("main", &["http://127.0.0.1:5".into()], &BTreeMap::new()).expect("fills");
        assert!(out.contains("max_inflight_per_replica: 8"), "{out}");
        assert_eq!(f.overrides_env(), "slots=8\n");
        let err = file().override_vars(vars(&[("slot", "8")])).expect_err("undeclared");
        assert!(err.contains("slot") && err.contains("rate, slots"), "{err}");
    }
}
