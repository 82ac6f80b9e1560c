//! `slogate rules` checked by Prometheus's own promtool: the generated file
//! for the example config is the one committed under config/, `promtool
//! check rules` accepts it, and `promtool test rules` with synthetic series
//! shows a TTFT degradation firing the fast-burn page within the expected
//! minutes, a slow degradation firing only the ticket, an availability
//! burn paging, and healthy traffic firing nothing.

use std::path::Path;

use crate::common::{repo, which};
use std::process::Command;

use slogate::config::Config;
use slogate::rules::{alerts, render, Alert, Format};

fn promtool(args: &[&str], dir: &Path) -> (bool, String) {
    let bin = which("promtool").expect("promtool not found: run scripts/test, which installs Debian's prometheus package");
    let out = Command::new(bin).args(args).current_dir(dir).output().expect("run promtool");
    (out.status.success(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
}

#[test]
fn committed_rules_are_generated_from_the_example_config_and_promtool_accepts_them() {
    let cfg = Config::load(&repo().join("config/slogate.yaml")).expect("example config");
    for (format, file) in [
        (Format::Prometheus, "deploy/monitoring/slogate.rules.yaml"),
        (Format::PrometheusOperator, "deploy/monitoring/slogate.prometheusrule.yaml"),
    ] {
        let generated = render(&cfg, format).expect("render");
        let committed = std::fs::read_to_string(repo().join(file)).unwrap_or_default();
        assert!(generated == committed, "{file} is stale: regenerate it with `slogate rules` (see README)");
    }
    let (ok, out) = promtool(&["check", "rules", "deploy/monitoring/slogate.rules.yaml"], &repo());
    assert!(ok, "promtool check rules failed:\n{out}");
    assert!(out.contains("SUCCESS"), "{out}");
}

/// One expected alert in promtool's test format.
fn expect(a: &Alert, class: &str) -> serde_json::Value {
    let mut labels = serde_json::Map::new();
    labels.insert("class".into(), class.into());
    for (k, v) in &a.labels {
        labels.insert(k.clone(), v.clone().into());
    }
    serde_json::json!({"exp_labels": labels, "exp_annotations": a.annotations})
}

#[test]
fn promtool_test_rules_fires_the_right_alerts_at_the_right_minutes() {
    let cfg = Config::default(); // latency 0.99, availability 0.999, burn alerts 1h/5m x14.4, 6h/30m x6, 3d/6h x1
    let tmp = tempdir();
    let dir = tmp.path();
    std::fs::write(dir.join("rules.yaml"), render(&cfg, Format::Prometheus).expect("render")).expect("write rules");
    let all = alerts(&cfg);
    let pick_for = |class: &str, kind: &str, long: &str| -> serde_json::Value {
        let a = all
            .iter()
            .find(|a| {
                a.alert == format!("Slogate{kind}BudgetBurn")
                    && a.labels["slo"] == format!("{class}-{}", kind.to_lowercase())
                    && a.labels["long_window"] == long
            })
            .expect("alert");
        expect(a, class)
    };
    let pick = |kind: &str, long: &str| pick_for("chat", kind, long);
    let (lat, avail) = ("SlogateLatencyBudgetBurn", "SlogateAvailabilityBudgetBurn");
    let none = serde_json::json!([]);
    // Completed requests' verdicts: within the class's targets or not.
    let within = r#"slogate_latency_judged_requests_total{class="chat",signal="ttft",within="true"}"#;
    let late = r#"slogate_latency_judged_requests_total{class="chat",signal="ttft",within="false"}"#;
    let rag_within = r#"slogate_latency_judged_requests_total{class="rag",signal="e2e",within="true"}"#;
    let rag_late = r#"slogate_latency_judged_requests_total{class="rag",signal="e2e",within="false"}"#;
    let ok = r#"slogate_requests_total{class="chat",outcome="ok"}"#;
    let err = r#"slogate_requests_total{class="chat",outcome="upstream_error"}"#;
    let tests = serde_json::json!({
        "rule_files": ["rules.yaml"],
        "evaluation_interval": "1m",
        "tests": [
            {
                "name": "TTFT degradation: 50 % of streams late from minute 60 pages within 18 minutes (1h/5m at 14.4x)",
                "interval": "1m",
                "input_series": [
                    {"series": within, "values": "0+100x60 6050+50x120"},
                    {"series": late, "values": "0x60 50+50x120"},
                    {"series": ok, "values": "0+100x180"},
                ],
                "alert_rule_test": [
                    {"eval_time": "59m", "alertname": lat, "exp_alerts": none},
                    // 15 minutes in: the 6h/30m page and the ticket, not yet the fast page (12.5 % < 14.4 %).
                    {"eval_time": "75m", "alertname": lat, "exp_alerts": [pick("Latency", "6h"), pick("Latency", "3d")]},
                    // 25 minutes in: the fast-burn page too.
                    {"eval_time": "85m", "alertname": lat, "exp_alerts": [pick("Latency", "1h"), pick("Latency", "6h"), pick("Latency", "3d")]},
                    {"eval_time": "85m", "alertname": avail, "exp_alerts": none},
                ],
            },
            {
                "name": "slow degradation: 2 % late from minute 60 fires only the ticket, after the 6h window passes 1 %",
                "interval": "1m",
                "input_series": [
                    {"series": within, "values": "0+100x60 6098+98x300"},
                    {"series": late, "values": "0x60 2+2x300"},
                    {"series": ok, "values": "0+100x360"},
                ],
                "alert_rule_test": [
                    {"eval_time": "115m", "alertname": lat, "exp_alerts": none},
                    {"eval_time": "130m", "alertname": lat, "exp_alerts": [pick("Latency", "3d")]},
                    {"eval_time": "6h", "alertname": lat, "exp_alerts": [pick("Latency", "3d")]},
                ],
            },
            {
                "name": "availability: 10 upstream errors a minute on 100 ok from minute 60 pages",
                "interval": "1m",
                "input_series": [
                    {"series": within, "values": "0+100x120"},
                    {"series": late, "values": "0x120"},
                    {"series": ok, "values": "0+100x120"},
                    {"series": err, "values": "0x59 0+10x60"},
                ],
                "alert_rule_test": [
                    {"eval_time": "59m", "alertname": avail, "exp_alerts": none},
                    {"eval_time": "75m", "alertname": avail, "exp_alerts": [pick("Availability", "1h"), pick("Availability", "6h"), pick("Availability", "3d")]},
                    {"eval_time": "75m", "alertname": lat, "exp_alerts": none},
                ],
            },
            {
                "name": "healthy: 0.1 % late, no errors, fires nothing",
                "interval": "1m",
                "input_series": [
                    {"series": within, "values": "0+999x360"},
                    {"series": late, "values": "0+1x360"},
                    {"series": ok, "values": "0+1000x360"},
                    {"series": err, "values": "0x360"},
                ],
                "alert_rule_test": [
                    {"eval_time": "30m", "alertname": lat, "exp_alerts": none},
                    {"eval_time": "2h", "alertname": lat, "exp_alerts": none},
                    {"eval_time": "6h", "alertname": lat, "exp_alerts": none},
                    {"eval_time": "6h", "alertname": avail, "exp_alerts": none},
                ],
            },
            {
                "name": "whole answers: half of class rag's embeddings slower than its target from minute 60 pages rag, not chat",
                "interval": "1m",
                "input_series": [
                    {"series": within, "values": "0+100x120"},
                    {"series": late, "values": "0x120"},
                    {"series": rag_within, "values": "0+100x60 6050+50x60"},
                    {"series": rag_late, "values": "0x60 50+50x60"},
                ],
                "alert_rule_test": [
                    {"eval_time": "59m", "alertname": lat, "exp_alerts": none},
                    {"eval_time": "85m", "alertname": lat, "exp_alerts": [pick_for("rag", "Latency", "1h"), pick_for("rag", "Latency", "6h"), pick_for("rag", "Latency", "3d")]},
                ],
            },
        ],
    });
    // JSON is YAML.
    std::fs::write(dir.join("tests.yaml"), serde_json::to_vec_pretty(&tests).expect("json")).expect("write tests");
    let (ok, out) = promtool(&["test", "rules", "tests.yaml"], dir);
    assert!(ok, "promtool test rules failed:\n{out}");
    assert!(out.contains("SUCCESS"), "{out}");
}

/// Removed when dropped.
fn tempdir() -> tempfile::TempDir {
    tempfile::tempdir().expect("temp dir")
}
