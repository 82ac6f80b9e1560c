//! Reports of `loadtest/bench/admission.sh`, one run each (the breaker's
//! and context reduction's are in `admission_events.rs`):
//!
//! ```text
//! bench report admission overload DIR C
//! bench report admission shedlate DIR C
//! bench report admission breaker DIR
//! bench report admission reduction DIR
//! ```

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use super::limits::Rows;
use super::out::{chart, n, percent, write, Measured, Table};
use super::records::{class_row, load, measured, pct, window};
use crate::loadgen::Record;

/// The gateway's rolling chat TTFT P99 over a run, with the breaker's and
/// context reduction's state scaled to be seen beside it.
pub(super) fn timeline_chart(tl: &Path, dir: &Path, stem: &str, title: &str) -> Result<(), String> {
    let t = Table::read(tl)?;
    let mut csv = String::from("time (s),chat TTFT P99 ms (gateway window),breaker state x500 (1000 = open),reduction active x400\n");
    for i in 0..t.rows.len() {
        let _ = writeln!(
            csv,
            "{},{},{},{}",
            n(t.at(i, "t"), 2),
            n(t.at(i, "ttft_p99_ms"), 1),
            n(t.at(i, "breaker_state") * 500.0, 0),
            n(t.at(i, "reduction_active") * 400.0, 0)
        );
    }
    let path = dir.join(format!("{stem}.csv"));
    write(&path, &csv)?;
    chart(&path, dir, stem, title, "ms", &[("chat TTFT target 300 ms", 300.0), ("2x target 600 ms", 600.0)])
}

/// Whether every 429 the client got carried a Retry-After, in words.
fn retry_after(recs: &[&Record]) -> (bool, String) {
    let refused: Vec<&&Record> = recs.iter().filter(|x| x.outcome == "rejected").collect();
    let told = refused.iter().filter(|x| x.retry_after.is_some()).count();
    (told == refused.len(), format!("{told} of {} 429s carried Retry-After", refused.len()))
}

const OVERLOAD_FLEET: &str = "**Fleet:** two simulated vLLM replicas, profile `llama70b-fp8-h100` (70B FP8 on one H100 each: \
22 ms + 0.3 ms/seq decode steps, 0.078 ms/prompt token, max_num_seqs 64), `--max-num-batched-tokens 512`, \
`--scheduling-policy priority`. Every request: 512 prompt tokens, 64-256 output tokens (uniform).\n\n";

const OVERLOAD_AFTER: &str = "\nStraight to the replicas every request is accepted and waits in vLLM's unbounded queue: the queue grows \
for the whole run and chat's TTFT with it. Through slogate, chat finds a slot at once (reserved share, \
interactive first, vLLM priority), batch fills the rest of the slots and what cannot be served within its \
TTFT target is refused early with 429 + Retry-After instead of waiting.\n\n\
Charts: `direct-*.svg`, `gateway-*.svg` (TTFT CDF, TTFT p99 over time, throughput and 429s), \
`gateway-admission.svg` (the gateway's rolling chat TTFT P99). \n";

/// 2 C straight to the replicas, then through slogate.
pub(super) fn overload(dir: &Path, c: f64) -> Result<(), String> {
    let direct = load(&dir.join("direct.json"))?;
    let gateway = load(&dir.join("gateway.json"))?;
    let (w, d) = window(&gateway);
    let span = d - w;
    let gw_recs = measured(&gateway);
    let rows = [("direct", Rows::of(&measured(&direct), span)), ("gateway", Rows::of(&gw_recs, span))];
    let g = rows[1].1;
    let mut m = Measured::default();
    m.stated("chat_ttft_p99_ms", g.chat.p99, format!("{} ms", n(g.chat.p99, 0)));
    m.stated("chat_within_pct", 100.0 * g.chat.within, format!("{} %", percent(g.chat.within, 2)));
    m.stated("goodput_pct_of_c", 100.0 * g.good() / c, format!("{} req/s = {} % of C", n(g.good(), 2), n(100.0 * g.good() / c, 0)));
    m.stated(
        "batch_completed",
        g.batch.done as f64,
        format!("{} batch requests completed ({} req/s)", g.batch.done, n(g.batch.throughput, 2)),
    );
    let (ok, text) = retry_after(&gw_recs);
    m.flag("refusals_with_retry_after", ok, text);
    m.write(dir)?;
    let tl = dir.join("timeline.csv");
    if tl.exists() {
        timeline_chart(&tl, dir, "gateway-admission", "through slogate: chat TTFT P99 as the gateway sees it")?;
    }
    let mut f = String::from(OVERLOAD_FLEET);
    let _ = write!(
        f,
        "**Capacity C = {} req/s**: the fleet's throughput saturated (closed loop, 128 concurrent = 2 x max_num_seqs, \
round robin, 30 s after 10 s warm-up). C is throughput capacity: at saturation the replicas' own \
TTFT P99 is already far over chat's 300 ms, so holding chat's SLO at 2 C is admission's work.\n\n",
        n(c, 2)
    );
    let _ = write!(
        f,
        "**Offered 2 C**: chat Poisson {} req/s (0.4 C), batch {} req/s (1.6 C) in bursts of 8.\n\n",
        n(0.4 * c, 2),
        n(1.6 * c, 2)
    );
    f += "## Side by side\n\n";
    let parts: Vec<_> = rows.iter().map(|(k, r)| (*k, *r, c, "C")).collect();
    super::limits::table(&mut f, "run", &parts);
    f += OVERLOAD_AFTER;
    write(&dir.join("report.md"), &f)
}

/// One part of `shedlate`: chat at a load, `shed_late` off or on.
struct Shed {
    load: &'static str,
    on: bool,
    row: super::records::ClassRow,
    refused_p50: f64,
    refused_p99: f64,
    codes: BTreeMap<String, usize>,
}

fn shed_part(dir: &Path, load_x: &'static str, on: bool) -> Result<Shed, String> {
    let r = load(&dir.join(format!("x{load_x}-{on}.json")))?;
    let (w, d) = window(&r);
    let recs = measured(&r);
    let refused: Vec<f64> = recs.iter().filter(|y| y.outcome == "rejected").map(|y| y.e2e_ms).collect();
    let mut codes = BTreeMap::new();
    for y in recs.iter().filter(|y| y.outcome == "rejected") {
        *codes.entry(y.error_code.clone().unwrap_or_else(|| "?".into())).or_insert(0) += 1;
    }
    Ok(Shed {
        load: load_x,
        on,
        row: class_row(&recs, "chat", d - w),
        refused_p50: pct(&refused, 0.5),
        refused_p99: pct(&refused, 0.99),
        codes,
    })
}

/// `shed_late` off and on at 1.5 C and 3 C: goodput, within SLO, how long
/// refused callers waited.
pub(super) fn shedlate(dir: &Path, c: f64) -> Result<(), String> {
    let mut parts = Vec::new();
    for x in ["1.5", "3"] {
        for on in [false, true] {
            parts.push(shed_part(dir, x, on)?);
        }
    }
    let mut m = Measured::default();
    for pair in parts.chunks(2) {
        let (off, on) = (&pair[0], &pair[1]);
        let x = on.load;
        let ratio = if off.row.goodput != 0.0 { on.row.goodput / off.row.goodput } else { f64::NAN };
        m.stated(&format!("x{x}_goodput_on_over_off"), ratio, format!("{} vs {} req/s", n(on.row.goodput, 2), n(off.row.goodput, 2)));
        m.stated(
            &format!("x{x}_refused_p50_ms"),
            on.refused_p50,
            format!(
                "p50 {} ms, p99 {} ms (off: {} / {} ms)",
                n(on.refused_p50, 0),
                n(on.refused_p99, 0),
                n(off.refused_p50, 0),
                n(off.refused_p99, 0)
            ),
        );
    }
    m.write(dir)?;
    let mut f = format!("Capacity C = {} req/s.\n\n", n(c, 2));
    f += "| load | shed_late | requests | completed | refused (by code) | goodput req/s | within SLO (all requests) | \
within SLO (served) | TTFT p50 / p99 ms (served) | refused caller waited p50 / p99 ms |\n";
    f += "|---|---|---:|---:|---|---:|---:|---:|---:|---:|\n";
    for p in &parts {
        let r = &p.row;
        let codes = p.codes.iter().map(|(k, v)| format!("{k} {v}")).collect::<Vec<_>>().join(", ");
        let _ = writeln!(
            f,
            "| {} C | {} | {} | {} | {} | {} ({} % of C) | {} % | {} % | {} / {} | {} / {} |",
            p.load,
            if p.on { "on" } else { "off" },
            r.requests,
            r.done,
            if codes.is_empty() { "0".into() } else { codes },
            n(r.goodput, 2),
            n(100.0 * r.goodput / c, 0),
            percent(r.within, 1),
            percent(r.within_served, 1),
            n(r.p50, 0),
            n(r.p99, 0),
            n(p.refused_p50, 0),
            n(p.refused_p99, 0)
        );
    }
    write(&dir.join("report.md"), &f)
}
