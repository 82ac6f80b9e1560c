//! Report of `loadtest/bench/litellm.sh`: slogate and LiteLLM's proxy,
//! each interleaved with the direct path (latency) and side by side with
//! it (throughput); what reaches the client; memory.
//!
//! ```text
//! bench report litellm DIR HZ LITELLM_VERSION
//! ```

use std::collections::BTreeSet;
use std::path::Path;

use serde_json::Value;

use super::out::{n, read_text, signed, write, Measured};
use super::paths::ints;
use super::records::{done, load, pct_floor as pct, pct_pairs};
use crate::loadgen::RunResult;

const GWS: [&str; 2] = ["slogate", "litellm"];
/// The client statistics leave out the first seconds of each load.
const WARM: f64 = 5.0;

/// One path of an interleaved run, its requests after the warm-up.
struct Side {
    n: usize,
    bad: usize,
    ttft50: f64,
    ttft99: f64,
    itl99: f64,
}

fn side(r: &RunResult, target: usize) -> Side {
    let recs: Vec<_> = r.records.iter().filter(|x| x.start_s >= WARM && x.target == Some(target)).collect();
    let t: Vec<f64> = recs.iter().filter(|x| done(x)).filter_map(|x| x.ttft_ms).collect();
    let gaps = r.itl_by_target.client_us.get(&target.to_string()).map_or(&[][..], Vec::as_slice);
    Side {
        n: recs.len(),
        bad: recs.iter().filter(|x| !done(x)).count(),
        ttft50: pct(&t, 0.5),
        ttft99: pct(&t, 0.99),
        itl99: pct_pairs(gaps, 0.99) / 1000.0,
    }
}

/// The gateway's CPU per request it served (us) and its cores' busy
/// shares (%) over a load.
fn extra(dir: &Path, name: &str, served: usize, hz: f64) -> Result<(f64, f64, f64), String> {
    let ticks = ints(&dir.join(format!("{name}.cpu")))?.first().copied().unwrap_or(0) as f64;
    let cores: Vec<f64> =
        read_text(&dir.join(format!("{name}.cores")))?.split_whitespace().map(|v| v.parse::<f64>().unwrap_or(f64::NAN) * 100.0).collect();
    Ok((ticks / hz * 1e6 / served.max(1) as f64, cores.first().copied().unwrap_or(f64::NAN), cores.get(1).copied().unwrap_or(f64::NAN)))
}

/// A stream's bytes with what differs per request masked: `"id"`'s text,
/// and `created` and the simulator's stamps' numbers.
fn masked(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find('"') {
        out.push_str(&rest[..at]);
        rest = &rest[at..];
        if let Some(after) = rest.strip_prefix("\"id\":\"").and_then(|a| a.find('"').map(|end| &a[end + 1..])) {
            out.push_str("\"id\":\"*\"");
            rest = after;
            continue;
        }
        let numbered = ["created", "sim_rx_ns", "sim_t_ns"].into_iter().find_map(|k| {
            let after = rest.strip_prefix(&format!("\"{k}\":"))?;
            let digits = after.len() - after.trim_start_matches(|c: char| c.is_ascii_digit()).len();
            (digits > 0).then(|| (k, &after[digits..]))
        });
        if let Some((k, after)) = numbered {
            out.push_str(&format!("\"{k}\":0"));
            rest = after;
            continue;
        }
        out.push('"');
        rest = &rest[1..];
    }
    out.push_str(rest);
    out
}

/// Each event's JSON fields as dotted paths (with their null-ness).
fn fields(text: &str) -> Vec<BTreeSet<String>> {
    fn walk(v: &Value, at: &str, acc: &mut BTreeSet<String>) {
        let key = |k: &str| if at.is_empty() { k.to_string() } else { format!("{at}.{k}") };
        match v {
            Value::Object(o) => o.iter().for_each(|(k, x)| walk(x, &key(k), acc)),
            Value::Array(a) => a.iter().for_each(|x| walk(x, &format!("{at}[]"), acc)),
            Value::Null => {
                acc.insert(format!("{at} (null)"));
            }
            _ => {
                acc.insert(at.to_string());
            }
        }
    }
    let events = text.lines().filter_map(|l| l.strip_prefix("data: "));
    events
        .map(|e| {
            let mut acc = BTreeSet::new();
            match serde_json::from_str::<Value>(e) {
                Ok(v) if e.starts_with('{') => walk(&v, "", &mut acc),
                _ => {
                    acc.insert(e.to_string());
                }
            }
            acc
        })
        .collect()
}

/// How the client's stream differs from the replica's, in fields.
fn changes(a: &str, b: &str) -> String {
    let (fa, fb) = (fields(a), fields(b));
    let all = |f: &[BTreeSet<String>]| f.iter().flatten().cloned().collect::<BTreeSet<_>>();
    let (sa, sb) = (all(&fa), all(&fb));
    let list = |s: Vec<&String>| s.iter().map(|x| format!("`{x}`")).collect::<Vec<_>>().join(", ");
    let mut said = vec![format!("{} events from the replica, {} to the client.", fa.len(), fb.len())];
    let gone: Vec<&String> = sa.difference(&sb).collect();
    if !gone.is_empty() {
        said.push(format!("Fields the client never sees: {}.", list(gone)));
    }
    let new: Vec<&String> = sb.difference(&sa).collect();
    if !new.is_empty() {
        said.push(format!("Fields the replica never sent: {}.", list(new)));
    }
    said.join(" ")
}

/// A load's completed requests a second of stream `cls` after the warm-up,
/// and its failures.
fn rps(r: &RunResult, cls: &str) -> (f64, usize) {
    let recs: Vec<_> = r.records.iter().filter(|x| x.start_s >= WARM && x.stream == cls).collect();
    (recs.iter().filter(|x| done(x)).count() as f64 / (r.elapsed_s - WARM), recs.iter().filter(|x| !done(x)).count())
}

/// A measure by gateway and streams per path.
type ByLoad<'a, T> = Vec<((&'a str, u32), T)>;

/// What one latency load measured of a gateway: added TTFT p50 and p99,
/// added ITL p99, CPU per request, failures.
struct Added {
    p50: f64,
    p99: f64,
    itl99: f64,
    cpu: f64,
    bad: usize,
}

/// A gateway's name in the report.
struct Names<'a>(&'a str);

impl Names<'_> {
    fn of(&self, gw: &str) -> String {
        if gw == "slogate" {
            "slogate".to_string()
        } else {
            format!("LiteLLM {}", self.0)
        }
    }
}

/// `bench report litellm DIR HZ LITELLM_VERSION`.
pub(super) fn litellm(dir: &Path, hz: f64, version: &str) -> Result<(), String> {
    let names = Names(version);
    let mut m = Measured::default();
    let mut out = Vec::new();
    fidelity(dir, &names, &mut out, &mut m)?;
    let lat = latency(dir, hz, &names, &mut out)?;
    let tput = throughput(dir, hz, &names, &mut out)?;
    let rss = |kind: &str, gw: &str| -> Result<f64, String> {
        Ok(ints(&dir.join(format!("{kind}-{gw}.rss")))?.first().copied().unwrap_or(0) as f64)
    };
    let (idle, peak) = ([rss("idle", GWS[0])?, rss("idle", GWS[1])?], [rss("peak", GWS[0])?, rss("peak", GWS[1])?]);
    out.extend(["", "| gateway | RSS idle | peak RSS over the latency loads |", "|---|---:|---:|"].map(String::from));
    for (i, gw) in GWS.iter().enumerate() {
        out.push(format!("| {} | {} MB | {} MB |", names.of(gw), n(idle[i] / 1024.0, 1), n(peak[i] / 1024.0, 1)));
    }
    let at = |gw: &str, c: u32| lat.iter().find(|(k, _)| *k == (gw, c)).map(|(_, x)| x);
    let tput_at = |gw: &str, c: u32| tput.iter().find(|(k, _)| *k == (gw, c)).map_or(f64::NAN, |(_, x)| *x);
    let (Some(s), Some(l)) = (at("slogate", 200), at("litellm", 200)) else { return Err("no latency load at 200".into()) };
    m.stated("slogate_added_ttft_p50_ms_200", s.p50, format!("{} ms (LiteLLM {} ms)", signed(s.p50, 3), signed(l.p50, 2)));
    let pairs: Vec<(u32, f64, f64)> =
        [8, 32, 200].iter().filter_map(|&c| Some((c, at("slogate", c)?.p50, at("litellm", c)?.p50))).collect();
    let below = pairs.iter().all(|(_, s, l)| s < l);
    let said = pairs.iter().map(|(c, s, l)| format!("{c}: {} vs {} ms", signed(*s, 3), signed(*l, 2))).collect::<Vec<_>>().join(", ");
    m.flag("slogate_below_litellm_ttft", below, said);
    m.stated("cpu_litellm_over_slogate_200", l.cpu / s.cpu, format!("{}x ({} vs {} us)", n(l.cpu / s.cpu, 0), n(l.cpu, 0), n(s.cpu, 0)));
    let (st, lt) = (tput_at("slogate", 256), tput_at("litellm", 256));
    m.stated("slogate_tput_share_256", st, format!("{} (LiteLLM {})", n(st, 3), n(lt, 3)));
    let times = idle[1] / idle[0];
    m.stated(
        "idle_rss_litellm_over_slogate",
        times,
        format!("{}x ({} vs {} MB)", n(times, 0), n(idle[1] / 1024.0, 0), n(idle[0] / 1024.0, 1)),
    );
    m.plain("slogate_failed", [8, 32, 200].iter().filter_map(|&c| at("slogate", c)).map(|x| x.bad).sum::<usize>() as f64);
    m.write(dir)?;
    write(&dir.join("report.md"), &(out.join("\n") + "\n"))
}

/// What reaches the client by each path, against the replica's own bytes.
fn fidelity(dir: &Path, names: &Names, out: &mut Vec<String>, m: &mut Measured) -> Result<(), String> {
    let direct =
        masked(&String::from_utf8_lossy(&std::fs::read(dir.join("bytes-direct.txt")).map_err(|e| format!("bytes-direct.txt: {e}"))?));
    out.extend([
        "**What reaches the client**: one 4-token chat stream by each path, compared with the replica's own (its `id` and `created` masked, as they differ per request):".to_string(),
        String::new(),
    ]);
    for gw in GWS {
        let got = masked(&String::from_utf8_lossy(
            &std::fs::read(dir.join(format!("bytes-{gw}.txt"))).map_err(|e| format!("bytes-{gw}.txt: {e}"))?,
        ));
        let same = got == direct;
        if gw == "slogate" {
            m.flag("slogate_bytes_unchanged", same, if same { "unchanged".to_string() } else { changes(&direct, &got) });
        }
        let (len, events) = (got.chars().count(), got.matches("data: ").count());
        out.push(if same {
            format!("- {}: the replica's bytes, unchanged ({len} bytes, {events} events).", names.of(gw))
        } else {
            let from = direct.chars().count();
            format!(
                "- {}: rewritten ({from} bytes from the replica, {len} to the client, {events} events). {}",
                names.of(gw),
                changes(&direct, &got)
            )
        });
    }
    Ok(())
}

/// The latency loads: each gateway interleaved with the direct path.
fn latency<'a>(dir: &Path, hz: f64, names: &Names, out: &mut Vec<String>) -> Result<ByLoad<'a, Added>, String> {
    out.extend(LATENCY_HEAD.map(String::from));
    let mut lat: ByLoad<Added> = Vec::new();
    for gw in GWS {
        for c in [8, 32, 200] {
            let name = format!("lat-{gw}-{c}");
            let r = load(&dir.join(format!("{name}.json")))?;
            let (g, d) = (side(&r, 0), side(&r, 1));
            let (cpu, c0, c1) = extra(dir, &name, r.records.iter().filter(|x| x.target == Some(0)).count(), hz)?;
            out.push(format!(
                "| {} | {c} | {} / {} | {} / {} | {} / {} | {} / {} | {} / {} | {} us | {} % / {} % |",
                names.of(gw),
                g.n,
                d.n,
                g.bad,
                d.bad,
                n(g.ttft50, 2),
                n(d.ttft50, 2),
                n(g.ttft99, 2),
                n(d.ttft99, 2),
                n(g.itl99, 3),
                n(d.itl99, 3),
                n(cpu, 0),
                n(c0, 0),
                n(c1, 0)
            ));
            let added = Added { p50: g.ttft50 - d.ttft50, p99: g.ttft99 - d.ttft99, itl99: g.itl99 - d.itl99, cpu, bad: g.bad };
            lat.push(((gw, c), added));
        }
    }
    out.extend(
        ["", "| gateway | streams per path | added TTFT p50 ms | added TTFT p99 ms | added ITL p99 ms |", "|---|---:|---:|---:|---:|"]
            .map(String::from),
    );
    for ((gw, c), x) in &lat {
        out.push(format!("| {} | {c} | {} | {} | {} |", names.of(gw), signed(x.p50, 3), signed(x.p99, 3), signed(x.itl99, 3)));
    }
    Ok(lat)
}

/// The throughput loads: each gateway's group beside the direct group.
fn throughput<'a>(dir: &Path, hz: f64, names: &Names, out: &mut Vec<String>) -> Result<ByLoad<'a, f64>, String> {
    out.extend(THROUGHPUT_HEAD.map(String::from));
    let mut tput: ByLoad<f64> = Vec::new();
    for gw in GWS {
        for c in [32, 256] {
            let name = format!("tput-{gw}-{c}");
            let r = load(&dir.join(format!("{name}.json")))?;
            let ((g, gbad), (d, dbad)) = (rps(&r, "gateway"), rps(&r, "direct"));
            let (cpu, c0, c1) = extra(dir, &name, r.records.iter().filter(|x| x.stream == "gateway").count(), hz)?;
            let ratio = if d != 0.0 { g / d } else { f64::NAN };
            tput.push(((gw, c), ratio));
            out.push(format!(
                "| {} | {c} | {} | {} | {} | {gbad} / {dbad} | {} us | {} % / {} % |",
                names.of(gw),
                n(d, 0),
                n(g, 0),
                n(ratio, 3),
                n(cpu, 0),
                n(c0, 0),
                n(c1, 0)
            ));
        }
    }
    Ok(tput)
}

const LATENCY_HEAD: [&str; 5] = [
    "",
    "**Added latency, interleaved with the direct path** (the gateway's path minus the direct path in the same load):",
    "",
    "| gateway | streams per path | requests (gateway / direct) | failed (gateway / direct) | TTFT p50 ms (gateway / direct) | TTFT p99 ms | ITL p99 ms | gateway CPU per request | CPU 0 / CPU 1 busy |",
    "|---|---:|---|---|---|---|---|---:|---|",
];

const THROUGHPUT_HEAD: [&str; 5] = [
    "",
    "**Streaming throughput, side by side**: N closed-loop streams through the gateway and N straight to the replica at the same time; the ratio is the gateway group's completed requests per second over the direct group's.",
    "",
    "| gateway | streams per path | direct req/s | gateway req/s | ratio | failed (gateway / direct) | gateway CPU per request | CPU 0 / CPU 1 busy |",
    "|---|---:|---:|---:|---:|---|---:|---|",
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_differs_per_request_is_masked() {
        let s = r#"data: {"id":"chatcmpl-12","created":1700000000,"x":{"sim_t_ns":55,"id":"z"},"created_by":"me"}"#;
        assert_eq!(masked(s), r#"data: {"id":"*","created":0,"x":{"sim_t_ns":0,"id":"*"},"created_by":"me"}"#);
    }

    #[test]
    fn fields_gone_and_new_are_named() {
        let a = "data: {\"a\":1,\"b\":{\"c\":null}}\n\ndata: [DONE]\n";
        let b = "data: {\"a\":1,\"d\":[{\"e\":2}]}\n\ndata: [DONE]\n";
        assert_eq!(
            changes(a, b),
            "2 events from the replica, 2 to the client. Fields the client never sees: `b.c (null)`. Fields the replica never sent: `d[].e`."
        );
    }
}
