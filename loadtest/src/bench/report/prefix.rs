//! Report of `loadtest/bench/prefix.sh`: prefix-aware routing (estimated,
//! and exact from the replicas' KV events) against `least_loaded` and
//! `round_robin`, from the load generator's records and the simulated
//! replicas' own prefix cache counters; the CSVs of the shared-prefix
//! sweep's charts.
//!
//! ```text
//! bench report prefix DIR SECS PART...
//! ```

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use super::out::{n, percent, signed, write, Measured};
use super::records::{done, load, pct_floor as pct};

/// The TTFT target the sweeps judge by, in ms.
const TARGET_MS: f64 = 300.0;

const HEAD: &str =
    "| | sent | done | 429 | failed | output tokens/s | TTFT p90 ms | TTFT p99 ms | TTFT p90 of all sent | engine cache hits |\n\
                    |---|---:|---:|---:|---:|---:|---:|---:|---:|---:|";

/// One load of a part.
struct Load {
    sent: usize,
    done: usize,
    rejected: usize,
    failed: usize,
    tok_s: f64,
    /// Only what was delivered within the load's span: a fleet whose
    /// queues grow finishes its backlog after it, at no rate of its own.
    tok_s_within: f64,
    p90: f64,
    p99: f64,
    /// Over every request sent, one refused or failed counted late: what
    /// the callers saw, where a gateway keeps its admitted requests' TTFT
    /// by refusing the rest.
    p90_sent: f64,
    hit: f64,
    per_replica: Vec<i64>,
    max_waiting: Vec<i64>,
    end_waiting: Vec<i64>,
}

fn json_lines(path: &Path) -> Result<Vec<BTreeMap<String, f64>>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    text.lines().filter(|l| !l.trim().is_empty()).map(|l| serde_json::from_str(l).map_err(|e| format!("{}: {e}", path.display()))).collect()
}

fn read_load(dir: &Path, name: &str, secs: f64) -> Result<Load, String> {
    let r = load(&dir.join(format!("{name}.json")))?;
    let recs = &r.records;
    let span = Some(r.scenario.duration.as_secs_f64()).filter(|d| *d > 0.0).unwrap_or(secs);
    let ok: Vec<_> = recs.iter().filter(|x| done(x)).collect();
    let (before, after) = (json_lines(&dir.join(format!("{name}.sim0")))?, json_lines(&dir.join(format!("{name}.sim1")))?);
    // This run's share of the replicas' counters.
    let sims: Vec<BTreeMap<&str, f64>> = after
        .iter()
        .zip(&before)
        .map(|(a, b)| a.iter().map(|(k, v)| (k.as_str(), v - b.get(k).copied().unwrap_or(0.0))).collect())
        .collect();
    let text = std::fs::read_to_string(dir.join(format!("{name}.waiting"))).map_err(|e| format!("{name}.waiting: {e}"))?;
    let waiting: Vec<Vec<f64>> = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| l.split_whitespace().map(|v| v.parse().unwrap_or(f64::NAN)).collect())
        .collect();
    let sum = |k: &str| sims.iter().map(|s| s.get(k).copied().unwrap_or(0.0)).sum::<f64>();
    let (q, h) = (sum("queries"), sum("hits"));
    let tokens = |within: bool| {
        ok.iter().filter(|x| !within || x.start_s + x.e2e_ms / 1000.0 <= span).map(|x| f64::from(x.tokens)).sum::<f64>() / span
    };
    let ttft: Vec<f64> = ok.iter().filter_map(|x| x.ttft_ms).collect();
    let sent_ttft: Vec<f64> = recs.iter().map(|x| if done(x) { x.ttft_ms.unwrap_or(f64::INFINITY) } else { f64::INFINITY }).collect();
    Ok(Load {
        sent: recs.len(),
        done: ok.len(),
        rejected: recs.iter().filter(|x| x.outcome == "rejected").count(),
        failed: recs.iter().filter(|x| !done(x) && x.outcome != "rejected").count(),
        tok_s: tokens(false),
        tok_s_within: tokens(true),
        p90: pct(&ttft, 0.9),
        p99: pct(&ttft, 0.99),
        p90_sent: pct(&sent_ttft, 0.9),
        hit: if q != 0.0 { h / q } else { f64::NAN },
        per_replica: sims.iter().map(|s| s.get("requests").copied().unwrap_or(0.0) as i64).collect(),
        max_waiting: (0..sims.len()).map(|i| waiting.iter().filter_map(|w| w.get(i)).copied().fold(0.0, f64::max) as i64).collect(),
        end_waiting: waiting.last().map(|w| w.iter().map(|v| *v as i64).collect()).unwrap_or_default(),
    })
}

/// A list as Python prints one: `[1, 2]`.
fn list(v: &[i64]) -> String {
    format!("[{}]", v.iter().map(i64::to_string).collect::<Vec<_>>().join(", "))
}

fn ms(v: f64) -> String {
    if v == f64::INFINITY {
        "late".into()
    } else {
        n(v, 0)
    }
}

fn row(label: &str, x: &Load) -> String {
    format!(
        "| {label} | {} | {} | {} | {} | {} | {} | {} | {} | {} % |",
        x.sent,
        x.done,
        x.rejected,
        x.failed,
        n(x.tok_s, 0),
        n(x.p90, 0),
        n(x.p99, 0),
        ms(x.p90_sent),
        percent(x.hit, 1)
    )
}

/// What a judgement says: a number, a yes/no, or nothing, and its words.
enum Said {
    Number(Option<f64>, String),
    Flag(Option<bool>, String),
}

impl Said {
    fn text(&self) -> &str {
        match self {
            Said::Number(_, t) | Said::Flag(_, t) => t,
        }
    }
    fn put(self, m: &mut Measured, key: &str) {
        match self {
            Said::Number(v, t) => m.maybe(key, v, t),
            Said::Flag(v, t) => m.maybe_flag(key, v, t),
        }
    }
}

/// A mode's sweep judged against least_loaded's: its output tokens, TTFT
/// and cache hits.
struct Judged {
    tokens: Said,
    ttft: Said,
    hits: Said,
}

/// Throughput at the top rate, where least_loaded is saturated (its output
/// no more than a tenth above its output at the rate below: the load is
/// past what it can serve, so the ratio is of what each serves, not of the
/// load offered). TTFT and hits at the first rate where least_loaded's
/// TTFT p90 over every request sent (refused or failed counted late)
/// passes the target.
fn against_least_loaded(r: &BTreeMap<String, Load>, part: &str, mode: &str, rates: &[u64]) -> Result<Judged, String> {
    let get = |m: &str, rate: u64| r.get(&format!("{part}-{m}-{rate}")).ok_or_else(|| format!("no {part}-{m}-{rate}"));
    let top = *rates.last().ok_or("no rates")?;
    let (a, b) = (get(mode, top)?, get("least_loaded", top)?);
    let ratio = if b.tok_s != 0.0 { a.tok_s / b.tok_s } else { f64::INFINITY };
    let below = if rates.len() > 1 { get("least_loaded", rates[rates.len() - 2])?.tok_s } else { 0.0 };
    let saturated = rates.len() > 1 && b.tok_s <= 1.1 * below;
    let how = if saturated {
        format!("saturated: {} at {} req/s)", n(below, 0), rates[rates.len() - 2])
    } else {
        "not saturated there: not judged)".into()
    };
    let said = format!("at {top} req/s: {} vs {} ({}x; least_loaded {how}", n(a.tok_s, 0), n(b.tok_s, 0), n(ratio, 2));
    let tokens = Said::Number(saturated.then_some(ratio), said);
    let mut sat = None;
    for &rate in rates {
        if get("least_loaded", rate)?.p90_sent > TARGET_MS {
            sat = Some(rate);
            break;
        }
    }
    let Some(sat) = sat else {
        let within = "least_loaded within the target at every rate";
        return Ok(Judged { tokens, ttft: Said::Flag(None, within.into()), hits: Said::Number(None, within.into()) });
    };
    let (a, b) = (get(mode, sat)?, get("least_loaded", sat)?);
    let said = format!(
        "at {sat} req/s, over all sent: {} vs {} (admitted: {} vs {} ms; refused {} vs {})",
        ms(a.p90_sent),
        ms(b.p90_sent),
        n(a.p90, 0),
        n(b.p90, 0),
        a.rejected,
        b.rejected
    );
    let ttft = Said::Flag(Some(a.p90_sent <= TARGET_MS && TARGET_MS < b.p90_sent), said);
    let hits = Said::Number(Some(100.0 * a.hit), format!("{} % at {sat} req/s", percent(a.hit, 1)));
    Ok(Judged { tokens, ttft, hits })
}

/// The rates of the loads named `PREFIX...-RATE`, sorted.
fn rates(runs: &[String], prefix: &str) -> Vec<u64> {
    let mut v: Vec<u64> = runs.iter().filter(|n| n.starts_with(prefix)).filter_map(|n| n.rsplit_once('-')?.1.parse().ok()).collect();
    v.sort_unstable();
    v.dedup();
    v
}

/// `bench report prefix DIR SECS PART...`.
pub(super) fn prefix(dir: &Path, secs: f64, runs: &[String]) -> Result<(), String> {
    let mut r = BTreeMap::new();
    for name in runs {
        r.insert(name.clone(), read_load(dir, name, secs)?);
    }
    let (mut f, mut m) = (String::new(), Measured::default());
    through_envoy(&r, runs, &mut f, &mut m)?;
    shared(dir, &r, runs, &mut f, &mut m)?;
    others(&r, runs, &mut f, &mut m);
    fleet(&r, runs, &mut f, &mut m)?;
    decision_cost(dir, &mut f, &mut m);
    m.write(dir)?;
    write(&dir.join("report.md"), &f)
}

/// Through Envoy: slogate as its endpoint picker against Envoy's own
/// round robin.
fn through_envoy(r: &BTreeMap<String, Load>, runs: &[String], f: &mut String, m: &mut Measured) -> Result<(), String> {
    let epp = rates(runs, "epp-slogate-");
    let Some(&top) = epp.last() else { return Ok(()) };
    let get = |key: &str, rate: u64| r.get(&format!("epp-{key}-{rate}")).ok_or_else(|| format!("no epp-{key}-{rate}"));
    f.push_str("## Through Envoy\n\n");
    for &rate in &epp {
        let _ = writeln!(f, "\n**{rate} requests/s**\n\n{HEAD}");
        for (label, key) in [("slogate as the picker", "slogate"), ("Envoy round robin", "none")] {
            let _ = writeln!(f, "{}", row(label, get(key, rate)?));
        }
    }
    f.push_str(
        "\nOutput tokens/s delivered within each rate's 30 s (without admission, Envoy's round robin lets the replicas' \
         queues grow and finishes its backlog after the window: counted by the window, that is no rate of its own):\n\n\
         | requests/s | slogate as the picker | Envoy round robin |\n|---:|---:|---:|\n",
    );
    for &rate in &epp {
        let _ = writeln!(f, "| {rate} | {} | {} |", n(get("slogate", rate)?.tok_s_within, 0), n(get("none", rate)?.tok_s_within, 0));
    }
    let (a, b) = (get("slogate", top)?, get("none", top)?);
    let ratio = if b.tok_s_within != 0.0 { a.tok_s_within / b.tok_s_within } else { f64::INFINITY };
    let said = format!(
        "at {top} req/s: {} vs {} output tokens/s within the window ({}x)",
        n(a.tok_s_within, 0),
        n(b.tok_s_within, 0),
        n(ratio, 2)
    );
    m.stated("epp_tokens_ratio", ratio, said);
    let parts: Vec<&Load> = runs.iter().filter(|n| n.starts_with("epp-")).filter_map(|n| r.get(n)).collect();
    let failed: usize = parts.iter().map(|x| x.failed).sum();
    m.stated("epp_failed", failed as f64, format!("{failed} of {}", parts.iter().map(|x| x.sent).sum::<usize>()));
    Ok(())
}

/// The modes judged against least_loaded, and the names of their measures.
const MODES: [(&str, &str); 2] = [("prefix_aware", ""), ("exact", "exact_")];

fn shared(dir: &Path, r: &BTreeMap<String, Load>, runs: &[String], f: &mut String, m: &mut Measured) -> Result<(), String> {
    let shared = rates(runs, "shared-");
    if shared.is_empty() {
        return Ok(());
    }
    let policies: Vec<&str> = ["prefix_aware", "exact", "least_loaded", "round_robin"]
        .into_iter()
        .filter(|p| runs.iter().any(|n| n.starts_with(&format!("shared-{p}-"))))
        .collect();
    f.push_str(SHARED_ABOUT);
    for &rate in &shared {
        let _ = writeln!(f, "\n**{rate} requests/s**\n\n{HEAD}");
        for p in &policies {
            if let Some(x) = r.get(&format!("shared-{p}-{rate}")) {
                let _ = writeln!(f, "{}", row(p, x));
            }
        }
    }
    for (chart, value) in [("throughput", (|x: &Load| x.tok_s) as fn(&Load) -> f64), ("ttft", |x: &Load| x.p90)] {
        let mut csv = format!("offered requests/s,{}\n", policies.join(","));
        for &rate in &shared {
            let cells: Vec<String> =
                policies.iter().map(|p| r.get(&format!("shared-{p}-{rate}")).map_or("nan".into(), |x| n(value(x), 1))).collect();
            let _ = writeln!(csv, "{rate},{}", cells.join(","));
        }
        write(&dir.join(format!("{chart}.csv")), &csv)?;
    }
    write(&dir.join("throughput.title"), "Shared prefixes: output tokens/s\noutput tokens/s\n")?;
    write(&dir.join("ttft.title"), "Shared prefixes: TTFT p90\nms\n")?;
    f.push_str("\nCharts: `throughput.svg` (output tokens/s against offered rate), `ttft.svg` (TTFT p90, the target drawn).\n\n");
    for (mode, k) in MODES {
        if policies.contains(&mode) && policies.contains(&"least_loaded") {
            let j = against_least_loaded(r, "shared", mode, &shared)?;
            j.tokens.put(m, &format!("shared_{k}tokens_ratio"));
            j.ttft.put(m, &format!("shared_{k}ttft_within"));
            j.hits.put(m, &format!("shared_{k}hits_pct"));
        }
    }
    Ok(())
}

/// Multi-turn chat, no shared prefixes, one hot prefix.
fn others(r: &BTreeMap<String, Load>, runs: &[String], f: &mut String, m: &mut Measured) {
    if runs.iter().any(|n| n.starts_with("multiturn-")) {
        let _ = writeln!(f, "{MULTITURN_ABOUT}{HEAD}");
        for p in ["prefix_aware", "least_loaded"] {
            if let Some(x) = r.get(&format!("multiturn-{p}-20")) {
                let _ = writeln!(f, "{}", row(p, x));
            }
        }
        if let Some(x) = r.get("multiturn-prefix_aware-20") {
            m.stated("multiturn_hits_pct", 100.0 * x.hit, format!("{} %", percent(x.hit, 1)));
        }
        f.push('\n');
    }
    let random = rates(runs, "random-");
    if !random.is_empty() {
        f.push_str("## No shared prefixes\n\nPrompts of 3,600 tokens that share nothing, 100 out: what routing by prefix costs where nothing is cached.\n\n");
        let (mut worst_t, mut worst_p) = (0.0f64, 0.0f64);
        for rate in random {
            let _ = writeln!(f, "\n**{rate} requests/s**\n\n{HEAD}");
            let (a, b) = (r.get(&format!("random-prefix_aware-{rate}")), r.get(&format!("random-least_loaded-{rate}")));
            for (p, x) in [("prefix_aware", a), ("least_loaded", b)] {
                if let Some(x) = x {
                    let _ = writeln!(f, "{}", row(p, x));
                }
            }
            if let (Some(a), Some(b)) = (a, b) {
                worst_t = worst_t.max(if b.tok_s != 0.0 { (b.tok_s - a.tok_s) / b.tok_s } else { 0.0 });
                worst_p = worst_p.max(if b.p99 != 0.0 && !b.p99.is_nan() { (a.p99 - b.p99) / b.p99 } else { 0.0 });
            }
        }
        let said = format!("worst: throughput {} % lower, TTFT p99 {} % higher", signed(100.0 * worst_t, 1), signed(100.0 * worst_p, 1));
        m.stated("random_worst_pct", 100.0 * worst_t.max(worst_p), said);
        f.push('\n');
    }
    if runs.iter().any(|n| n.starts_with("hot-")) {
        f.push_str(HOT_ABOUT);
        for p in ["prefix_aware", "least_loaded"] {
            if let Some(x) = r.get(&format!("hot-{p}-40")) {
                let _ = writeln!(
                    f,
                    "| {p} | {} | {} | {} % | {} | {} | {} |",
                    n(x.tok_s, 0),
                    n(x.p90, 0),
                    percent(x.hit, 1),
                    list(&x.per_replica),
                    list(&x.max_waiting),
                    list(&x.end_waiting)
                );
            }
        }
        if let Some(x) = r.get("hot-prefix_aware-40") {
            let (lo, hi) = (x.per_replica.iter().min().copied().unwrap_or(0), x.per_replica.iter().max().copied().unwrap_or(0));
            let spread = if hi != 0 { lo as f64 / hi as f64 } else { 0.0 };
            let bounded = x.end_waiting.iter().max().copied().unwrap_or(0) <= 20;
            let said = format!("fewest/most requests per replica {}; waiting at the end {}", n(spread, 2), list(&x.end_waiting));
            m.flag("hot_spread", spread >= 0.5 && bounded, said);
        }
        f.push('\n');
    }
}

fn fleet(r: &BTreeMap<String, Load>, runs: &[String], f: &mut String, m: &mut Measured) -> Result<(), String> {
    let fleet = rates(runs, "fleet-");
    if fleet.is_empty() {
        return Ok(());
    }
    f.push_str(
        "## Three gateways\n\nThe shared-prefix load through three gateways run as a fleet, requests taking them in turn; each indexes what \
         it sent and what the others say they sent (a period late), and all send a prompt none has seen to its home \
         replica (the same rendezvous hash of its first block).\n\n",
    );
    for &rate in &fleet {
        let _ = writeln!(f, "\n**{rate} requests/s**\n\n{HEAD}");
        for p in ["prefix_aware", "exact", "least_loaded"] {
            if let Some(x) = r.get(&format!("fleet-{p}-{rate}")) {
                let _ = writeln!(f, "{}", row(p, x));
            }
        }
    }
    for (mode, k) in MODES {
        if !fleet.iter().all(|rate| [mode, "least_loaded"].iter().all(|p| r.contains_key(&format!("fleet-{p}-{rate}")))) {
            continue;
        }
        let j = against_least_loaded(r, "fleet", mode, &fleet)?;
        let met = matches!(j.tokens, Said::Number(Some(t), _) if t >= 1.8)
            && matches!(j.ttft, Said::Flag(Some(true), _))
            && matches!(j.hits, Said::Number(Some(h), _) if h >= 80.0);
        let said = format!("tokens/s {}; TTFT p90 {}; hits {}", j.tokens.text(), j.ttft.text(), j.hits.text());
        m.flag(&format!("fleet_{k}same_targets"), met, said);
    }
    f.push('\n');
    Ok(())
}

/// The cost of one routing decision (`examples/prefix_cost`), where it ran.
fn decision_cost(dir: &Path, f: &mut String, m: &mut Measured) {
    let Ok(cost) = std::fs::read_to_string(dir.join("cost.md")) else { return };
    let cost = cost.trim();
    let _ = write!(f, "{DECISION_ABOUT}{cost}\n\n");
    let p99 = cost.lines().nth(2).and_then(|l| l.trim().trim_matches('|').split('|').nth(5)?.trim().parse::<f64>().ok());
    match p99 {
        Some(p99) => m.stated("decision_p99_us", p99, format!("{} µs", n(p99, 1))),
        None => m.maybe("decision_p99_us", None, "not measured"),
    }
}

const SHARED_ABOUT: &str = "## Shared prefixes\n\n\
inference-perf's `shared_prefix` shape at half llm-d's lengths: 150 groups x 5 questions, a 3,000-token system
prompt and a 600-token question, 100 tokens out, Poisson arrivals at each rate. The 750 prompts are taken in a
shuffled order, again from the start once all were sent: the first of each group finds its system prompt nowhere
(a first pass is at most 4/5 x 3,000/3,600 = 67 % cached), a prompt sent before is cached whole but its last block.

";

const MULTITURN_ABOUT: &str = "## Multi-turn chat\n\n\
64 conversations of 10 turns at 20 requests/s, each turn resending the history: the application's 1,000-token
system prompt (the same for all), then 100 tokens a turn (the assistant's earlier answers stand in the history as
text the engine never generated, so only prompt blocks are reused, as with a client that edits its history).

";

const HOT_ABOUT: &str = "## One hot prefix\n\n\
40 requests/s: half share one system prompt (2,000 questions on it), half are the 150 groups above. Requests
finished per replica (all of them, hot and not), and each replica's waiting queue (sampled every second):

| | output tokens/s | TTFT p90 ms | engine cache hits | requests per replica | most waiting, per replica | waiting at the end |
|---|---:|---:|---:|---|---|---|
";

const DECISION_ABOUT: &str = "## Decision cost\n\n\
`cargo run --release --example prefix_cost`, alone on the machine after the runs: 10,000 prompts of 10 blocks
indexed over four replicas, then 100,000 routing decisions for prompts drawn from them (the index lookup, the
ranking, the slot taken); hashing a prompt once is beside it, and the resident memory the index added per name.

";

#[cfg(test)]
mod tests {
    #[test]
    fn rates_are_read_from_the_loads_names() {
        let runs: Vec<String> =
            ["shared-exact-40", "shared-least_loaded-20", "shared-exact-20", "fleet-exact-100"].map(String::from).to_vec();
        assert_eq!(super::rates(&runs, "shared-"), vec![20, 40]);
        assert_eq!(super::rates(&runs, "fleet-"), vec![100]);
        assert_eq!(super::list(&[3, 0, 12]), "[3, 0, 12]");
    }
}
