//! Report of `loadtest/bench/independent.sh`: aiperf's numbers beside
//! slogate's own for the same requests (its `/metrics` read before and
//! after the run), and the same comparison straight to the replicas as the
//! control.
//!
//! ```text
//! bench report independent DIR GENERATOR
//! ```

use std::fmt::Write as _;
use std::path::Path;

use serde_json::Value;

use super::out::{g, n, read_json, signed, write, Measured};
use super::prom::{bucket_of, buckets, delta_of, label, quantile, samples, Samples};

/// A histogram's mean between two scrapes: its sum over its count.
fn mean(before: &Samples, after: &Samples, name: &str) -> f64 {
    let all = |_: &[(String, String)]| true;
    delta_of(before, after, &format!("{name}_sum"), all) / delta_of(before, after, &format!("{name}_count"), all).max(1.0)
}

/// One quantile's row: the client's value, the gateway's from its buckets,
/// the client's bucket, and whether both fall in it.
fn row(name: &str, theirs: f64, ours: f64, ours_says: &str, bs: &[(f64, f64)]) -> (String, bool) {
    let b = bucket_of(theirs, bs);
    let same = b == bucket_of(ours, bs);
    let verdict = if same { "same" } else { "different" };
    let text = format!(
        "| {name} | {} ms | {} ms ({ours_says}) | {}-{} ms | {verdict} |",
        n(theirs * 1000.0, 2),
        n(ours * 1000.0, 2),
        g(b.0 * 1000.0),
        g(b.1 * 1000.0)
    );
    (text, same)
}

/// `bench report independent DIR GENERATOR`.
pub(super) fn independent(dir: &Path, generator: &str) -> Result<(), String> {
    let (before, after) = (samples(&dir.join("before.prom"))?, samples(&dir.join("after.prom"))?);
    let (rb, ra) = (samples(&dir.join("replica-before.prom"))?, samples(&dir.join("replica-after.prom"))?);
    let a = read_json::<Value>(&dir.join("aiperf/profile_export_aiperf.json"))?;
    let ttft = &a["time_to_first_token"];
    let ms = |v: &Value, key: &str| v[key].as_f64().unwrap_or(f64::NAN);
    // (An integer sum: a float one starts at -0 and prints "-0" when empty.)
    let errors = a["error_summary"].as_array().map_or(0, |e| e.iter().filter_map(|x| x["count"].as_u64()).sum::<u64>());
    let sent = ms(&a["request_count"], "avg");
    let counted = delta_of(&before, &after, "slogate_requests_total", |_| true);
    let good = delta_of(&before, &after, "slogate_requests_total", |l| matches!(label(l, "outcome"), Some("ok" | "length")));
    let bs = buckets(&before, &after, "slogate_time_to_first_token_seconds_bucket", |_| true);
    let mut m = Measured::default();
    let mut rows = Vec::new();
    for (q, key) in [(0.5, "p50"), (0.99, "p99")] {
        let (theirs, ours) = (ms(ttft, key) / 1000.0, quantile(q, &bs));
        let (text, same) = row(&format!("TTFT {key}"), theirs, ours, "from its buckets", &bs);
        rows.push(text);
        m.flag(&format!("{key}_same_bucket"), same, format!("{} ms vs {} ms", n(theirs * 1000.0, 2), n(ours * 1000.0, 2)));
    }
    let mean_ours = mean(&before, &after, "slogate_time_to_first_token_seconds");
    let mean_theirs = ms(ttft, "avg") / 1000.0;
    // The control: aiperf straight to one replica, against the simulator's own TTFT.
    let d = read_json::<Value>(&dir.join("direct/profile_export_aiperf.json"))?;
    let sim_mean = mean(&rb, &ra, "vllm:time_to_first_token_seconds");
    let direct_mean = ms(&d["time_to_first_token"], "avg") / 1000.0;
    let (gap_gateway, gap_direct) = (mean_theirs - mean_ours, direct_mean - sim_mean);
    let exact = "exact: its sum over its count";
    rows.insert(0, format!("| TTFT mean | {} ms | {} ms ({exact}) | | |", n(mean_theirs * 1000.0, 2), n(mean_ours * 1000.0, 2)));
    let sim_b = buckets(&rb, &ra, "vllm:time_to_first_token_seconds_bucket", |_| true);
    let direct_p99 = ms(&d["time_to_first_token"], "p99") / 1000.0;
    let name = "control, straight to the replicas: TTFT p99";
    rows.push(row(name, direct_p99, quantile(0.99, &sim_b), "the replicas' own, from their buckets", &sim_b).0);
    m.stated(
        "gap_difference_ms",
        (gap_gateway - gap_direct).abs() * 1000.0,
        format!(
            "through slogate: aiperf {} - slogate {} = {} ms; straight to the replicas: aiperf {} - the replicas' own {} = {} ms",
            n(mean_theirs * 1000.0, 2),
            n(mean_ours * 1000.0, 2),
            signed(gap_gateway * 1000.0, 2),
            n(direct_mean * 1000.0, 2),
            n(sim_mean * 1000.0, 2),
            signed(gap_direct * 1000.0, 2)
        ),
    );
    let said = format!("aiperf {} sent ({errors} errors), slogate {} counted, {} good", n(sent, 0), n(counted, 0), n(good, 0));
    m.flag("counted_once", counted == sent && errors == 0, said);
    m.write(dir)?;
    let mut f = format!(
        "Load generator: {generator}.\n\n| measure | aiperf (client) | slogate (gateway) | bucket | same bucket |\n|---|---|---|---|---|\n"
    );
    for r in rows {
        let _ = writeln!(f, "{r}");
    }
    let _ = writeln!(
        f,
        "\naiperf's TTFT: mean {} ms, p90 {} ms, max {} ms.",
        n(ms(ttft, "avg"), 2),
        n(ms(ttft, "p90"), 2),
        n(ms(ttft, "max"), 2)
    );
    write(&dir.join("report.md"), &f)
}
