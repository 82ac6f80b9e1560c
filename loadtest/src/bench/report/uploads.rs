//! Report of `loadtest/bench/hol_uploads.sh`: open streams' path ITL p99
//! in each part, what large request bodies (JSON, and uploads as forms)
//! through the gateway add over the same bodies sent straight to the
//! replica, and how the large requests fared (from h2load, or from loadgen
//! in the `lg-` parts).
//!
//! ```text
//! bench report uploads DIR HZ JSON_RATE FORM_RATE
//! ```

use std::fmt::Write as _;
use std::path::Path;

use super::out::{n, signed, write, Measured};
use super::paths::ints;
use super::records::{done, load, pct_pairs};

const PARTS: [&str; 9] = [
    "quiet",
    "json-direct",
    "json-gateway",
    "form-direct",
    "form-gateway",
    "lg-json-direct",
    "lg-json-gateway",
    "lg-form-direct",
    "lg-form-gateway",
];

/// The large requests of a part: (succeeded, sent, answered 2xx).
type Bulk = (u64, u64, u64);

/// The number after `label` in `text` (`"... 12 succeeded"` read backwards:
/// the word before it).
fn before_word(text: &str, word: &str) -> Option<u64> {
    text.split(',').find_map(|part| part.trim().strip_suffix(word)?.trim().rsplit(' ').next()?.parse().ok())
}

/// h2load's summary lines: `requests: N total, N started, N done, N
/// succeeded, ...` and `status codes: N 2xx, ...`.
fn h2load(text: &str) -> Bulk {
    let line = |prefix: &str| text.lines().find_map(|l| l.trim().strip_prefix(prefix).map(str::to_string));
    let Some(requests) = line("requests: ") else { return (0, 0, 0) };
    let (Some(total), Some(ok)) = (before_word(&requests, "total"), before_word(&requests, "succeeded")) else { return (0, 0, 0) };
    let ok2xx = line("status codes: ").and_then(|l| before_word(&l, "2xx")).unwrap_or(0);
    (ok, total, ok2xx)
}

/// The part's large requests; none for a part without them.
fn bulk(dir: &Path, part: &str) -> Result<Option<Bulk>, String> {
    let lg = dir.join(format!("{part}.bulk.json"));
    if lg.exists() {
        let r = load(&lg)?;
        let ok = r.records.iter().filter(|x| (200..300).contains(&x.status) && done(x)).count() as u64;
        return Ok(Some((ok, r.records.len() as u64, ok)));
    }
    Ok(std::fs::read_to_string(dir.join(format!("{part}.h2load"))).ok().map(|t| h2load(&t)))
}

struct Part {
    done: usize,
    failed: usize,
    path50: f64,
    path99: f64,
    client99: f64,
    cpu_s: f64,
    bulk: Option<Bulk>,
}

fn part(dir: &Path, name: &str, hz: f64) -> Result<Part, String> {
    let r = load(&dir.join(format!("{name}.json")))?;
    let path = r.itl_path_us.get("chat").map_or(&[][..], Vec::as_slice);
    let client = r.itl_us.get("chat").map_or(&[][..], Vec::as_slice);
    let cpu = ints(&dir.join(format!("{name}.cpu")))?.first().copied().unwrap_or(0);
    Ok(Part {
        done: r.records.iter().filter(|x| done(x)).count(),
        failed: r.records.iter().filter(|x| !done(x)).count(),
        path50: pct_pairs(path, 0.5) / 1000.0,
        path99: pct_pairs(path, 0.99) / 1000.0,
        client99: pct_pairs(client, 0.99) / 1000.0,
        cpu_s: cpu as f64 / hz,
        bulk: bulk(dir, name)?,
    })
}

/// `bench report uploads DIR HZ JSON_RATE FORM_RATE`.
pub(super) fn uploads(dir: &Path, hz: f64, json_rate: &str, form_rate: &str) -> Result<(), String> {
    let parts = PARTS.iter().map(|p| part(dir, p, hz)).collect::<Result<Vec<_>, _>>()?;
    let p = |name: &str| &parts[PARTS.iter().position(|x| *x == name).unwrap_or(0)];
    let mut m = Measured::default();
    for kind in ["json", "form", "lg-json", "lg-form"] {
        let (g, d) = (p(&format!("{kind}-gateway")).path99, p(&format!("{kind}-direct")).path99);
        let key = format!("{}_added_ms", kind.replace('-', "_"));
        m.stated(&key, g - d, format!("{} ms ({} vs {})", signed(g - d, 3), n(g, 3), n(d, 3)));
    }
    let failed: usize = parts.iter().map(|x| x.failed).sum();
    let bulk_bad: u64 = parts.iter().filter_map(|x| x.bulk).map(|b| b.1 - b.2).sum();
    let said = format!("{failed} streams failed, {bulk_bad} large requests not answered 2xx");
    m.flag("all_answered", failed == 0 && bulk_bad == 0, said);
    m.write(dir)?;
    let mut f = format!(
        "Large requests: {json_rate} JSON bodies a second (json parts), {form_rate} uploads a second (form parts); \
         from h2load, or from loadgen in the lg- parts.\n\n\
         | part | streams done | failed | path ITL p50 ms | path ITL p99 ms | client ITL p99 ms | large requests (2xx / sent) | gateway CPU s |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|\n"
    );
    for (name, x) in PARTS.iter().zip(&parts) {
        let bulk = x.bulk.map_or("-".to_string(), |b| format!("{} / {}", b.2, b.1));
        let (p50, p99, c99, cpu) = (n(x.path50, 3), n(x.path99, 3), n(x.client99, 2), n(x.cpu_s, 1));
        let _ = writeln!(f, "| {name} | {} | {} | {p50} | {p99} | {c99} | {bulk} | {cpu} |", x.done, x.failed);
    }
    let quiet = p("quiet").path99;
    let over = |name: &str| signed(p(name).path99 - quiet, 3);
    let _ = writeln!(
        f,
        "\nFor scale: the bodies sent around the gateway (direct minus quiet: h2load writing them and nginx reading them on \
         the same two cores) add {} ms (json) and {} ms (form) to the path's ITL p99 from h2load, {} ms and {} ms from loadgen.",
        over("json-direct"),
        over("form-direct"),
        over("lg-json-direct"),
        over("lg-form-direct")
    );
    write(&dir.join("report.md"), &f)
}

#[cfg(test)]
mod tests {
    #[test]
    fn h2load_summary_is_read() {
        let text =
            "finished in 10.00s, 5.00 req/s\nrequests: 50 total, 50 started, 50 done, 48 succeeded, 2 failed, 0 errored, 0 timeout\n\
                    status codes: 48 2xx, 0 3xx, 2 4xx, 0 5xx\n";
        assert_eq!(super::h2load(text), (48, 50, 48));
        assert_eq!(super::h2load("nothing"), (0, 0, 0));
    }
}
