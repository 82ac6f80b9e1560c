//! Reports of `loadtest/bench/scale.sh`: one row per part (streams open
//! through the gateway beside the same streams direct), the RSS against
//! open streams for the charts, and where an open stream's memory goes
//! (the live heap of a gateway built with `--features heap-profile`, by
//! what allocated it).
//!
//! ```text
//! bench report scale DIR HZ
//! bench report heap N PROTO=DHAT_JSON...   (a Markdown table on stdout)
//! ```

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use super::out::{n, signed, thousands, write, Measured, Table};
use super::records::{done, load, pct_pairs};

/// One part of the run.
struct Row {
    run: String,
    proto: String,
    streams: u64,
    open: u64,
    idle: f64,
    peak: f64,
    /// Bytes of RSS per open stream.
    per: f64,
    itl_gw: f64,
    itl_d: f64,
    path_gw: f64,
    path_d: f64,
    cpu: f64,
    done: usize,
    sent: usize,
    tokens_s: f64,
}

fn row(dir: &Path, runs: &Table, i: usize, hz: f64) -> Result<Row, String> {
    let name = runs.text(i, "run").to_string();
    let res = load(&dir.join(format!("{name}.json")))?;
    let through: Vec<_> = res.records.iter().filter(|x| x.stream == "through").collect();
    let q99 = |m: &BTreeMap<String, Vec<(u64, u64)>>, k: &str| pct_pairs(m.get(k).map_or(&[][..], Vec::as_slice), 0.99) / 1000.0;
    let (idle, peak) = (runs.at(i, "idle_kb"), runs.at(i, "peak_kb"));
    let open = (runs.at(i, "open_peak") as u64).max(1);
    Ok(Row {
        proto: runs.text(i, "proto").to_string(),
        streams: runs.at(i, "streams") as u64,
        open,
        idle,
        peak,
        per: (peak - idle) * 1024.0 / open as f64,
        itl_gw: q99(&res.itl_us, "chat"),
        itl_d: q99(&res.itl_us, "direct"),
        // What each gap gained between the replica and the client (the
        // simulator's stamps): exact to the microsecond, where a gap of a
        // second is read from the histogram to half a millisecond.
        path_gw: q99(&res.itl_path_us, "chat"),
        path_d: q99(&res.itl_path_us, "direct"),
        // The content events the streams through the gateway received.
        cpu: runs.at(i, "cpu_ticks") / hz * 1e6 / through.iter().map(|x| f64::from(x.tokens)).sum::<f64>().max(1.0),
        done: through.iter().filter(|x| done(x)).count(),
        sent: through.len(),
        tokens_s: through.iter().map(|x| f64::from(x.tokens)).sum::<f64>() / res.elapsed_s,
        run: name,
    })
}

/// The RSS samples of a part (`KB OPEN` a line), as (open streams, MB).
fn curve(dir: &Path, run: &str) -> Result<Vec<(f64, f64)>, String> {
    let path = dir.join(format!("{run}.samples"));
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(text
        .lines()
        .filter_map(|l| match l.split_whitespace().collect::<Vec<_>>()[..] {
            [kb, open] => Some((open.parse().ok()?, kb.parse::<f64>().ok()? / 1024.0)),
            _ => None,
        })
        .collect())
}

/// `bench report scale DIR HZ`.
pub(super) fn scale(dir: &Path, hz: f64) -> Result<(), String> {
    let runs = Table::read(&dir.join("runs.csv"))?;
    let rows = (0..runs.rows.len()).map(|i| row(dir, &runs, i, hz)).collect::<Result<Vec<_>, _>>()?;
    curves(dir, &rows)?;
    let mut f = String::from(
        "| run | streams asked | open at peak | completed / sent | RSS idle MB | RSS peak MB | bytes per open stream | \
         ITL p99 through / direct ms | path's share of a gap p99 through / direct ms | added ITL p99 ms | CPU per event us | tokens/s through |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for r in &rows {
        let _ = writeln!(
            f,
            "| {} | {} | {} | {} / {} | {} | {} | {} KB | {} / {} | {} / {} | {} | {} | {} |",
            r.run,
            r.streams,
            r.open,
            r.done,
            r.sent,
            n(r.idle / 1024.0, 1),
            n(r.peak / 1024.0, 1),
            n(r.per / 1024.0, 1),
            n(r.itl_gw, 1),
            n(r.itl_d, 1),
            n(r.path_gw, 3),
            n(r.path_d, 3),
            signed(r.path_gw - r.path_d, 3),
            n(r.cpu, 1),
            n(r.tokens_s, 0)
        );
    }
    judge(&rows).write(dir)?;
    f.push_str("\nCharts: `rss-h1.svg`, `rss-h2.svg` (RSS against open streams, every sample of every run).\n");
    if let Some(heap) = std::fs::read_to_string(dir.join("heap.md")).ok().filter(|h| !h.is_empty()) {
        f.push_str(
            "\n## Where an open stream's memory goes\n\n\
             The live heap of a gateway built with `--features heap-profile` (dhat records every allocation with its call \
             stack), at its peak with the streams open, by what allocated it, divided by the open streams. Heap bytes \
             asked for, not pages touched: RSS per stream is lower where a buffer is allocated whole and written in part.\n\n",
        );
        let _ = writeln!(f, "{heap}");
    }
    write(&dir.join("report.md"), &f)
}

/// The RSS against open streams of each protocol's parts, for its chart.
fn curves(dir: &Path, rows: &[Row]) -> Result<(), String> {
    for proto in ["h1", "h2"] {
        let mut pts = Vec::new();
        for r in rows.iter().filter(|r| r.proto == proto) {
            pts.extend(curve(dir, &r.run)?);
        }
        pts.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.total_cmp(&b.1)));
        let mut f = String::from("open streams,RSS MB\n");
        for (x, y) in pts {
            let _ = writeln!(f, "{},{}", n(x, 0), n(y, 1));
        }
        write(&dir.join(format!("rss-{proto}.csv")), &f)?;
    }
    Ok(())
}

/// What the checks judge: the part with the most streams, the most over
/// HTTP/1.1, and HTTP/2's throughput over HTTP/1.1's.
fn judge(rows: &[Row]) -> Measured {
    let mut m = Measured::default();
    // The most streams (the first such row, as the table lists them).
    let big = rows.iter().fold(None::<&Row>, |b, r| match b {
        Some(b) if (b.streams, &b.proto) >= (r.streams, &r.proto) => Some(b),
        _ => Some(r),
    });
    if let Some(big) = big {
        let at = format!("at {} ({})", big.streams, big.proto);
        m.stated("kb_per_stream_most", big.per / 1024.0, format!("{} KB {at}", n(big.per / 1024.0, 1)));
        let added = big.path_gw - big.path_d;
        m.stated("added_itl_p99_ms_most", added, format!("{} ms {at}", signed(added, 3)));
        m.flag("all_complete_most", big.done == big.sent, format!("{} of {} {at}", big.done, big.sent));
        m.stated("cpu_us_per_event_most", big.cpu, format!("{} us {at}", n(big.cpu, 1)));
    }
    let b1 = rows.iter().filter(|r| r.proto == "h1").fold(None::<&Row>, |b, r| match b {
        Some(b) if b.streams >= r.streams => Some(b),
        _ => Some(r),
    });
    if let Some(b1) = b1 {
        m.stated("kb_per_stream_h1_most", b1.per / 1024.0, format!("{} KB at {} (h1)", n(b1.per / 1024.0, 1), b1.streams));
    }
    let mut counts: Vec<u64> = rows.iter().map(|r| r.streams).collect();
    counts.sort_unstable();
    counts.dedup();
    let ratios: Vec<(f64, u64)> = counts
        .iter()
        .filter_map(|&c| {
            let of = |p: &str| rows.iter().find(|r| r.streams == c && r.proto == p);
            Some((of("h2")?.tokens_s / of("h1")?.tokens_s.max(1e-9), c))
        })
        .collect();
    if let Some(worst) = ratios.iter().copied().reduce(|a, b| if (b.0, b.1) < (a.0, a.1) { b } else { a }) {
        let said = ratios.iter().map(|(r, c)| format!("{}x at {c}", n(*r, 2))).collect::<Vec<_>>().join(", ");
        m.stated("h2_over_h1_throughput", worst.0, said);
    }
    m
}

/// What allocated a live byte, by frames that must all appear in the
/// allocation's call stack; the first that matches names it.
const RULES: [(&str, &[&str]); 25] = [
    ("a panic's backtrace being printed (debug info; not per stream)", &["std::backtrace_rs"]),
    ("replica connection: read buffer (4 KiB, held while a read is handed on)", &["slogate::upstream::link::Link::fill"]),
    ("replica connection: events read, being handed on (copies)", &["slogate::upstream::link::Link::take"]),
    ("client HTTP/1.1 connection: write buffer (8 KiB, fixed in hyper)", &["hyper::proto::h1::io::WriteBuf::new"]),
    ("client HTTP/1.1 connection: read buffer", &["hyper::proto::h1::io::Buffered::poll_read_from_io"]),
    ("the request's future until its response head (routing, admission, connect)", &["tower::util::boxed_clone::BoxCloneService"]),
    ("a stream's memo of its last chunk with text (read by comparison)", &["sse::memo::Memo::keep"]),
    ("resume: the request kept for a continuation, the answer's text so far", &["slogate::proxy::resume"]),
    ("resume: the request kept for a continuation, the answer's text so far", &["slogate::proxy::respond::resumable"]),
    ("resume: the request kept for a continuation, the answer's text so far", &["ObservedBody::resumable"]),
    ("stream observer (SSE parser, timings, outcome)", &["slogate::proxy::observe"]),
    ("stream observer (SSE parser, timings, outcome)", &["slogate::proxy::watchdog"]),
    ("the request's tracker (timings, lease, accounting)", &["slogate::proxy::tracker"]),
    ("request sent to the replica (its head and body)", &["slogate::proxy::build_upstream_request"]),
    ("request sent to the replica (its head and body)", &["slogate::proxy::body"]),
    ("replica connection: its state (socket, framing; about 250 bytes)", &["slogate::upstream::conn"]),
    // Before hyper's connection: its poll is on the stack of all a request does.
    ("other slogate", &["slogate::proxy"]),
    ("client HTTP/1.1 connection: other", &["hyper::server::conn::http1"]),
    ("client HTTP/2 connection: stream state (h2: streams, frames queued, headers)", &[": h2::"]),
    (
        "client connection's task (hyper's connection and its state)",
        &["tokio::runtime::task::core::Cell", "slogate::server::serve::{{closure}} "],
    ),
    ("other tasks (tokio: a stream's watchdog, a replica connection's)", &["tokio::runtime::task::core::Cell"]),
    ("socket registrations (tokio)", &["tokio::runtime::io::registration_set"]),
    ("request head as parsed (headers, extensions)", &["http::header::map"]),
    ("request head as parsed (headers, extensions)", &["http::extensions"]),
    ("other slogate", &["slogate::"]),
];
const OTHER: &str = "other";

/// A frame without generic arguments (`Foo<T>::new` is `Foo::new`), as
/// the rules name it.
fn plain(frame: &str) -> String {
    let (mut out, mut depth, mut prev) = (String::with_capacity(frame.len()), 0usize, None::<char>);
    for ch in frame.chars() {
        let after_name = prev.is_some_and(|p| p.is_alphanumeric() || p == '_');
        if ch == '<' && (depth > 0 || after_name) {
            depth += 1;
        } else if ch == '>' && depth > 0 {
            depth -= 1;
        } else if depth == 0 {
            out.push(ch);
        }
        prev = Some(ch);
    }
    out
}

/// Live bytes at the peak of a dhat profile, by what allocated them.
fn breakdown(path: &Path) -> Result<BTreeMap<&'static str, u64>, String> {
    let d: serde_json::Value = super::out::read_json(path)?;
    let ftbl: Vec<String> = d["ftbl"].as_array().map_or(Vec::new(), |a| a.iter().map(|f| plain(f.as_str().unwrap_or(""))).collect());
    let mut out = BTreeMap::new();
    for pp in d["pps"].as_array().map_or(&[][..], Vec::as_slice) {
        let gb = pp["gb"].as_u64().unwrap_or(0);
        if gb == 0 {
            continue;
        }
        let frames = pp["fs"].as_array().map_or(&[][..], Vec::as_slice);
        let stack = frames.iter().filter_map(|i| ftbl.get(i.as_u64()? as usize).map(String::as_str)).collect::<Vec<_>>().join(" | ");
        let item = RULES.iter().find(|(_, need)| need.iter().all(|f| stack.contains(f))).map_or(OTHER, |r| r.0);
        *out.entry(item).or_insert(0) += gb;
    }
    Ok(out)
}

/// `bench report heap N PROTO=DHAT_JSON...`: the table on stdout.
pub(super) fn heap(streams: f64, profiles: &[String]) -> Result<(), String> {
    let mut runs = Vec::new();
    for arg in profiles {
        let (proto, path) = arg.split_once('=').ok_or_else(|| format!("{arg:?}: PROTO=DHAT_JSON"))?;
        runs.push((proto, breakdown(Path::new(path))?));
    }
    let mut items: Vec<&str> = Vec::new();
    for item in RULES.iter().map(|r| r.0).chain([OTHER]) {
        if !items.contains(&item) && runs.iter().any(|(_, b)| b.get(item).is_some_and(|v| *v > 0)) {
            items.push(item);
        }
    }
    let protos = runs.iter().map(|(p, _)| *p).collect::<Vec<_>>().join(" | ");
    let mut f = format!("| item (bytes per open stream, {} streams) | {protos} |\n|---|{}\n", n(streams, 0), "---:|".repeat(runs.len()));
    for item in items {
        let cells: Vec<String> = runs.iter().map(|(_, b)| thousands(*b.get(item).unwrap_or(&0) as f64 / streams)).collect();
        let _ = writeln!(f, "| {item} | {} |", cells.join(" | "));
    }
    let totals: Vec<String> = runs.iter().map(|(_, b)| format!("**{}**", thousands(b.values().sum::<u64>() as f64 / streams))).collect();
    let _ = writeln!(f, "| **live heap at the peak, per open stream** | {} |", totals.join(" | "));
    print!("{f}");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_lose_their_generic_arguments() {
        assert_eq!(plain("hyper::proto::h1::io::WriteBuf<B>::new"), "hyper::proto::h1::io::WriteBuf::new");
        assert_eq!(plain("<T as Foo<U>>::call"), "<T as Foo>::call");
        assert_eq!(plain("a < b"), "a < b");
    }
}
