//! Report of `loadtest/bench/messages.sh`: Anthropic's SDK's own timings
//! and usage beside slogate's `/metrics` for the same Messages (read
//! before and after the run).
//!
//! ```text
//! bench report messages DIR CLIENT
//! ```

use std::fmt::Write as _;
use std::path::Path;

use serde_json::Value;

use super::out::{g, n, write, Measured};
use super::prom::{bucket_of, buckets, delta_of, label, quantile, samples};
use super::records::pct_floor;

fn numbers(v: &Value) -> Vec<f64> {
    v.as_array().map(|a| a.iter().filter_map(Value::as_f64).collect()).unwrap_or_default()
}

/// `bench report messages DIR CLIENT`.
pub(super) fn messages(dir: &Path, client: &str) -> Result<(), String> {
    let (before, after) = (samples(&dir.join("before.prom"))?, samples(&dir.join("after.prom"))?);
    let sdk: Value = super::out::read_json(&dir.join("sdk.json"))?;
    let msgs = |l: &[(String, String)]| label(l, "endpoint") == Some("messages");
    let counted = delta_of(&before, &after, "slogate_requests_total", msgs);
    let good = delta_of(&before, &after, "slogate_requests_total", |l| msgs(l) && matches!(label(l, "outcome"), Some("ok" | "length")));
    let (ttft, gaps) = (numbers(&sdk["ttft_s"]), numbers(&sdk["gaps_s"]));
    let read = ttft.len() as f64;
    let sent = sdk["sent"].as_f64().unwrap_or(f64::NAN);
    let errors = sdk["errors"].as_array().map_or(0, Vec::len);
    let mut m = Measured::default();
    m.flag(
        "counted_once",
        counted == sent && good == read && read == sent && errors == 0,
        format!("the SDK sent {}, read {read} ({errors} failed); slogate counted {}, {} good", n(sent, 0), n(counted, 0), n(good, 0)),
    );
    let prompt = delta_of(&before, &after, "slogate_prompt_tokens_total", |_| true);
    let output = delta_of(&before, &after, "slogate_generation_tokens_total", |_| true);
    let (input_sdk, output_sdk) = (sdk["usage"]["input"].as_f64().unwrap_or(f64::NAN), sdk["usage"]["output"].as_f64().unwrap_or(f64::NAN));
    let tokens = format!("prompt {} vs {}, output {} vs {}", n(prompt, 0), n(input_sdk, 0), n(output, 0), n(output_sdk, 0));
    m.flag("tokens_equal", prompt == input_sdk && output == output_sdk, tokens.clone());
    let mut rows = String::new();
    for (name, series, values) in
        [("TTFT", "slogate_time_to_first_token_seconds_bucket", &ttft), ("ITL", "slogate_inter_token_latency_seconds_bucket", &gaps)]
    {
        let bs = buckets(&before, &after, series, msgs);
        for (q, key) in [(0.5, "p50"), (0.99, "p99")] {
            let (theirs, ours) = (pct_floor(values, q), quantile(q, &bs));
            let b = bucket_of(theirs, &bs);
            let same = b == bucket_of(ours, &bs);
            let (t, o) = (n(theirs * 1000.0, 2), n(ours * 1000.0, 2));
            let verdict = if same { "same" } else { "different" };
            let _ = writeln!(rows, "| {name} {key} | {t} ms | {o} ms | {}-{} ms | {verdict} |", g(b.0 * 1000.0), g(b.1 * 1000.0));
            m.flag(&format!("{}_{key}_same_bucket", name.to_lowercase()), same, format!("{t} ms vs {o} ms"));
        }
    }
    m.write(dir)?;
    let f = format!(
        "Client: {client}. {read} streams read, {} gaps.\n\n| measure | the SDK (client) | slogate (gateway, from its buckets) | the SDK's bucket | same bucket |\n|---|---|---|---|---|\n{rows}\nTokens: {tokens}.\n",
        gaps.len()
    );
    write(&dir.join("report.md"), &f)
}
