//! Reports of the benchmarks that measure what the path through the
//! gateway adds, one run each:
//!
//! ```text
//! bench report hol DIR HZ           large request bodies beside open streams
//! bench report pair DIR HZ A B A2   two paths taken in turn, and a control
//! ```

use std::fmt::Write as _;
use std::path::Path;

use super::out::{n, read_text, signed, write, Measured};
use super::records::{done, load, pct_floor, pct_pairs};
use crate::loadgen::RunResult;

/// The whitespace-separated integers of a file a driver wrote.
pub(super) fn ints(path: &Path) -> Result<Vec<i64>, String> {
    read_text(path)?.split_whitespace().map(|v| v.parse().map_err(|_| format!("{}: {v:?} is not a number", path.display()))).collect()
}

fn gaps<'a>(m: &'a std::collections::BTreeMap<String, Vec<(u64, u64)>>, key: &str) -> &'a [(u64, u64)] {
    m.get(key).map_or(&[], Vec::as_slice)
}

/// One part of the head-of-line run.
struct Hol {
    streams_done: usize,
    streams_failed: usize,
    gaps: u64,
    path50: f64,
    path99: f64,
    client99: f64,
    bulk: usize,
    bulk_ok: usize,
    reduced: i64,
    mib: f64,
    cpu_s: f64,
}

fn hol_part(dir: &Path, name: &str, hz: f64) -> Result<Hol, String> {
    let r = load(&dir.join(format!("{name}.json")))?;
    let extra = ints(&dir.join(format!("{name}.extra")))?;
    let (cpu, reduced) = (extra.first().copied().unwrap_or(0), extra.get(1).copied().unwrap_or(0));
    let s: Vec<_> = r.records.iter().filter(|x| x.stream == "s").collect();
    let bulk: Vec<_> = r.records.iter().filter(|x| x.stream == "bulk").collect();
    let path = gaps(&r.itl_path_us, "chat");
    let client = gaps(&r.itl_us, "chat");
    Ok(Hol {
        streams_done: s.iter().filter(|x| done(x)).count(),
        streams_failed: s.iter().filter(|x| !done(x)).count(),
        gaps: path.iter().map(|p| p.1).sum(),
        path50: pct_pairs(path, 0.5) / 1000.0,
        path99: pct_pairs(path, 0.99) / 1000.0,
        client99: pct_pairs(client, 0.99) / 1000.0,
        bulk: bulk.len(),
        bulk_ok: bulk.iter().filter(|x| done(x)).count(),
        reduced,
        mib: bulk.iter().map(|x| u64::from(x.prompt_tokens)).sum::<u64>() as f64 * 4.0 / (1u64 << 20) as f64,
        cpu_s: cpu as f64 / hz,
    })
}

/// The path's share of ITL p99 of open streams without large request
/// bodies (`quiet`), with them sent straight to their replica (`direct`,
/// the control) and through the gateway (`gateway`).
pub(super) fn hol(dir: &Path, hz: f64) -> Result<(), String> {
    let kinds = ["quiet", "direct", "gateway"];
    let p = kinds.iter().map(|k| hol_part(dir, k, hz)).collect::<Result<Vec<_>, _>>()?;
    let (quiet, direct, gateway) = (&p[0], &p[1], &p[2]);
    let added = gateway.path99 - direct.path99;
    let failed: usize = p.iter().map(|x| x.streams_failed + x.bulk - x.bulk_ok).sum();
    let mut m = Measured::default();
    m.stated("added_path_itl_p99_ms", added, format!("{} ms", signed(added, 3)));
    m.flag("all_answered", failed == 0, format!("{failed} not answered"));
    m.write(dir)?;
    let mut f = String::from(
        "| part | streams done | failed | gaps | path ITL p50 ms | path ITL p99 ms | client ITL p99 ms | large bodies | of them answered | rewritten (reduced) | MiB read | gateway CPU s |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for (name, x) in kinds.iter().zip(&p) {
        let _ = writeln!(
            f,
            "| {name} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            x.streams_done,
            x.streams_failed,
            x.gaps,
            n(x.path50, 3),
            n(x.path99, 3),
            n(x.client99, 2),
            x.bulk,
            x.bulk_ok,
            x.reduced,
            n(x.mib, 0),
            n(x.cpu_s, 1)
        );
    }
    let _ = writeln!(
        f,
        "\nFor scale: the same bodies sent around the gateway (direct minus quiet: the client writing them and the replica reading them on the same two cores) add {} ms to the path's ITL p99; through the gateway, over quiet, {} ms.",
        signed(direct.path99 - quiet.path99, 3),
        signed(gateway.path99 - quiet.path99, 3)
    );
    write(&dir.join("report.md"), &f)
}

/// One target of a run whose requests took its paths in turn: requests
/// served and not, the path's TTFT p50 and p99, its ITL p99, and the CPU
/// per request of its processes.
#[derive(Clone, Copy)]
pub(super) struct Side {
    pub n: usize,
    pub errors: usize,
    pub ttft50: f64,
    pub ttft99: f64,
    pub itl99: f64,
    pub cpu_us: f64,
}

impl Side {
    fn get(&self, key: &str) -> f64 {
        match key {
            "cpu_us" => self.cpu_us,
            "ttft50" => self.ttft50,
            "ttft99" => self.ttft99,
            _ => self.itl99,
        }
    }
}

fn side(run: &RunResult, idx: usize, ticks: i64, hz: f64) -> Side {
    let mine: Vec<_> = run.records.iter().filter(|r| r.target == Some(idx)).collect();
    let served: Vec<_> = mine.iter().filter(|r| done(r)).collect();
    let path: Vec<f64> = served.iter().filter_map(|r| Some(r.ttft_ms? - r.engine_ttft_ms?)).collect();
    let gaps = gaps(&run.itl_by_target.path_us, &idx.to_string());
    let n = served.len();
    Side {
        n,
        errors: mine.len() - n,
        ttft50: pct_floor(&path, 0.5),
        ttft99: pct_floor(&path, 0.99),
        itl99: if gaps.is_empty() { f64::NAN } else { pct_pairs(gaps, 0.99) / 1000.0 },
        cpu_us: if n == 0 { f64::NAN } else { ticks as f64 * 1e6 / hz / n as f64 },
    }
}

/// (key, measured name, what, unit, decimals) of a paired run's measures.
const MEASURES: [(&str, &str, &str, &str, usize); 4] = [
    ("cpu_us", "cpu_added_us", "gateway CPU per request", "us", 0),
    ("ttft50", "ttft50_added_ms", "path TTFT p50", "ms", 3),
    ("ttft99", "ttft99_added_ms", "path TTFT p99", "ms", 3),
    ("itl99", "itl99_added_ms", "path ITL p99", "ms", 3),
];

/// One closed-loop load takes two targets in turn, in a `test` run (A and
/// B) and a `control` run (A and A2): B minus A for each measure, its
/// control A2 minus A beside it.
pub(super) fn pair(dir: &Path, hz: f64, names: [&str; 3]) -> Result<(), String> {
    let mut rows = Vec::new();
    for kind in ["test", "control"] {
        let run = load(&dir.join(format!("{kind}.json")))?;
        let cpu = ints(&dir.join(format!("{kind}.cpu")))?;
        let (ta, tb) = (cpu.first().copied().unwrap_or(0), cpu.get(1).copied().unwrap_or(0));
        rows.push((kind, [side(&run, 0, ta, hz), side(&run, 1, tb, hz)]));
    }
    let [a_name, b_name, a2_name] = names;
    let mut m = Measured::default();
    let mut said = Vec::new();
    for (key, label, what, unit, prec) in MEASURES {
        let t = rows[0].1[1].get(key) - rows[0].1[0].get(key);
        let c = rows[1].1[1].get(key) - rows[1].1[0].get(key);
        let text = format!("{} {unit} (control {} {unit})", signed(t, prec), signed(c, prec));
        said.push(format!("- {what}: **{text}**.\n"));
        m.stated(label, t, text);
    }
    let [a, b] = rows[0].1;
    let added = if a.cpu_us != 0.0 { 100.0 * (b.cpu_us - a.cpu_us) / a.cpu_us } else { f64::NAN };
    m.stated("cpu_added_pct", added, format!("{} % ({} vs {} us)", signed(added, 1), n(b.cpu_us, 0), n(a.cpu_us, 0)));
    let sides = rows.iter().flat_map(|(_, s)| s.iter());
    let errors: usize = sides.clone().map(|s| s.errors).sum();
    let all: usize = sides.map(|s| s.n + s.errors).sum();
    m.stated("errors", errors as f64, format!("{errors} of {all}"));
    m.write(dir)?;
    let mut f = String::from(
        "| run | target | requests | errors | path TTFT p50 ms | path TTFT p99 ms | path ITL p99 ms | gateway CPU us/request |\n|---|---|---:|---:|---:|---:|---:|---:|\n",
    );
    for (kind, pair) in &rows {
        let targets = if *kind == "test" { [a_name, b_name] } else { [a_name, a2_name] };
        for (name, s) in targets.iter().zip(pair) {
            let _ = writeln!(
                f,
                "| {kind} | {name} | {} | {} | {} | {} | {} | {} |",
                s.n,
                s.errors,
                n(s.ttft50, 2),
                n(s.ttft99, 2),
                n(s.itl99, 2),
                n(s.cpu_us, 0)
            );
        }
    }
    let _ = writeln!(f, "\n{b_name} minus {a_name} (control: {a2_name} minus {a_name}, the noise of this comparison):\n");
    f.extend(said);
    write(&dir.join("report.md"), &f)
}
