//! Results in `vllm bench serve`'s form, so a loadgen run reads beside the
//! numbers a team already has: the summary JSON (`--save-result`'s keys:
//! `request_throughput`, `mean_ttft_ms`, `p99_itl_ms`, ...) and one JSON
//! line per request (`RequestFuncOutput`'s fields: `ttft`, `itl`,
//! `latency`, `success`, ...).
//!
//! The statistics follow vllm bench's: means, medians and population
//! standard deviations over completed requests; percentiles interpolated
//! linearly between the two nearest values (numpy's default); TPOT per
//! request is `(latency - ttft) / (output_tokens - 1)` for requests of more
//! than one token; ITL is every gap of every completed request. Which event
//! is the first token is the run's `ttft` setting, written in the summary
//! as `ttft_definition` (vllm bench's own is `first_choices`). Requests sent
//! during the scenario's warm-up are left out, as in loadgen's own report,
//! and `duration` is the run's time after the warm-up.

use serde_json::{json, Map, Value};

use super::run::RunResult;
use super::scenario::{Arrival, Endpoint};
use super::summary::ClassSummary;

/// The percentiles written for each metric (vllm bench's default is 99).
const PERCENTILES: [f64; 3] = [90.0, 95.0, 99.0];

/// `p` (0-100) of sorted `v`, interpolated linearly; 0 when empty.
fn percentile(v: &[f64], p: f64) -> f64 {
    match v.len() {
        0 => 0.0,
        1 => v[0],
        n => {
            let rank = p / 100.0 * (n - 1) as f64;
            let (lo, hi) = (rank.floor() as usize, rank.ceil() as usize);
            v[lo] + (v[hi] - v[lo]) * (rank - lo as f64)
        }
    }
}

fn mean(v: &[f64]) -> f64 {
    if v.is_empty() {
        0.0
    } else {
        v.iter().sum::<f64>() / v.len() as f64
    }
}

/// Population standard deviation (numpy's `std`).
fn std_dev(v: &[f64]) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    let m = mean(v);
    (v.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / v.len() as f64).sqrt()
}

/// `mean_{name}_ms`, `median_{name}_ms`, `std_{name}_ms` and `p{P}_{name}_ms` of `ms`.
fn stats(out: &mut Map<String, Value>, name: &str, mut ms: Vec<f64>) {
    ms.sort_by(f64::total_cmp);
    out.insert(format!("mean_{name}_ms"), json!(mean(&ms)));
    out.insert(format!("median_{name}_ms"), json!(percentile(&ms, 50.0)));
    out.insert(format!("std_{name}_ms"), json!(std_dev(&ms)));
    for p in PERCENTILES {
        out.insert(format!("p{p}_{name}_ms"), json!(percentile(&ms, p)));
    }
}

/// The requests that count (sent after the warm-up), with their indexes.
fn counted(r: &RunResult) -> impl Iterator<Item = (usize, &super::Record)> {
    let warm = r.scenario.warmup.as_secs_f64();
    r.records.iter().enumerate().filter(move |(_, x)| x.start_s >= warm)
}

/// A request's output length: the replica's usage when known, else the events counted.
fn output_tokens(r: &RunResult, i: usize) -> u32 {
    r.details.get(i).map_or(r.records[i].tokens, |d| d.output_tokens)
}

/// `YYYYMMDD-HHMMSS` (UTC) of `unix` seconds: vllm bench's `date` form.
fn bench_date(unix: u64) -> String {
    let (y, m, d, secs) = prompt::civil(unix as i64);
    format!("{y:04}{m:02}{d:02}-{:02}{:02}{:02}", secs / 3600, secs / 60 % 60, secs % 60)
}

/// The most output tokens completed in any one second of the run (each
/// token at its arrival: the first at TTFT, the rest after each gap), and
/// the most requests in flight at once: vllm bench's
/// `max_output_tokens_per_s` and `max_concurrent_requests`.
fn peaks(r: &RunResult) -> (f64, u64) {
    let mut per_second: std::collections::BTreeMap<u64, u64> = std::collections::BTreeMap::new();
    let mut edges: Vec<(f64, i64)> = Vec::new();
    for (i, x) in counted(r) {
        edges.push((x.start_s, 1));
        edges.push((x.start_s + x.e2e_ms / 1000.0, -1));
        let (Some(ttft), true) = (x.ttft_ms, x.completed()) else { continue };
        let mut at = x.start_s + ttft / 1000.0;
        *per_second.entry(at as u64).or_default() += 1;
        for gap in r.details.get(i).map(|d| d.itl_s.as_slice()).unwrap_or_default() {
            at += gap;
            *per_second.entry(at as u64).or_default() += 1;
        }
    }
    // Ends before starts at the same instant: a request that ends as another starts is not two at once.
    edges.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    let (mut now, mut most) = (0i64, 0i64);
    for (_, d) in edges {
        now += d;
        most = most.max(now);
    }
    (per_second.values().copied().max().unwrap_or(0) as f64, most.max(0) as u64)
}

/// vllm bench's per-request arrays (`--save-detailed`): input and output
/// lengths, TTFTs and ITLs in seconds, texts (loadgen keeps none: empty)
/// and errors.
pub fn add_detailed(summary: &mut Value, r: &RunResult) {
    let Value::Object(m) = summary else { return };
    let rows: Vec<(usize, &super::Record)> = counted(r).collect();
    m.insert("input_lens".into(), json!(rows.iter().map(|(_, x)| x.prompt_tokens).collect::<Vec<_>>()));
    m.insert("output_lens".into(), json!(rows.iter().map(|(i, _)| output_tokens(r, *i)).collect::<Vec<_>>()));
    m.insert("ttfts".into(), json!(rows.iter().map(|(_, x)| x.ttft_ms.map_or(0.0, |t| t / 1000.0)).collect::<Vec<_>>()));
    m.insert(
        "itls".into(),
        json!(rows.iter().map(|(i, _)| r.details.get(*i).map(|d| d.itl_s.clone()).unwrap_or_default()).collect::<Vec<_>>()),
    );
    m.insert("generated_texts".into(), json!(rows.iter().map(|_| "").collect::<Vec<_>>()));
    m.insert(
        "errors".into(),
        json!(rows
            .iter()
            .map(|(_, x)| if x.completed() { String::new() } else { format!("{} (HTTP {})", x.outcome, x.status) })
            .collect::<Vec<_>>()),
    );
}

/// The run as `vllm bench serve`'s summary JSON.
pub fn summary(r: &RunResult) -> Value {
    let warm = r.scenario.warmup.as_secs_f64();
    let duration = (r.elapsed_s - warm).max(1e-9);
    let (mut completed, mut failed, mut input, mut output) = (0u64, 0u64, 0u64, 0u64);
    let (mut ttft, mut tpot, mut itl, mut e2el) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for (i, x) in counted(r) {
        if !x.completed() {
            failed += 1;
            continue;
        }
        completed += 1;
        let out = output_tokens(r, i);
        input += x.prompt_tokens as u64;
        output += out as u64;
        e2el.push(x.e2e_ms);
        if let Some(t) = x.ttft_ms {
            ttft.push(t);
            if out > 1 {
                tpot.push((x.e2e_ms - t) / (out - 1) as f64);
            }
        }
        if let Some(d) = r.details.get(i) {
            itl.extend(d.itl_s.iter().map(|s| s * 1000.0));
        }
    }
    let s = &r.scenario;
    let (rate, concurrency) = match s.streams.first().map(|x| &x.arrival) {
        Some(Arrival::Closed { concurrency, .. }) => (json!("inf"), json!(concurrency)),
        Some(Arrival::Poisson { rate } | Arrival::Constant { rate }) if s.streams.len() == 1 => (json!(rate), Value::Null),
        _ => (Value::Null, Value::Null),
    };
    let endpoint = match s.streams.first().map(|x| x.endpoint) {
        Some(Endpoint::Completions) => ("openai", "/v1/completions"),
        Some(Endpoint::Embeddings) => ("openai-embeddings", "/v1/embeddings"),
        Some(Endpoint::Transcriptions) => ("openai-audio", "/v1/audio/transcriptions"),
        _ => ("openai-chat", "/v1/chat/completions"),
    };
    let mut m = Map::new();
    let unix = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let model = s.streams.first().map(|x| x.model.as_str()).unwrap_or_default();
    m.insert("date".into(), json!(bench_date(unix)));
    m.insert("endpoint_type".into(), json!(endpoint.0));
    m.insert("backend".into(), json!(endpoint.0));
    m.insert("endpoint".into(), json!(endpoint.1));
    m.insert("label".into(), json!(r.label));
    m.insert("model_id".into(), json!(model));
    // loadgen counts tokens without a tokenizer: the model names it.
    m.insert("tokenizer_id".into(), json!(model));
    m.insert("num_prompts".into(), json!(completed + failed));
    m.insert("request_rate".into(), rate);
    m.insert("burstiness".into(), json!(1.0));
    m.insert("max_concurrency".into(), concurrency);
    m.insert("ttft_definition".into(), json!(s.ttft.as_str()));
    m.insert("duration".into(), json!(duration));
    m.insert("completed".into(), json!(completed));
    m.insert("failed".into(), json!(failed));
    m.insert("total_input_tokens".into(), json!(input));
    m.insert("total_output_tokens".into(), json!(output));
    m.insert("request_throughput".into(), json!(completed as f64 / duration));
    m.insert("request_goodput".into(), Value::Null);
    m.insert("output_throughput".into(), json!(output as f64 / duration));
    m.insert("total_token_throughput".into(), json!((input + output) as f64 / duration));
    let (max_tokens_per_s, max_concurrent) = peaks(r);
    m.insert("max_output_tokens_per_s".into(), json!(max_tokens_per_s));
    m.insert("max_concurrent_requests".into(), json!(max_concurrent));
    stats(&mut m, "ttft", ttft);
    stats(&mut m, "tpot", tpot);
    stats(&mut m, "itl", itl);
    stats(&mut m, "e2el", e2el);
    Value::Object(m)
}

/// One JSON line per request (after the warm-up), with vllm bench's
/// per-request fields; times in seconds.
pub fn requests_jsonl(r: &RunResult) -> String {
    let mut out = String::new();
    for (i, x) in counted(r) {
        let tokens = output_tokens(r, i);
        let (ttft, latency) = (x.ttft_ms.map(|t| t / 1000.0), x.e2e_ms / 1000.0);
        let tpot = match ttft {
            Some(t) if tokens > 1 => (latency - t) / (tokens - 1) as f64,
            _ => 0.0,
        };
        let line = json!({
            "success": x.completed(),
            "latency": latency,
            "output_tokens": tokens,
            "ttft": ttft.unwrap_or(0.0),
            "itl": r.details.get(i).map(|d| d.itl_s.clone()).unwrap_or_default(),
            "tpot": tpot,
            "prompt_len": x.prompt_tokens,
            "error": if x.completed() { String::new() } else { format!("{} (HTTP {})", x.outcome, x.status) },
            "start_time": x.start_s,
            "class": x.class,
        });
        out.push_str(&line.to_string());
        out.push('\n');
    }
    out
}

/// Is `v` a `vllm bench serve` summary (rather than a loadgen result)?
pub fn is_summary(v: &Value) -> bool {
    v.get("request_throughput").is_some() && v.get("mean_ttft_ms").is_some() && v.get("records").is_none()
}

/// A vllm bench summary as a loadgen summary of everything (`all`): what
/// it has (TTFT, ITL, e2e, throughput, failures); the rest stays empty.
pub fn as_class_summary(v: &Value) -> ClassSummary {
    let f = |k: &str| v.get(k).and_then(Value::as_f64);
    let n = |k: &str| v.get(k).and_then(Value::as_u64).unwrap_or(0);
    ClassSummary {
        requests: n("completed") + n("failed"),
        completed: n("completed"),
        errors: n("failed"),
        ttft_p50_ms: f("median_ttft_ms").unwrap_or(0.0),
        ttft_p90_ms: f("p90_ttft_ms").unwrap_or(0.0),
        ttft_p99_ms: f("p99_ttft_ms").unwrap_or(0.0),
        itl_p50_ms: f("median_itl_ms").unwrap_or(0.0),
        itl_p90_ms: f("p90_itl_ms").unwrap_or(0.0),
        itl_p99_ms: f("p99_itl_ms").unwrap_or(0.0),
        e2e_p50_ms: f("median_e2el_ms").unwrap_or(0.0),
        e2e_p99_ms: f("p99_e2el_ms").unwrap_or(0.0),
        goodput_rps: f("request_goodput").unwrap_or(0.0),
        throughput_rps: f("request_throughput").unwrap_or(0.0),
        tokens_per_s: f("output_throughput").unwrap_or(0.0),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_interpolate_as_numpy_does() {
        let v = [1.0, 2.0, 3.0, 4.0];
        // numpy.percentile([1, 2, 3, 4], [50, 90, 99]) = 2.5, 3.7, 3.97
        assert_eq!(percentile(&v, 50.0), 2.5);
        assert!((percentile(&v, 90.0) - 3.7).abs() < 1e-12);
        assert!((percentile(&v, 99.0) - 3.97).abs() < 1e-12);
        assert_eq!(percentile(&[], 99.0), 0.0);
        // numpy.std([1, 2, 3, 4]) = 1.118033988749895
        assert!((std_dev(&v) - 1.118033988749895).abs() < 1e-12);
    }
}

#[cfg(test)]
mod date_tests {
    #[test]
    fn the_date_is_vllm_benchs_form() {
        assert_eq!(super::bench_date(0), "19700101-000000");
        // 2026-11-27 03:34:18 UTC.
        assert_eq!(super::bench_date(1_795_750_458), "20261127-033418");
        assert_eq!(super::bench_date(951_782_400), "20000229-000000", "a leap day");
    }
}
