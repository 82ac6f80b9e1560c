//! The `/slo` page: the status as HTML, with each class's last hour drawn
//! as small SVG charts (no script, no external asset).

use std::time::Duration;

use super::Status;
use crate::telemetry::history::{self, Point};
use crate::telemetry::metrics::Signal;

/// One chart of a class's history: series of `(value or none)` per point,
/// each a polyline, and horizontal reference lines, in a 240 x 84 box that
/// scales with the page. The `<title>` says the latest values in words (a
/// screen reader's, and the test's, way in).
struct Chart<'a> {
    class: &'a str,
    id: &'a str,
    title: String,
    series: Vec<(&'a str, Vec<Option<f64>>)>,
    lines: Vec<(&'a str, f64)>,
    /// The value axis starts here (0 for counts; attainment starts lower).
    floor: Option<f64>,
    unit: &'a str,
}

const CHART_W: f64 = 240.0;
const CHART_H: f64 = 84.0;
const CHART_PAD: f64 = 14.0;

fn chart(c: &Chart<'_>, span: &str) -> String {
    let n = c.series.iter().map(|(_, v)| v.len()).max().unwrap_or(0).max(2);
    let values = c.series.iter().flat_map(|(_, v)| v.iter().flatten().copied()).chain(c.lines.iter().map(|(_, y)| *y));
    let (mut lo, mut hi) = values.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| (lo.min(v), hi.max(v)));
    if !lo.is_finite() {
        (lo, hi) = (0.0, 1.0);
    }
    if let Some(f) = c.floor {
        lo = lo.min(f);
    }
    if hi - lo < 1e-9 {
        hi = lo + 1.0;
    }
    let x = |i: usize| CHART_PAD + (CHART_W - 2.0 * CHART_PAD) * i as f64 / (n - 1) as f64;
    let y = |v: f64| CHART_H - CHART_PAD - (CHART_H - 2.0 * CHART_PAD) * (v - lo) / (hi - lo);
    let mut svg = format!(
        "<figure class=\"hc\"><svg class=\"hist\" data-class=\"{}\" data-series=\"{}\" viewBox=\"0 0 {CHART_W} {CHART_H}\" role=\"img\"><title>{}</title>\
<rect x=\"0\" y=\"0\" width=\"{CHART_W}\" height=\"{CHART_H}\" class=\"bg\"/>",
        esc(c.class),
        c.id,
        esc(&c.title)
    );
    for (i, (name, yv)) in c.lines.iter().enumerate() {
        svg.push_str(&format!(
            "<line x1=\"{CHART_PAD}\" x2=\"{}\" y1=\"{yy:.1}\" y2=\"{yy:.1}\" class=\"ref r{i}\"/><text x=\"{}\" y=\"{:.1}\" class=\"lbl end\">{}</text>",
            CHART_W - CHART_PAD,
            CHART_W - CHART_PAD,
            y(*yv) - 2.0,
            esc(name),
            yy = y(*yv)
        ));
    }
    for (i, (name, vals)) in c.series.iter().enumerate() {
        // A gap (no value) breaks the line.
        let mut runs: Vec<Vec<String>> = vec![Vec::new()];
        for (k, v) in vals.iter().enumerate() {
            match (v, runs.last_mut()) {
                (Some(v), Some(run)) => run.push(format!("{:.1},{:.1}", x(k + n - vals.len()), y(*v))),
                _ => runs.push(Vec::new()),
            }
        }
        for r in runs.iter().filter(|r| !r.is_empty()) {
            let pts = if r.len() == 1 { format!("{0} {0}", r[0]) } else { r.join(" ") };
            svg.push_str(&format!("<polyline class=\"s{i}\" data-name=\"{}\" points=\"{pts}\"/>", esc(name)));
        }
    }
    svg.push_str(&format!(
        "<text x=\"{CHART_PAD}\" y=\"10\" class=\"lbl\">{}{u}</text><text x=\"{CHART_PAD}\" y=\"{:.0}\" class=\"lbl\">{}{u}</text>\
<text x=\"{}\" y=\"{:.0}\" class=\"lbl end\">{}</text></svg>",
        num(hi),
        CHART_H - 2.0,
        num(lo),
        CHART_W - CHART_PAD,
        CHART_H - 2.0,
        esc(span),
        u = c.unit
    ));
    svg.push_str(&format!("<figcaption>{}</figcaption></figure>", esc(&c.title)));
    svg
}

/// A value for an axis label: few digits.
fn num(v: f64) -> String {
    if v == 0.0 {
        "0".to_string()
    } else if v.abs() >= 100.0 {
        format!("{v:.0}")
    } else if v.abs() >= 1.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.3}")
    }
}

/// The charts of one class's history.
fn class_charts<'a>(class: &'a str, tier: &str, points: &[Point], objective: f64) -> Vec<Chart<'a>> {
    let last = points.last();
    let latest = |f: &dyn Fn(&Point) -> Option<f64>| points.iter().rev().find_map(f);
    let target = last.map_or(0.0, |p| p.ttft_target_ms);
    let fmt = |v: Option<f64>, unit: &str| v.map_or_else(|| "none".to_string(), |v| format!("{}{unit}", num(v)));
    vec![
        Chart {
            class,
            id: "ttft_p99",
            title: format!("{class} TTFT P99: {} (target {} ms)", fmt(last.map(|p| p.ttft_p99_ms), " ms"), num(target)),
            series: vec![("TTFT P99", points.iter().map(|p| Some(p.ttft_p99_ms)).collect())],
            lines: vec![("target", target)],
            floor: Some(0.0),
            unit: " ms",
        },
        Chart {
            class,
            id: "attainment",
            title: format!(
                "{class} within target: {} (objective {})",
                fmt(latest(&|p| p.attainment).map(|a| a * 100.0), " %"),
                pct(objective)
            ),
            series: vec![("within target", points.iter().map(|p| p.attainment.map(|a| a * 100.0)).collect())],
            lines: vec![("objective", objective * 100.0)],
            floor: None,
            unit: " %",
        },
        Chart {
            class,
            id: "requests",
            title: format!(
                "{class} requests per step: {} admitted, {} refused",
                last.map_or(0, |p| p.admitted),
                last.map_or(0, |p| p.refused)
            ),
            series: vec![
                ("admitted", points.iter().map(|p| Some(p.admitted as f64)).collect()),
                ("refused", points.iter().map(|p| Some(p.refused as f64)).collect()),
            ],
            lines: vec![],
            floor: Some(0.0),
            unit: "",
        },
        Chart {
            class,
            id: "queued",
            title: format!("{class} queue ({tier} tier) now: {}", last.map_or(0, |p| p.queued)),
            series: vec![("queued", points.iter().map(|p| Some(p.queued as f64)).collect())],
            lines: vec![],
            floor: Some(0.0),
            unit: "",
        },
        Chart {
            class,
            id: "burn",
            title: format!("{class} latency budget burn: {}", fmt(latest(&|p| p.burn), "x")),
            series: vec![("burn", points.iter().map(|p| p.burn).collect())],
            lines: vec![("1x", 1.0)],
            floor: Some(0.0),
            unit: "x",
        },
    ]
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

fn pct(x: f64) -> String {
    format!("{:.3} %", x * 100.0)
}

/// Green under target, amber up to 2x, red beyond.
fn level(value: f64, target: f64) -> &'static str {
    if value <= target {
        "ok"
    } else if value <= 2.0 * target {
        "warn"
    } else {
        "bad"
    }
}

/// The history charts, per class: the first thing on the page, since the
/// first question is "since when, and is it getting better?".
fn history_section(s: &Status) -> String {
    let step = s.history.step_s;
    let span = |n: usize| {
        let secs = step * n as f64;
        if secs >= 120.0 {
            format!("last {:.0} min", secs / 60.0)
        } else {
            format!("last {secs:.0} s")
        }
    };
    let mut h = format!(
        "<h2>Last hour</h2><p class=\"meta\">A point every {} per class, {} kept: TTFT P99 (rolling window) against its target, share of completed requests within target over each step against the objective, requests admitted and refused, queue depth, latency budget burn.</p>",
        humantime::format_duration(Duration::from_millis((step * 1000.0).round() as u64)),
        history::POINTS
    );
    if s.history.classes.values().all(|p| p.is_empty()) {
        h.push_str("<p class=\"meta\">No points yet: the first comes one step after start.</p>");
        return h;
    }
    // Classes without a request in the whole history take one line, not a row of flat charts.
    let mut idle = Vec::new();
    for c in &s.classes {
        let Some(points) = s.history.classes.get(&c.name).filter(|p| !p.is_empty()) else { continue };
        if points.iter().all(|p| p.admitted == 0 && p.refused == 0) {
            idle.push(esc(&c.name));
            continue;
        }
        h.push_str(&format!("<h3>{}</h3><div class=\"hrow\">", esc(&c.name)));
        for ch in class_charts(&c.name, c.tier, points, s.slo.latency_objective) {
            h.push_str(&chart(&ch, &span(points.len())));
        }
        h.push_str("</div>");
    }
    if !idle.is_empty() {
        h.push_str(&format!("<p class=\"meta\">No requests in this time: {}.</p>", idle.join(", ")));
    }
    h
}

/// The page: one table per concern, inline CSS, no scripts, no external assets.
pub(crate) fn html(s: &Status) -> String {
    let mut h = String::with_capacity(16 * 1024);
    h.push_str(HEAD);
    h.push_str("<h1>slogate SLO status</h1>");
    h.push_str(&format!(
        "<p class=\"meta\">Generated {} &middot; error budgets counted since {} (process start; Prometheus holds the history) &middot; \
latency objective {} &middot; availability objective {} over {} &middot; percentiles over the last {} &middot; refreshes every 5 s &middot; \
<a href=\"/slo.json\">JSON</a></p>",
        esc(&s.generated_at),
        esc(&s.budgets_since),
        pct(s.slo.latency_objective),
        pct(s.slo.availability_objective),
        esc(&s.slo.window),
        esc(&s.slo.rolling_window)
    ));
    h.push_str(&history_section(s));
    h.push_str(&latency_table(s));
    h.push_str(&budgets_table(s));
    h.push_str(&format!(
        "<h2>Queues</h2><table><tr><th class=\"l\">tier</th><th>waiting</th></tr><tr><td class=\"l\">interactive</td><td>{}</td></tr><tr><td class=\"l\">batch</td><td>{}</td></tr></table>",
        s.queues.interactive, s.queues.batch
    ));
    h.push_str(&tenants_table(s));
    h.push_str(&replicas_table(s));
    if let Some(f) = &s.fleet {
        h.push_str(&fleet_table(f));
    }
    h.push_str("</body></html>\n");
    h
}

/// The page's head: its style, and a refresh every 5 s.
const HEAD: &str = "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><meta http-equiv=\"refresh\" content=\"5\">\
<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\"><title>slogate SLO status</title><style>\
body{font-family:system-ui,-apple-system,'Segoe UI',sans-serif;margin:24px;color:#1d2430;background:#fafbfc}\
h1{font-size:22px;margin:0 0 4px}h2{font-size:16px;margin:24px 0 8px}p.meta{color:#5b6574;margin:0 0 12px;font-size:13px}\
table{border-collapse:collapse;background:#fff;font-size:13px;box-shadow:0 1px 2px rgba(0,0,0,.08)}\
th,td{padding:6px 10px;border-bottom:1px solid #e6e9ee;text-align:right;white-space:nowrap}th{background:#f0f2f5;font-weight:600}\
td.l,th.l{text-align:left}.ok{color:#13795b}.warn{color:#a15c00}.bad{color:#b42318;font-weight:600}\
.pill{display:inline-block;padding:1px 8px;border-radius:10px;font-size:12px}.pill.ok{background:#e3f6ee}.pill.warn{background:#fff1dc}.pill.bad{background:#fde7e5}\
.hrow{display:grid;grid-template-columns:repeat(auto-fit,minmax(170px,1fr));gap:8px;margin:0 0 12px}\
figure.hc{margin:0;background:#fff;box-shadow:0 1px 2px rgba(0,0,0,.08);padding:4px}figcaption{font-size:12px;color:#5b6574;padding:2px 4px}\
svg.hist{width:100%;height:auto;display:block}svg.hist .bg{fill:#fff}svg.hist polyline{fill:none;stroke-width:1.5}\
svg.hist .s0{stroke:#2563eb}svg.hist .s1{stroke:#b42318}svg.hist .ref{stroke:#a15c00;stroke-dasharray:4 3;stroke-width:1}\
svg.hist .lbl{font-size:9px;fill:#5b6574}svg.hist .end{text-anchor:end}h3{font-size:14px;margin:12px 0 6px}\
@media (max-width:700px){body{margin:10px}table{display:block;overflow-x:auto}}\
</style></head><body>";

/// Each class's percentiles against its targets, breaker and reduction.
fn latency_table(s: &Status) -> String {
    let mut h = String::new();
    h.push_str("<h2>Latency against targets</h2><table><tr><th class=\"l\">class</th><th class=\"l\">tier</th><th>TTFT P50 ms</th><th>TTFT P99 ms</th><th>TTFT target ms</th><th>ITL P50 ms</th><th>ITL P99 ms</th><th>ITL target ms</th><th>samples</th><th class=\"l\">breaker</th><th class=\"l\">context reduction</th></tr>");
    for c in &s.classes {
        let breaker = match c.breaker {
            "closed" => "ok",
            "half-open" => "warn",
            _ => "bad",
        };
        h.push_str(&format!(
            "<tr><td class=\"l\">{}</td><td class=\"l\">{}</td><td>{:.1}</td><td class=\"{}\">{:.1}</td><td>{:.0}</td><td>{:.1}</td><td class=\"{}\">{:.1}</td><td>{:.0}</td><td>{}</td><td class=\"l\"><span class=\"pill {breaker}\">{}</span></td><td class=\"l\"><span class=\"pill {}\">{}</span></td></tr>",
            esc(&c.name),
            c.tier,
            c.ttft_p50_ms,
            level(c.ttft_p99_ms, c.ttft_target_ms),
            c.ttft_p99_ms,
            c.ttft_target_ms,
            c.itl_p50_ms,
            level(c.itl_p99_ms, c.itl_target_ms),
            c.itl_p99_ms,
            c.itl_target_ms,
            c.samples,
            c.breaker,
            if c.context_reduction { "warn" } else { "ok" },
            if c.context_reduction { "active" } else { "off" },
        ));
    }
    h.push_str("</table>");
    h
}

/// Each class's two SLIs: attainment, budget left, burn rates.
fn budgets_table(s: &Status) -> String {
    let mut h = String::new();
    h.push_str("<h2>Error budgets</h2><table><tr><th class=\"l\">SLO</th><th>objective</th><th>attainment</th><th>good / valid</th><th>budget remaining</th><th class=\"l\">judged by (within, since start)</th>");
    let windows: Vec<String> =
        s.classes.first().map(|c| c.latency.burn_rates.iter().map(|b| b.window.clone()).collect()).unwrap_or_default();
    for w in &windows {
        h.push_str(&format!("<th>burn {}</th>", esc(w)));
    }
    h.push_str("</tr>");
    for c in &s.classes {
        for (kind, sli) in [("latency", &c.latency), ("availability", &c.availability)] {
            let rem = if sli.budget_remaining >= 0.5 {
                "ok"
            } else if sli.budget_remaining >= 0.0 {
                "warn"
            } else {
                "bad"
            };
            h.push_str(&format!(
                "<tr><td class=\"l\">{}-{kind}</td><td>{}</td><td class=\"{}\">{}</td><td>{} / {}</td><td class=\"{rem}\">{:.1} %</td>",
                esc(&c.name),
                pct(sli.objective),
                if sli.attainment >= sli.objective { "ok" } else { "bad" },
                pct(sli.attainment),
                sli.good,
                sli.valid,
                sli.budget_remaining * 100.0,
            ));
            h.push_str(&format!("<td class=\"l\">{}</td>", if kind == "latency" { judged_by(c) } else { String::new() }));
            for b in &sli.burn_rates {
                h.push_str(&format!("<td class=\"{}\">{:.2}x</td>", level(b.rate, 1.0), b.rate));
            }
            h.push_str("</tr>");
        }
    }
    h.push_str("</table>");
    h
}

/// What judged a class's completed requests for its latency SLI: each
/// signal that judged any, with the share within the targets.
fn judged_by(c: &super::ClassStatus) -> String {
    let parts: Vec<String> = c
        .signals
        .iter()
        .filter(|s| s.judged > 0)
        .map(|s| {
            let name = match s.signal {
                Signal::ttft => "first token and gaps",
                Signal::first_byte => "first audio byte",
                Signal::e2e => "whole answer",
            };
            format!("{name}: {} ({})", s.judged, pct(s.within as f64 / s.judged as f64))
        })
        .collect();
    if parts.is_empty() {
        "&ndash;".to_string()
    } else {
        parts.join(" &middot; ")
    }
}

/// Each replica: health and why not, load, slots.
fn replicas_table(s: &Status) -> String {
    let mut h = String::new();
    h.push_str("<h2>Replicas</h2><table><tr><th class=\"l\">pool</th><th class=\"l\">replica</th><th class=\"l\">URL</th><th class=\"l\">health</th><th>in flight</th><th>before first token</th><th>slots</th><th>prefix cache hits (expected / reported)</th></tr>");
    for p in &s.pools {
        for r in &p.replicas {
            h.push_str(&format!(
                "<tr><td class=\"l\">{}</td><td class=\"l\">{}</td><td class=\"l\">{}</td><td class=\"l\"><span class=\"pill {}\">{}</span> {}</td><td>{}</td><td>{}</td><td>{}</td><td>{} / {}</td></tr>",
                esc(&p.name),
                esc(&r.name),
                esc(&r.url),
                if r.healthy { "ok" } else { "bad" },
                if r.healthy { "healthy" } else if p.panic { "unhealthy, routed to (pool in panic)" } else { "unhealthy" },
                esc(&[r.reason.as_deref(), r.last_change.as_deref()].into_iter().flatten().collect::<Vec<_>>().join("; ")),
                r.inflight,
                r.prefilling,
                {
                    let limit = match (r.limit_learned, r.engine_slots) {
                        (true, Some(n)) => format!("{} (learned, within the engine's {n})", r.max_inflight),
                        (true, None) => format!("{} (learned)", r.max_inflight),
                        (false, _) => r.max_inflight.to_string(),
                    };
                    match r.fleet_slots {
                        Some(n) => format!("{n} of {limit}"),
                        None => limit,
                    }
                },
                percent(r.estimated_hit_ratio),
                percent(r.reported_hit_ratio),
            ));
        }
    }
    h.push_str("</table>");
    h
}

/// A share as a whole percentage, or a dash before any.
fn percent(x: Option<f64>) -> String {
    x.map_or_else(|| "–".to_string(), |x| format!("{:.0} %", x * 100.0))
}

/// The fleet's peers as this instance hears them.
fn fleet_table(f: &super::FleetStatus) -> String {
    let mut h = String::new();
    h.push_str(&format!(
        "<h2>Fleet</h2><p>This instance: {}. Slots above: this instance's part of each replica's limit.</p><table><tr><th class=\"l\">peer</th><th class=\"l\">id</th><th class=\"l\">standing</th><th>last heard</th><th class=\"l\">why not heard</th></tr>",
        esc(&f.id)
    ));
    for p in &f.peers {
        h.push_str(&format!(
            "<tr><td class=\"l\">{}</td><td class=\"l\">{}</td><td class=\"l\"><span class=\"pill {}\">{}</span></td><td>{}</td><td class=\"l\">{}</td></tr>",
            esc(&p.address),
            esc(p.id.as_deref().unwrap_or("")),
            if matches!(p.status.as_str(), "fresh" | "self") { "ok" } else { "bad" },
            esc(&p.status),
            p.last_heard_ms.map(|ms| format!("{ms} ms ago")).unwrap_or_else(|| "never".into()),
            esc(p.error.as_deref().unwrap_or("")),
        ));
    }
    h.push_str("</table>");
    h
}

/// The tenants' table: each key's service over the last minute, its limits
/// and its quotas' use.
fn tenants_table(s: &Status) -> String {
    let mut h = String::new();
    if s.tenants.is_empty() {
        return h;
    }
    h.push_str("<h2>Tenants (last minute)</h2><table><tr><th class=\"l\">tenant</th><th>weight</th><th>share of tokens</th><th>tokens</th><th>within SLO</th><th class=\"l\">limits</th><th>running</th><th>refused</th></tr>");
    for t in &s.tenants {
        let limits = t.limits.as_ref().map_or_else(String::new, |l| {
            let mut parts = Vec::new();
            if let Some(v) = l.requests_per_minute {
                parts.push(format!("{v} req/min"));
            }
            if let Some(v) = l.tokens_per_minute {
                parts.push(format!("{v} tok/min"));
            }
            if let Some(v) = l.max_concurrent {
                parts.push(format!("{v} at once"));
            }
            let shared = match l.kept {
                "store" => " (shared in the limit store)".to_string(),
                "store_down" => format!(" (limit store down: 1/{} here)", l.instances),
                _ if l.instances > 1 => format!(" (1/{} here)", l.instances),
                _ => String::new(),
            };
            for q in &t.quotas {
                parts.push(format!("{} of {} {}/{}", q.used, q.limit, if q.kind == "tokens" { "tok" } else { "req" }, q.window));
            }
            format!("{}{shared}", parts.join(", "))
        });
        let limited = if t.limited { " <span class=\"pill warn\">limited</span>" } else { "" };
        h.push_str(&format!(
            "<tr><td class=\"l\">{}{limited}</td><td>{}</td><td>{:.1} %</td><td>{}</td><td><span class=\"pill {}\">{}</span></td><td class=\"l\">{}</td><td>{}</td><td>{}</td></tr>",
            esc(&t.name),
            t.weight,
            t.share * 100.0,
            t.tokens_last_minute,
            if t.judged_last_minute == 0 || t.attainment >= s.slo.latency_objective { "ok" } else { "bad" },
            if t.judged_last_minute == 0 { "-".to_string() } else { pct(t.attainment) },
            esc(&limits),
            t.concurrent,
            t.refused.requests + t.refused.tokens + t.refused.concurrent + t.refused.quota,
        ));
    }
    h.push_str("</table>");
    h
}
