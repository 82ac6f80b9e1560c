//! SLO as code: Prometheus recording and multi-window, multi-burn-rate alert
//! rules generated from the config (the Google SRE workbook's
//! method), so the SLO spec, the histogram buckets and the rules can never
//! disagree.
//!
//! Per class and per window of `slo.burn_alerts` (long and short):
//! - `slogate:ttft_sli:ratio_rate<w>`: share of first tokens within the
//!   class's TTFT target, from the histogram bucket whose `le` is that target
//!   (the gateway always exports that bucket);
//! - `slogate:itl_sli:ratio_rate<w>`: share of inter-token gaps within the
//!   ITL target (same way);
//! - `slogate:latency_sli:ratio_rate<w>`: share of completed requests
//!   within the class's targets, whatever judged them
//!   (`slogate_latency_judged_requests_total`): a token stream by its first
//!   token and gaps, speech by its first audio byte, a whole answer
//!   (embeddings, rerank, a non-streaming completion) by its time against a
//!   stream at the targets. The same verdicts as `/slo`'s latency budget;
//! - `slogate:availability_sli:ratio_rate<w>`: `ok` and `length` over every
//!   outcome except `client_error` and `cancelled`.
//!
//! Per class and per burn alert: the latency and the availability alert, firing when the error ratio exceeds `factor x (1 - objective)` over
//! both the long and the short window, with the alert's severity and a
//! runbook annotation (`runbook_url` from `slo.runbook_url` when set).

use serde::Serialize;

use crate::config::{Config, Severity};
use crate::telemetry::budget::window_label;
use crate::telemetry::{Outcome, SliClass};

#[derive(Debug, Clone, Serialize)]
pub struct RuleFile {
    pub groups: Vec<Group>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Group {
    pub name: String,
    pub rules: Vec<Rule>,
}

#[derive(Debug, Clone, Serialize)]
#[serde(untagged)]
pub enum Rule {
    Record { record: String, expr: String, labels: indexmap::IndexMap<String, String> },
    Alert(Alert),
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Alert {
    pub alert: String,
    pub expr: String,
    pub labels: indexmap::IndexMap<String, String>,
    pub annotations: indexmap::IndexMap<String, String>,
}

/// Output format of `slogate rules`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// A plain rule file (`rule_files:` / `promtool check rules`).
    Prometheus,
    /// The same groups inside a prometheus-operator `PrometheusRule`.
    PrometheusOperator,
}

/// The `le` label matcher for a bucket bound: exact, and for whole numbers
/// both spellings (`3` and `3.0`: Prometheus 3 normalises the latter).
pub fn le_matcher(secs: f64) -> String {
    let s = format!("{secs}");
    if secs.fract() == 0.0 {
        format!("le=~\"{s}|{s}\\\\.0\"")
    } else {
        format!("le=\"{s}\"")
    }
}

fn sel(class: &str) -> String {
    format!("class=\"{class}\"")
}

/// Distinct windows used by the burn alerts, shortest first.
pub fn windows(config: &Config) -> Vec<std::time::Duration> {
    crate::telemetry::budget::burn_windows(&config.slo)
}

pub fn record_name(sli: &str, window: std::time::Duration) -> String {
    format!("slogate:{sli}_sli:ratio_rate{}", window_label(window))
}

fn severity(s: Severity) -> &'static str {
    match s {
        Severity::Page => "page",
        Severity::Ticket => "ticket",
    }
}

/// The alerts, as structured values (tests compare against these).
pub fn alerts(config: &Config) -> Vec<Alert> {
    let mut out = Vec::new();
    for (class, c) in &config.classes {
        for a in &config.slo.burn_alerts {
            let (long, short) = (window_label(a.long.get()), window_label(a.short.get()));
            for (kind, sli, objective, what) in [
                (
                    "Latency",
                    "latency",
                    config.slo.latency_objective,
                    format!(
                        "completed requests outside the latency targets (a first token or byte within {} ms, gaps within {} ms; a whole answer as fast as a stream at those)",
                        c.ttft.get().as_millis(),
                        c.itl.get().as_millis()
                    ),
                ),
                ("Availability", "availability", config.slo.availability_objective, "failed requests".to_string()),
            ] {
                let threshold = a.factor * (1.0 - objective);
                let threshold = (threshold * 1e9).round() / 1e9;
                let expr = format!(
                    "(1 - {}{{{}}}) > {threshold}\nand\n(1 - {}{{{}}}) > {threshold}",
                    record_name(sli, a.long.get()),
                    sel(class),
                    record_name(sli, a.short.get()),
                    sel(class),
                );
                let mut labels = indexmap::IndexMap::new();
                labels.insert("severity".to_string(), severity(a.severity).to_string());
                labels.insert("slo".to_string(), format!("{class}-{}", kind.to_lowercase()));
                labels.insert("long_window".to_string(), long.clone());
                labels.insert("short_window".to_string(), short.clone());
                let mut ann = indexmap::IndexMap::new();
                ann.insert(
                    "summary".to_string(),
                    format!("SLO class {class}: {kind} error budget burning at more than {}x over {long} and {short}", a.factor),
                );
                ann.insert(
                    "description".to_string(),
                    format!(
                        "More than {:.4}% {what} for class {class} over both the last {long} and {short} (objective {}): at this rate the {} budget is gone in {}.",
                        threshold * 100.0,
                        objective,
                        window_label(config.slo.window.get()),
                        budget_exhaustion(config.slo.window.get(), a.factor),
                    ),
                );
                let section = format!("{}-budget-burn", kind.to_lowercase());
                match &config.slo.runbook_url {
                    Some(base) => ann.insert("runbook_url".to_string(), format!("{}#{section}", base.trim_end_matches('#'))),
                    None => ann.insert("runbook".to_string(), format!("docs/runbook.md#{section} (slogate's repository)")),
                };
                out.push(Alert { alert: format!("Slogate{kind}BudgetBurn"), expr, labels, annotations: ann });
            }
        }
    }
    out
}

fn budget_exhaustion(window: std::time::Duration, factor: f64) -> String {
    let hours = window.as_secs_f64() / 3600.0 / factor;
    if hours >= 48.0 {
        format!("{:.0} days", hours / 24.0)
    } else {
        format!("{hours:.1} hours")
    }
}

/// Every rule of the config, as a rule file.
pub fn rule_file(config: &Config) -> RuleFile {
    let mut recording = Vec::new();
    let ws = windows(config);
    for (class, c) in &config.classes {
        let s = sel(class);
        // A static class label keeps each class's rule distinct (promtool's lint).
        let labels: indexmap::IndexMap<String, String> = [("class".to_string(), class.clone())].into_iter().collect();
        for w in &ws {
            let r = window_label(*w);
            // good / valid, both summed by class over the window.
            let ratio = |sli: &str, good: String, valid: String| Rule::Record {
                record: record_name(sli, *w),
                expr: format!("sum by (class) (rate({good}[{r}]))\n/\nsum by (class) (rate({valid}[{r}]))"),
                labels: labels.clone(),
            };
            for (sli, metric, target) in
                [("ttft", "slogate_time_to_first_token_seconds", c.ttft.get()), ("itl", "slogate_inter_token_latency_seconds", c.itl.get())]
            {
                let le = le_matcher(target.as_secs_f64());
                recording.push(ratio(sli, format!("{metric}_bucket{{{s},{le}}}"), format!("{metric}_count{{{s}}}")));
            }
            let judged = "slogate_latency_judged_requests_total";
            recording.push(ratio("latency", format!("{judged}{{{s},within=\"true\"}}"), format!("{judged}{{{s}}}")));
            recording.push(ratio(
                "availability",
                format!("slogate_requests_total{{{s},outcome=~\"{}\"}}", Outcome::regex(SliClass::Good)),
                format!("slogate_requests_total{{{s},outcome!~\"{}\"}}", Outcome::regex(SliClass::Excluded)),
            ));
        }
    }
    RuleFile {
        groups: vec![
            Group { name: "slogate-sli".into(), rules: recording },
            Group { name: "slogate-slo-burn".into(), rules: alerts(config).into_iter().map(Rule::Alert).collect() },
        ],
    }
}

/// The rule file as YAML, in the requested format.
pub fn render(config: &Config, format: Format) -> Result<String, String> {
    let file = rule_file(config);
    let header = "# Generated by `slogate rules` from the SLO classes of the config: do not edit.\n";
    let body = match format {
        Format::Prometheus => serde_norway::to_string(&file).map_err(|e| e.to_string())?,
        Format::PrometheusOperator => {
            #[derive(Serialize)]
            struct Meta {
                name: &'static str,
                labels: indexmap::IndexMap<&'static str, &'static str>,
            }
            #[derive(Serialize)]
            #[serde(rename_all = "camelCase")]
            struct PrometheusRule {
                api_version: &'static str,
                kind: &'static str,
                metadata: Meta,
                spec: RuleFile,
            }
            let mut labels = indexmap::IndexMap::new();
            labels.insert("app.kubernetes.io/name", "slogate");
            let pr = PrometheusRule {
                api_version: "monitoring.coreos.com/v1",
                kind: "PrometheusRule",
                metadata: Meta { name: "slogate-slo", labels },
                spec: file,
            };
            serde_norway::to_string(&pr).map_err(|e| e.to_string())?
        }
    };
    Ok(format!("{header}{body}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alerts_link_the_runbook_where_it_is_published_and_name_its_section_otherwise() {
        let mut c = Config::default();
        let a = &alerts(&c)[0];
        assert_eq!(a.annotations.get("runbook").map(String::as_str), Some("docs/runbook.md#latency-budget-burn (slogate's repository)"));
        assert!(!a.annotations.contains_key("runbook_url"), "a relative path is no URL Alertmanager or Grafana can open");
        c.slo.runbook_url = Some("https://wiki.example.com/slogate/runbook".into());
        let a = &alerts(&c)[1];
        assert_eq!(
            a.annotations.get("runbook_url").map(String::as_str),
            Some("https://wiki.example.com/slogate/runbook#availability-budget-burn")
        );
    }

    #[test]
    fn le_matchers() {
        assert_eq!(le_matcher(0.3), "le=\"0.3\"");
        assert_eq!(le_matcher(3.0), "le=~\"3|3\\\\.0\"");
    }

    #[test]
    fn one_ttft_itl_latency_availability_rule_per_class_and_window_and_two_alerts_per_burn_alert() {
        let c = Config::default();
        let f = rule_file(&c);
        let ws = windows(&c).len();
        assert_eq!(ws, 5); // 5m 30m 1h 6h 3d
        assert_eq!(f.groups[0].rules.len(), c.classes.len() * ws * 4);
        assert_eq!(f.groups[1].rules.len(), c.classes.len() * c.slo.burn_alerts.len() * 2);
        let y = render(&c, Format::Prometheus).expect("yaml");
        assert!(y.contains("slogate_time_to_first_token_seconds_bucket{class=\"chat\",le=\"0.3\"}"), "{y}");
        assert!(y.contains("record: slogate:ttft_sli:ratio_rate5m"));
        assert!(y.contains("slogate_latency_judged_requests_total{class=\"rag\",within=\"true\"}"), "{y}");
        // The latency alert reads every signal's verdicts, not TTFT alone.
        assert!(alerts(&c).iter().filter(|a| a.alert == "SlogateLatencyBudgetBurn").all(|a| a.expr.contains("slogate:latency_sli:")));
        let op = render(&c, Format::PrometheusOperator).expect("yaml");
        assert!(op.contains("kind: PrometheusRule") && op.contains("apiVersion: monitoring.coreos.com/v1"));
    }
}
