use std::time::Duration;

use super::*;
use crate::config::{Endpoint, Tier};
use crate::telemetry::series::ClassSeries;
use crate::telemetry::Outcome;

#[test]
fn buckets_contain_every_target_and_twice_it() {
    let b = buckets_with_targets(LATENCY_BASE, [0.3, 0.15, 0.1, 0.4, 3.0, 0.123]);
    for want in [0.3, 0.15, 0.1, 0.4, 3.0, 6.0, 0.8, 0.123, 0.246] {
        assert!(b.contains(&want), "{want} missing from {b:?}");
    }
    assert!(b.windows(2).all(|w| w[0] < w[1]), "sorted and unique: {b:?}");
}

/// `name value` of the exposition line that starts with `prefix`.
fn sample(text: &str, prefix: &str) -> Option<f64> {
    text.lines().find(|l| l.starts_with(prefix)).and_then(|l| l.rsplit(' ').next()).and_then(|v| v.parse().ok())
}

#[test]
fn each_class_has_buckets_at_its_own_targets() {
    let cfg = Config::parse("classes:\n  chat: { tier: interactive, ttft: 300ms, itl: 50ms }\n  odd: { tier: batch, ttft: 1234ms, itl: 77ms }\ndefault_class: chat\n").expect("valid");
    let m = Metrics::new(&cfg);
    for (class, tier, ttft, itl) in [("chat", Tier::Interactive, 300, 50), ("odd", Tier::Batch, 1234, 77)] {
        let c = ClassSeries::new(class, tier, Duration::from_millis(ttft), Duration::from_millis(itl));
        let s = c.for_request("m", Endpoint::Chat);
        s.ttft(&m).observe(0.1);
        s.itl(&m).observe(0.01);
        c.queue_time(&m).observe(0.01);
    }
    let text = m.encode();
    let has = |metric: &str, class: &str, le: &str| {
        text.lines().any(|x| {
            x.starts_with(&format!("{metric}_bucket{{")) && x.contains(&format!("class=\"{class}\"")) && x.contains(&format!("le=\"{le}\""))
        })
    };
    for le in ["0.3", "0.6"] {
        assert!(has("slogate_time_to_first_token_seconds", "chat", le), "chat ttft {le} missing\n{text}");
        assert!(has("slogate_queue_time_seconds", "chat", le), "chat queue {le} missing");
    }
    for le in ["1.234", "2.468"] {
        assert!(has("slogate_time_to_first_token_seconds", "odd", le), "odd ttft {le} missing");
        assert!(!has("slogate_time_to_first_token_seconds", "chat", le), "odd's target {le} is not in chat's series");
    }
    for le in ["0.05", "0.1"] {
        assert!(has("slogate_inter_token_latency_seconds", "chat", le), "chat itl {le} missing");
    }
    for le in ["0.077", "0.154"] {
        assert!(has("slogate_inter_token_latency_seconds", "odd", le), "odd itl {le} missing");
    }
}

/// A reload that changes a class's target gives the class new
/// [`ClassSeries`]; the series they write grow by the new bounds and keep
/// the old ones, what was counted, and what requests started before still count.
#[test]
fn a_changed_target_adds_its_buckets_and_keeps_the_old_ones_and_their_counts() {
    let m = Metrics::new(&Config::default());
    let before = ClassSeries::new("chat", Tier::Interactive, Duration::from_millis(300), Duration::from_millis(50));
    let running = before.for_request("m", Endpoint::Chat);
    for v in [0.1, 0.26, 0.29, 0.9] {
        running.ttft(&m).observe(v);
    }
    let text = m.encode();
    let p = |le: &str| {
        format!(
            "slogate_time_to_first_token_seconds_bucket{{le=\"{le}\",model=\"m\",class=\"chat\",tier=\"interactive\",endpoint=\"chat\"}}"
        )
    };
    assert_eq!(sample(&text, &p("0.3")), Some(3.0));
    assert_eq!(sample(&text, &p("0.25")), None, "not a bucket yet");

    let after = ClassSeries::new("chat", Tier::Interactive, Duration::from_millis(250), Duration::from_millis(50));
    assert!(!after.has_targets(Duration::from_millis(300), Duration::from_millis(50)));
    let new = after.for_request("m", Endpoint::Chat);
    for v in [0.24, 0.27] {
        new.ttft(&m).observe(v);
    }
    // A request that looked its series up before the reload ends now.
    running.ttft(&m).observe(0.2);
    let text = m.encode();
    // Old and new bounds; the counts before the change fall in the old
    // buckets (0.26 and 0.29 stay above 0.25: they are not known to be under it).
    for (le, want) in [("0.2", 2.0), ("0.25", 3.0), ("0.3", 6.0), ("0.5", 6.0), ("0.6", 6.0), ("+Inf", 7.0)] {
        assert_eq!(sample(&text, &p(le)), Some(want), "le={le} in\n{text}");
    }
    let count = "slogate_time_to_first_token_seconds_count{model=\"m\",class=\"chat\",tier=\"interactive\",endpoint=\"chat\"}";
    assert_eq!(sample(&text, count), Some(7.0));
    let sum = "slogate_time_to_first_token_seconds_sum{model=\"m\",class=\"chat\",tier=\"interactive\",endpoint=\"chat\"}";
    let want_sum = 0.1 + 0.26 + 0.29 + 0.9 + 0.24 + 0.27 + 0.2;
    assert!((sample(&text, sum).unwrap_or(0.0) - want_sum).abs() < 1e-6);
    // The same targets again: the same series, not another layer.
    let again = ClassSeries::new("chat", Tier::Interactive, Duration::from_millis(300), Duration::from_millis(50));
    assert_eq!(sample(&m.encode(), &p("0.25")), Some(3.0));
    again.for_request("m", Endpoint::Chat).ttft(&m).observe(0.01);
    assert_eq!(sample(&m.encode(), &p("0.25")), Some(4.0), "a layout the series covers reuses it");
}

#[test]
fn class_series_write_the_family_series_and_create_them_on_first_write() {
    let cfg = Config::parse("classes:\n  chat: { tier: interactive, ttft: 300ms, itl: 50ms }\ndefault_class: chat\n").expect("valid");
    let m = Metrics::new(&cfg);
    let c = ClassSeries::new("chat", Tier::Interactive, Duration::from_millis(300), Duration::from_millis(50));
    let s = c.for_request("m", Endpoint::Chat);
    assert!(Arc::ptr_eq(&s, &c.for_request("m", Endpoint::Chat)), "one series set per model");
    assert_eq!(s.model(), "m");
    // Nothing written yet: no request series in the exposition.
    let before = m.encode();
    assert!(!before.contains("slogate_requests_total{"), "{before}");
    assert!(!before.contains("slogate_time_to_first_token_seconds_count{"), "{before}");
    s.outcome(&m, Outcome::ok).inc();
    s.outcome(&m, Outcome::ok).inc();
    s.outcome(&m, Outcome::stream_error).inc();
    s.ttft(&m).observe(0.1);
    s.prompt_tokens(&m).inc_by(7);
    c.breach(&m, BreachKind::itl).inc();
    c.goodput(&m).inc();
    c.for_request("unknown", Endpoint::Chat).outcome(&m, Outcome::client_error).inc();
    let text = m.encode();
    for line in [
        r#"slogate_requests_total{model="m",class="chat",tier="interactive",endpoint="chat",outcome="ok"} 2"#,
        r#"slogate_requests_total{model="m",class="chat",tier="interactive",endpoint="chat",outcome="stream_error"} 1"#,
        r#"slogate_requests_total{model="unknown",class="chat",tier="interactive",endpoint="chat",outcome="client_error"} 1"#,
        r#"slogate_time_to_first_token_seconds_count{model="m",class="chat",tier="interactive",endpoint="chat"} 1"#,
        r#"slogate_prompt_tokens_total{model="m",class="chat"} 7"#,
        r#"slogate_slo_breaches_total{class="chat",kind="itl"} 1"#,
        r#"slogate_goodput_requests_total{class="chat"} 1"#,
    ] {
        assert!(text.lines().any(|l| l == line), "missing {line} in\n{text}");
    }
    // Outcomes, breach kinds and series never written stay absent.
    for absent in
        [r#"outcome="length""#, r#"kind="ttft""#, "slogate_e2e_request_latency_seconds_count{", "slogate_generation_tokens_total{"]
    {
        assert!(!text.contains(absent), "{absent} should not be in\n{text}");
    }
}
