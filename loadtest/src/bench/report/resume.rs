//! Report of `loadtest/bench/resume.sh`: per fault, resume on and off,
//! what the OpenAI SDK's clients saw and what slogate counted.
//!
//! ```text
//! bench report resume DIR FAULT_AT
//! ```

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use serde::Deserialize;

use super::out::{write, Measured};
use super::prom::{label, samples, Samples};

/// One stream as `resume_sdk.py` read it.
#[derive(Deserialize)]
struct Stream {
    whole: bool,
    error: Option<String>,
    ids: Vec<String>,
    roles: u32,
}

/// The sum of `name`'s series whose labels are `want`, as an integer.
fn total(m: &Samples, name: &str, want: &[(&str, &str)]) -> i64 {
    m.iter().filter(|((n, l), _)| n == name && want.iter().all(|(k, v)| label(l, k) == Some(*v))).map(|(_, v)| *v).fold(0.0, |a, b| a + b)
        as i64
}

/// `name`'s non-zero series summed by label `key`, in words.
fn by(m: &Samples, name: &str, key: &str) -> String {
    let mut got: BTreeMap<&str, i64> = BTreeMap::new();
    for ((n, l), v) in m {
        if n == name && *v != 0.0 {
            *got.entry(label(l, key).unwrap_or("?")).or_insert(0) += *v as i64;
        }
    }
    let s = got.iter().map(|(k, v)| format!("{k} {v}")).collect::<Vec<_>>().join(", ");
    if s.is_empty() {
        "none".into()
    } else {
        s
    }
}

fn streams(path: &Path) -> Result<Vec<Stream>, String> {
    super::out::read_json(path)
}

/// `bench report resume DIR FAULT_AT`.
pub(super) fn resume(dir: &Path, fault_at: &str) -> Result<(), String> {
    let faults = [
        ("kill", format!("replica A SIGKILLed {fault_at} s in")),
        ("faults", "both replicas cut 3 % of streams and end 3 % with an error event".to_string()),
        ("stall", format!("replica A stops for 4 s, {fault_at} s in (idle timeout 2 s)")),
    ];
    let (mut rows, mut m) = (String::new(), Measured::default());
    let (mut all_ok, mut said_ok, mut off_lost) = (true, Vec::new(), 0);
    for (fault, _) in &faults {
        for mode in ["on", "off"] {
            let s = streams(&dir.join(format!("{fault}-{mode}.json")))?;
            let mx = samples(&dir.join(format!("{fault}-{mode}.metrics")))?;
            let count = |f: fn(&Stream) -> bool| s.iter().filter(|x| f(x)).count();
            let (whole, raised) = (count(|x| x.whole), count(|x| x.error.is_some()));
            let (two_ids, two_roles) = (count(|x| x.ids.len() > 1), count(|x| x.roles > 1));
            let outcome = |o: &str| total(&mx, "slogate_requests_total", &[("outcome", o)]);
            let ok = outcome("ok") + outcome("length");
            let bad: Vec<String> = ["stream_error", "timeout", "upstream_error", "unavailable"]
                .iter()
                .filter(|o| outcome(o) != 0)
                .map(|o| format!("{o} {}", outcome(o)))
                .collect();
            let bad = if bad.is_empty() { "none".to_string() } else { bad.join(", ") };
            let _ = writeln!(
                rows,
                "| {fault} | {mode} | {} | **{whole}** | {raised} | {two_ids} | {two_roles} | {ok} | {bad} | {} | {} |",
                s.len(),
                by(&mx, "slogate_stream_resumes_total", "reason"),
                by(&mx, "slogate_stream_unresumed_total", "why")
            );
            if mode == "off" {
                off_lost += s.len() - whole;
                continue;
            }
            let n = s.len();
            let resumed = total(&mx, "slogate_stream_resumes_total", &[]);
            let text = format!("{whole} of {n} whole, {} spliced visibly, {resumed} resumed", two_ids + two_roles);
            m.flag(&format!("{fault}_whole"), n > 0 && whole == n && two_ids + two_roles == 0, text);
            // A stream that broke again after its continuation (the default
            // allows one) is lost by design; any other lost stream is not.
            let again = total(&mx, "slogate_stream_unresumed_total", &[("why", "attempts")]);
            let lost = n as i64 - whole as i64;
            let text = format!("{lost} lost, {again} of them broke again after their one continuation");
            m.stated(&format!("{fault}_lost_not_twice_broken"), (lost - again) as f64, text);
            all_ok = all_ok && ok == whole as i64;
            said_ok.push(format!("{fault} {ok} ok of {whole} whole"));
            let text = format!("{two_ids} with 2 ids, {two_roles} with 2 role chunks");
            m.stated(&format!("{fault}_spliced"), (two_ids + two_roles) as f64, text);
        }
    }
    m.flag("all_counted_ok", all_ok, said_ok.join(", "));
    m.stated("off_lost", off_lost as f64, format!("{off_lost} streams not whole with resume off"));
    m.write(dir)?;
    let mut f = String::from(
        "| fault | resume | streams | whole | raised | 2 ids | 2 roles | ok | other outcomes | resumed | not resumed |\n|---|---|---:|---:|---:|---:|---:|---:|---|---|---|\n",
    );
    f += &rows;
    f += "\nFaults:\n";
    for (fault, what) in &faults {
        let _ = writeln!(f, "- **{fault}**: {what}.");
    }
    write(&dir.join("report.md"), &f)
}
