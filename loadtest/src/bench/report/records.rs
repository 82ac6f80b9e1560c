//! What a run's loadgen results say, the way every report reads them: the
//! measured window, each class's row (completed, refused, TTFT quantiles,
//! within SLO, goodput) and why requests missed their SLO.

use std::path::Path;

use crate::loadgen::{Record, RunResult};

/// The SLO targets the reports judge a request by, per class: TTFT and
/// ITL in milliseconds (the scenarios' own). Other classes have none.
pub fn targets(class: &str) -> (f64, f64) {
    match class {
        "chat" => (300.0, 50.0),
        "batch" => (3000.0, 200.0),
        _ => (f64::INFINITY, f64::INFINITY),
    }
}

/// A loadgen result (`loadgen run --out`).
pub fn load(path: &Path) -> Result<RunResult, String> {
    super::out::read_json(path)
}

/// The measured window: from the end of the warm-up to the run's duration,
/// in seconds of send time.
pub fn window(r: &RunResult) -> (f64, f64) {
    (r.scenario.warmup.as_secs_f64(), r.scenario.duration.as_secs_f64())
}

/// The requests sent within `[a, b)` seconds.
pub fn between(r: &RunResult, a: f64, b: f64) -> Vec<&Record> {
    r.records.iter().filter(|x| a <= x.start_s && x.start_s < b).collect()
}

/// The requests sent within the measured window.
pub fn measured(r: &RunResult) -> Vec<&Record> {
    let (w, d) = window(r);
    between(r, w, d)
}

/// Served whole: the stream ended normally or at its length.
pub fn done(x: &Record) -> bool {
    x.outcome == "ok" || x.outcome == "length"
}

/// Served whole, the first token within its class's target and no more
/// than one gap in a hundred over the ITL target.
pub fn within(x: &Record) -> bool {
    let (ttft, _) = targets(&x.class);
    done(x) && x.ttft_ms.is_none_or(|t| t <= ttft) && x.itl_over <= x.gaps / 100
}

/// The q-quantile by rank (the smallest value at or above q of them); NaN
/// when empty.
pub fn pct(values: &[f64], q: f64) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let rank = ((q * v.len() as f64).ceil() as usize).saturating_sub(1);
    v[rank.min(v.len() - 1)]
}

/// The q-quantile at index `floor(q * len)` (the convention of the
/// path-cost reports); NaN when empty.
pub fn pct_floor(values: &[f64], q: f64) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    v[((q * v.len() as f64) as usize).min(v.len() - 1)]
}

/// The q-quantile of (value, count) pairs, as loadgen writes gaps; NaN
/// when empty.
pub fn pct_pairs(pairs: &[(u64, u64)], q: f64) -> f64 {
    let total: u64 = pairs.iter().map(|p| p.1).sum();
    let mut sorted = pairs.to_vec();
    sorted.sort_unstable();
    let mut seen = 0;
    for (v, c) in sorted {
        seen += c;
        if seen as f64 >= q * total as f64 {
            return v as f64;
        }
    }
    f64::NAN
}

/// One class's requests in a part of a run.
#[derive(Debug, Clone, Copy)]
pub struct ClassRow {
    pub requests: usize,
    pub done: usize,
    pub rejected: usize,
    pub failed: usize,
    pub p50: f64,
    pub p99: f64,
    /// Within SLO, of all its requests (NaN without any).
    pub within: f64,
    /// Within SLO, of those served whole.
    pub within_served: f64,
    /// Within SLO, per second of the part.
    pub goodput: f64,
    /// Served whole, per second of the part.
    pub throughput: f64,
}

/// The row of class `cls` among `recs`, over `span` seconds.
pub fn class_row(recs: &[&Record], cls: &str, span: f64) -> ClassRow {
    row_where(recs, |x| x.class == cls, |x| x.outcome == "rejected", span)
}

/// The row of the requests among `recs` that `mine` picks, over `span`
/// seconds, those that `refused` says were refused counted apart.
pub fn row_where(recs: &[&Record], mine: impl Fn(&Record) -> bool, refused: impl Fn(&Record) -> bool, span: f64) -> ClassRow {
    let rs: Vec<&Record> = recs.iter().copied().filter(|x| mine(x)).collect();
    let served: Vec<&Record> = rs.iter().copied().filter(|x| done(x)).collect();
    let rejected = rs.iter().filter(|x| refused(x)).count();
    let ttft: Vec<f64> = served.iter().filter_map(|x| x.ttft_ms).collect();
    let good = rs.iter().filter(|x| within(x)).count();
    let share = |n: usize, of: usize| if of == 0 { f64::NAN } else { n as f64 / of as f64 };
    ClassRow {
        requests: rs.len(),
        done: served.len(),
        rejected,
        failed: rs.len() - served.len() - rejected,
        p50: pct(&ttft, 0.5),
        p99: pct(&ttft, 0.99),
        within: share(good, rs.len()),
        within_served: share(good, served.len()),
        goodput: good as f64 / span,
        throughput: served.len() as f64 / span,
    }
}

/// Why the completed requests of `cls` missed their SLO, in words: a late
/// first token, or too many gaps over the ITL target; and, where the
/// simulator stamped its chunks, how many of those gap misses the
/// replica's own gaps already made (its steps, late on this machine)
/// rather than the path through the gateway.
pub fn misses(recs: &[&Record], cls: &str) -> String {
    let (ttft, _) = targets(cls);
    let missed: Vec<&Record> = recs.iter().copied().filter(|x| x.class == cls && done(x) && !within(x)).collect();
    let late = |x: &Record| x.ttft_ms.is_some_and(|t| t > ttft);
    let n_late = missed.iter().filter(|x| late(x)).count();
    let gaps: Vec<&Record> = missed.iter().copied().filter(|x| !late(x)).collect();
    let mut text =
        format!("{cls} requests completed outside their SLO: {n_late} with a late first token, {} on gaps over the ITL target", gaps.len());
    let stamped: Vec<&Record> = gaps.iter().copied().filter(|x| x.engine_itl_over.is_some()).collect();
    if !stamped.is_empty() {
        let engine = stamped.iter().filter(|x| x.engine_itl_over.is_some_and(|o| o > x.gaps / 100)).count();
        text += &format!(
            "; of those {} (gaps stamped by the replica), {engine} missed on the replica's own gaps as it sent them, {} only on what the path added",
            stamped.len(),
            stamped.len() - engine
        );
    }
    text + "."
}

/// Completions per second inside the measured window, by completion time
/// (counting requests that merely started in it would add the in-flight
/// tail): a fleet's capacity C from a saturating run.
pub fn capacity(r: &RunResult) -> f64 {
    let (w, d) = window(r);
    let n = r.records.iter().filter(|x| done(x) && (w..d).contains(&(x.start_s + x.e2e_ms / 1000.0))).count();
    n as f64 / (d - w)
}

/// One path of a run whose requests took its targets in turn, from a
/// simulator that stamps its chunks (the requests sent after `warm`
/// seconds): TTFT p50, the path's share of TTFT (the client's TTFT less
/// the engine's) at p50, the client's ITL p99 and how far it lies above
/// the replica's ITL p99 of the same gaps (ms).
pub struct Interleaved {
    pub n: usize,
    pub bad: usize,
    pub ttft50: f64,
    pub path50: f64,
    pub itl99: f64,
    pub shift99: f64,
}

pub fn interleaved(run: &RunResult, target: usize, warm: f64) -> Interleaved {
    let recs: Vec<&Record> = run.records.iter().filter(|x| x.start_s >= warm && x.target == Some(target)).collect();
    let ok: Vec<&&Record> = recs.iter().filter(|x| done(x) && x.ttft_ms.is_some()).collect();
    let key = target.to_string();
    let q99 =
        |m: &std::collections::BTreeMap<String, Vec<(u64, u64)>>| pct_pairs(m.get(&key).map_or(&[][..], Vec::as_slice), 0.99) / 1000.0;
    let (client, engine) = (q99(&run.itl_by_target.client_us), q99(&run.itl_by_target.engine_us));
    let t: Vec<f64> = ok.iter().filter_map(|x| x.ttft_ms).collect();
    let path: Vec<f64> = ok.iter().filter_map(|x| Some(x.ttft_ms? - x.engine_ttft_ms?)).collect();
    Interleaved {
        n: recs.len(),
        bad: recs.len() - ok.len(),
        ttft50: pct_floor(&t, 0.5),
        path50: pct_floor(&path, 0.5),
        itl99: client,
        shift99: client - engine,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn rec(class: &str, outcome: &str, ttft: Option<f64>, gaps: u32, over: u32) -> Record {
        serde_json::from_value(serde_json::json!({
            "stream": class, "class": class, "start_s": 1.0, "status": 200, "outcome": outcome,
            "ttft_ms": ttft, "e2e_ms": 500.0, "tokens": gaps + 1, "prompt_tokens": 10, "gaps": gaps,
            "itl_over": over, "itl_max_ms": null, "retry_after": null, "queue_ms": null, "context_reduced": null
        }))
        .expect("a record")
    }

    /// Nearest rank from above: the 99th of 100 values is the 99th, of
    /// 10 the largest; the median of 4 the second.
    #[test]
    fn a_quantile_is_the_value_at_its_rank() {
        let hundred: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(pct(&hundred, 0.99), 99.0);
        assert_eq!(pct(&hundred[..10], 0.99), 10.0);
        assert_eq!(pct(&[4.0, 1.0, 3.0, 2.0], 0.5), 2.0);
        assert!(pct(&[], 0.5).is_nan());
    }

    /// Gaps as loadgen writes them, (value, count): the value at which
    /// the running count reaches q of them.
    #[test]
    fn a_quantile_of_counted_values_is_where_the_count_reaches_it() {
        let gaps = [(30, 50), (10, 49), (90, 1)];
        assert_eq!(pct_pairs(&gaps, 0.5), 30.0);
        assert_eq!(pct_pairs(&gaps, 0.49), 10.0);
        assert_eq!(pct_pairs(&gaps, 0.99), 30.0);
        assert_eq!(pct_pairs(&gaps, 1.0), 90.0);
        assert!(pct_pairs(&[], 0.5).is_nan());
    }

    /// Within SLO: served, first token by the class's target, at most one
    /// gap in a hundred over; a refusal is counted apart from a failure.
    #[test]
    fn a_class_row_counts_what_met_its_slo() {
        let recs = [
            rec("chat", "ok", Some(100.0), 200, 2),
            rec("chat", "length", Some(301.0), 10, 0),
            rec("chat", "ok", Some(50.0), 99, 1),
            rec("chat", "rejected", None, 0, 0),
            rec("chat", "timeout", None, 0, 0),
            rec("batch", "ok", Some(2000.0), 10, 0),
        ];
        let refs: Vec<&Record> = recs.iter().collect();
        let row = class_row(&refs, "chat", 2.0);
        assert_eq!((row.requests, row.done, row.rejected, row.failed), (5, 3, 1, 1));
        assert_eq!(row.within, 0.2, "only the first: late, and one gap over in 99");
        assert_eq!(row.goodput, 0.5);
        assert_eq!(row.p99, 301.0);
        assert_eq!(
            misses(&refs, "chat"),
            "chat requests completed outside their SLO: 1 with a late first token, 1 on gaps over the ITL target."
        );
        assert_eq!(class_row(&refs, "batch", 1.0).within, 1.0);
    }
}
