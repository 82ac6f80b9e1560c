//! Judging a scenario's runs: each check against each run's measured
//! values, the verdict on the median run, and the result's README.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Deserialize;

use super::BenchFile;

/// One claim: a measured value and the bound it must keep.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Check {
    /// The claim as the reader sees it.
    pub name: String,
    /// The key in the run's `measured.json`.
    pub measure: String,
    #[serde(default)]
    pub at_most: Option<f64>,
    #[serde(default)]
    pub at_least: Option<f64>,
    #[serde(default)]
    pub between: Option<[f64; 2]>,
    /// For a yes/no measure: the answer the claim needs.
    #[serde(default)]
    pub is: Option<bool>,
    /// Met only when every run meets it (a claim about each run, such as
    /// "never refused"), not most runs.
    #[serde(default)]
    pub every_run: bool,
}

/// One measured value: a number or a yes/no, with how the report states it.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(untagged)]
pub enum Measured {
    /// Not measured in this run (null).
    Null,
    Number(f64),
    Flag(bool),
    Stated {
        value: Option<Value>,
        #[serde(default)]
        text: Option<String>,
    },
}

#[derive(Debug, Clone, Copy, Deserialize, PartialEq)]
#[serde(untagged)]
pub enum Value {
    Number(f64),
    Flag(bool),
}

/// One run's answer to one check.
#[derive(Debug, Clone, PartialEq)]
pub struct Verdict {
    pub met: bool,
    /// What was measured, as the result states it.
    pub shown: String,
}

impl Check {
    pub(super) fn validate(&self) -> Result<(), String> {
        let bounds = [self.at_most.is_some(), self.at_least.is_some(), self.between.is_some(), self.is.is_some()];
        match bounds.iter().filter(|b| **b).count() {
            1 => Ok(()),
            _ => Err(format!("check {:?}: give exactly one of at_most, at_least, between, is", self.name)),
        }
    }

    /// This check against one run's measured values. A value the run did
    /// not measure (absent or null) does not meet the check.
    pub fn judge(&self, measured: &BTreeMap<String, Measured>) -> Verdict {
        let (value, text) = match measured.get(&self.measure) {
            Some(Measured::Number(n)) => (Some(Value::Number(*n)), None),
            Some(Measured::Flag(b)) => (Some(Value::Flag(*b)), None),
            Some(Measured::Stated { value, text }) => (*value, text.clone()),
            Some(Measured::Null) | None => (None, None),
        };
        let met = match value {
            Some(Value::Number(n)) if n.is_finite() => match (self.at_most, self.at_least, self.between) {
                (Some(max), _, _) => n <= max,
                (_, Some(min), _) => n >= min,
                (_, _, Some([lo, hi])) => lo <= n && n <= hi,
                _ => false,
            },
            Some(Value::Flag(b)) => self.is == Some(b),
            _ => false,
        };
        let shown = text.unwrap_or_else(|| match value {
            Some(Value::Number(n)) => number(n),
            Some(Value::Flag(b)) => (if b { "yes" } else { "no" }).to_string(),
            None => "not measured".to_string(),
        });
        Verdict { met, shown }
    }
}

/// A number as a result states it: at most three decimals, none trailing.
pub fn number(n: f64) -> String {
    if !n.is_finite() {
        return n.to_string();
    }
    let s = format!("{n:.3}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    if s == "-0" {
        "0".to_string()
    } else {
        s.to_string()
    }
}

/// Met on the median run: most runs meet it (for a bound on a number that
/// is exactly the median run meeting it).
pub fn met_by_most(verdicts: &[Verdict]) -> bool {
    2 * verdicts.iter().filter(|v| v.met).count() > verdicts.len()
}

/// One run as the runner collected it.
pub struct Run {
    pub measured: BTreeMap<String, Measured>,
    /// The driver's report (Markdown, its own `##` sections).
    pub report: String,
}

/// The result's README: heading, stamp, what runs, the checks over all
/// runs, the configurations and loads as the scenario file gives them, then
/// each run's report one heading level down.
pub fn readme(name: &str, file: &BenchFile, machine: &str, runs: &[Run]) -> String {
    let mut out = String::new();
    let n = runs.len();
    let _ = writeln!(out, "# {}\n", file.title);
    let _ = writeln!(
        out,
        "Machine: {machine}. Produced by `loadtest/run {name}` (scenario `loadtest/scenarios/{name}.yaml`, driver `loadtest/bench/{}`), {n} run{}{}.\n",
        file.driver,
        if n == 1 { "" } else { "s" },
        if n > 1 {
            ", each on fresh replicas and gateways with its load drawn from another seed; a check is met when the median run meets it \
             (most runs do), and every run's number is stated; the charts are run 1's"
        } else {
            ""
        }
    );
    if !file.about.trim().is_empty() {
        let _ = writeln!(out, "{}\n", file.about.trim());
    }
    if !file.overrides.is_empty() {
        let given: Vec<String> = file.overrides.iter().map(|(k, v)| format!("`{k}` = `{v}`")).collect();
        let _ = writeln!(out, "Given for this result, over the file's vars: {}.\n", given.join(", "));
    }
    write_checks(&mut out, file, runs);
    write_inputs(&mut out, file);
    for (i, run) in runs.iter().enumerate() {
        let _ = writeln!(out, "\n## Run {}\n", i + 1);
        for line in run.report.trim().lines() {
            if line.starts_with("# ") {
                continue; // the driver's own title; the result's is above
            }
            let demoted = if line.starts_with('#') { format!("#{line}") } else { line.to_string() };
            let _ = writeln!(out, "{demoted}");
        }
    }
    out
}

fn write_checks(out: &mut String, file: &BenchFile, runs: &[Run]) {
    if file.checks.is_empty() {
        return;
    }
    let n = runs.len();
    out.push_str("## Checks\n\n| check | result |");
    if n > 1 {
        (1..=n).for_each(|i| {
            let _ = write!(out, " run {i} |");
        });
    } else {
        out.push_str(" measured |");
    }
    let _ = writeln!(out, "\n|---|---|{}", "---|".repeat(n));
    for c in &file.checks {
        let v: Vec<Verdict> = runs.iter().map(|r| c.judge(&r.measured)).collect();
        let met = if c.every_run { v.iter().all(|x| x.met) } else { met_by_most(&v) };
        let verdict = if met { "met" } else { "**not met**" };
        let _ = write!(out, "| {} | {verdict}", c.name);
        if n > 1 {
            let every = if c.every_run { ", every run needed" } else { "" };
            let _ = write!(out, " (in {} of {n}{every})", v.iter().filter(|x| x.met).count());
        }
        out.push_str(" |");
        for x in &v {
            let _ = write!(out, " {}{} |", if x.met || n == 1 { "" } else { "not met: " }, x.shown);
        }
        out.push('\n');
    }
}

fn write_inputs(out: &mut String, file: &BenchFile) {
    let sections = [
        (
            "gateway",
            "Gateway configuration",
            "As the scenario file writes it; each run adds the listen addresses (free loopback ports), a 5 s shutdown grace \
             and the pool's replicas, and fills each `${var}` with the run's value \
             (the driver's where it sets one, else the file's `vars`).",
            file.gateway.is_empty(),
        ),
        ("load", "Load", "loadgen scenarios, filled the same way (the seed is the run's number).", file.load.is_empty()),
    ];
    for (key, title, what, empty) in sections {
        if empty {
            continue;
        }
        let text = super::raw_section(&file.source, key).unwrap_or_else(|| {
            let v = if key == "gateway" { &file.gateway } else { &file.load };
            let mut m = serde_norway::Mapping::new();
            m.insert(key.into(), serde_norway::to_value(v).unwrap_or_default());
            serde_norway::to_string(&m).unwrap_or_default().trim_end().to_string()
        });
        let text = if text.starts_with(&format!("{key}:")) { text } else { format!("{key}:\n{text}") };
        let _ = writeln!(out, "\n## {title}\n\n{what}\n\n```yaml\n{}\n```", text.trim_end());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(yaml: &str) -> Check {
        let c: Check = serde_norway::from_str(yaml).expect("parses");
        c.validate().expect("valid");
        c
    }

    fn measured(json: &str) -> BTreeMap<String, Measured> {
        serde_json::from_str(json).expect("measured.json")
    }

    #[test]
    fn bounds_and_flags_are_judged_as_written() {
        let m = measured(
            r#"{"p99": 250.5, "opened": false, "delay": {"value": 31.2, "text": "31.20 s (log)"}, "none": null,
                             "late": {"value": null, "text": "never opened"}}"#,
        );
        let cases = [
            ("{name: a, measure: p99, at_most: 300}", true, "250.5"),
            ("{name: a, measure: p99, at_most: 250}", false, "250.5"),
            ("{name: a, measure: p99, at_least: 250.5}", true, "250.5"),
            ("{name: a, measure: delay, between: [30, 33]}", true, "31.20 s (log)"),
            ("{name: a, measure: delay, between: [32, 33]}", false, "31.20 s (log)"),
            ("{name: a, measure: opened, is: false}", true, "no"),
            ("{name: a, measure: opened, is: true}", false, "no"),
            ("{name: a, measure: missing, at_most: 1}", false, "not measured"),
            ("{name: a, measure: late, between: [30, 33]}", false, "never opened"),
        ];
        for (yaml, met, shown) in cases {
            let v = check(yaml).judge(&m);
            assert_eq!((v.met, v.shown.as_str()), (met, shown), "{yaml}");
        }
    }

    #[test]
    fn a_check_states_exactly_one_bound() {
        for yaml in ["{name: a, measure: x}", "{name: a, measure: x, at_most: 1, at_least: 0}"] {
            let c: Check = serde_norway::from_str(yaml).expect("parses");
            assert!(c.validate().is_err(), "{yaml}");
        }
    }

    #[test]
    fn the_verdict_is_the_median_runs() {
        let v = |met| Verdict { met, shown: String::new() };
        assert!(met_by_most(&[v(true), v(false), v(true)]));
        assert!(!met_by_most(&[v(true), v(false), v(false)]));
        assert!(!met_by_most(&[v(true), v(false)]), "a tie is not most");
        assert!(met_by_most(&[v(true)]));
    }

    #[test]
    fn numbers_are_stated_without_noise() {
        assert_eq!(number(250.0), "250");
        assert_eq!(number(97.1234), "97.123");
        assert_eq!(number(-0.0001), "0");
    }

    #[test]
    fn the_readme_states_each_runs_number_and_demotes_reports() {
        let file: BenchFile = serde_norway::from_str(
            "title: Breaker\ndriver: admission.sh breaker\nabout: One replica.\ngateway:\n  main: {breaker: {window: 10s}}\n\
             checks:\n  - {name: fast enough, measure: p99, at_most: 300}\n  - {name: each fast, measure: p99, at_most: 300, every_run: true}\n",
        )
        .expect("parses");
        let run =
            |p99: f64| Run { measured: measured(&format!(r#"{{"p99": {p99}}}"#)), report: "# own title\n\n## Timeline\n\nrows\n".into() };
        let md = readme("admission/breaker", &file, "commit abc, 2 cores", &[run(250.0), run(320.0), run(280.0)]);
        assert!(md.starts_with("# Breaker\n\nMachine: commit abc, 2 cores. Produced by `loadtest/run admission/breaker`"), "{md}");
        assert!(md.contains("| fast enough | met (in 2 of 3) | 250 | not met: 320 | 280 |"), "{md}");
        assert!(md.contains("| each fast | **not met** (in 2 of 3, every run needed) |"), "{md}");
        assert!(md.contains("### Timeline") && !md.contains("own title"), "{md}");
        assert!(md.contains("window: 10s"), "the configuration is shown: {md}");
        assert_eq!(md.matches("## Run ").count(), 3);
    }
}
