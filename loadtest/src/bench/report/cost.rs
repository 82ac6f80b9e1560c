//! Report of `loadtest/bench/cost.sh`: short requests (requests/s, CPU per
//! request, p50/p99 per path), streams (CPU per event per path),
//! allocations per request and per event, instructions per request, the
//! latency each proxy adds at 32 streams a path, and the CPU each proxy
//! spends with no traffic at all.
//!
//! ```text
//! bench report cost DIR HZ STREAMS
//! ```

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use super::out::{counter, n, read_json, read_text, signed, thousands, write, Measured, Table};
use super::records::{done, interleaved, load};

const PATHS: [&str; 5] = ["direct", "haproxy-tcp", "haproxy-http", "slogate", "slogate-plain"];
const KINDS: [&str; 2] = ["embeddings", "completions"];

fn name(path: &str) -> &str {
    match path {
        "direct" => "direct to nginx",
        "haproxy-tcp" => "HAProxy `mode tcp`",
        "haproxy-http" => "HAProxy `mode http`",
        "slogate" => "**slogate** (release build)",
        "slogate-plain" => "slogate, plain `cargo build --release`",
        other => other,
    }
}

/// One wrk run of short requests.
struct Short {
    rps: f64,
    cpu_us: Option<f64>,
    p50: f64,
    p99: f64,
    bad: u64,
    err: String,
}

/// Short requests by (kind, path): their table, and the errors in it.
fn short(dir: &Path, hz: f64, f: &mut String, m: &mut Measured) -> Result<u64, String> {
    let t = Table::read(&dir.join("short.csv"))?;
    let mut short = BTreeMap::new();
    for i in 0..t.rows.len() {
        let (count, path) = (t.at(i, "requests"), t.text(i, "path"));
        let cpu_us = (path != "direct" && count > 0.0).then(|| t.at(i, "ticks") * 1e6 / hz / count);
        let x = Short {
            rps: count / t.at(i, "secs"),
            cpu_us,
            p50: t.at(i, "p50_ms"),
            p99: t.at(i, "p99_ms"),
            bad: t.at(i, "non2xx") as u64,
            err: t.text(i, "socket_errors").to_string(),
        };
        short.insert((t.text(i, "kind").to_string(), path.to_string()), x);
    }
    let mut errors = 0;
    for kind in KINDS {
        let _ = write!(f, "**{kind}**\n\n| path | requests/s | CPU per request | p50 | p99 | errors |\n|---|---:|---:|---:|---:|---:|\n");
        let get = |path: &str| short.get(&(kind.to_string(), path.to_string()));
        for path in PATHS {
            let Some(x) = get(path) else { continue };
            errors += x.bad + u64::from(!x.err.is_empty());
            let cpu = x.cpu_us.map_or("-".to_string(), |c| format!("{} µs", n(c, 1)));
            let err = if x.err.is_empty() { String::new() } else { format!(" {}", x.err) };
            let _ =
                writeln!(f, "| {} | {} | {cpu} | {} ms | {} ms | {}{err} |", name(path), thousands(x.rps), n(x.p50, 2), n(x.p99, 2), x.bad);
        }
        if let (Some(s), Some(h)) = (get("slogate"), get("haproxy-http")) {
            let cpu = |x: &Short| x.cpu_us.unwrap_or(f64::NAN);
            let p = get("slogate-plain");
            let plain = p.map_or(String::new(), |p| format!("; plain build {}x", n(cpu(p) / cpu(h), 2)));
            for (build, x, note) in [("", Some(s), plain.as_str()), ("_plain", p, "")] {
                let Some(x) = x else { continue };
                let (c, r) = (cpu(x) / cpu(h), x.rps / h.rps);
                let said = format!("{}x ({} vs {} µs{note})", n(c, 2), n(cpu(x), 1), n(cpu(h), 1));
                m.stated(&format!("{kind}_cpu_vs_haproxy{build}"), c, said);
                let said = format!("{}x ({} vs {}/s)", n(r, 2), thousands(x.rps), thousands(h.rps));
                m.stated(&format!("{kind}_rps_vs_haproxy{build}"), r, said);
            }
        }
        f.push('\n');
    }
    Ok(errors)
}

/// Streams: CPU per content event by path; the failed streams.
fn streams(dir: &Path, hz: f64, open: &str, f: &mut String, m: &mut Measured) -> Result<u64, String> {
    let _ = write!(f, "**streams** ({open} open)\n\n| path | content events | CPU | CPU per event |\n|---|---:|---:|---:|\n");
    let t = Table::read(&dir.join("streams.csv"))?;
    let (mut per_path, mut errors) = (BTreeMap::new(), 0);
    for i in 0..t.rows.len() {
        let path = t.text(i, "path");
        let r = load(&dir.join(format!("streams-{path}.json")))?;
        let events: u64 = r.records.iter().map(|x| u64::from(x.tokens)).sum();
        errors += r.records.iter().filter(|x| !done(x)).count() as u64;
        let cpu = t.at(i, "ticks") / hz;
        let per = if events > 0 { cpu * 1e6 / events as f64 } else { f64::NAN };
        per_path.insert(path.to_string(), per);
        let _ = writeln!(f, "| {} | {} | {} s | {} µs |", name(path), thousands(events as f64), n(cpu, 1), n(per, 1));
    }
    let per_event = per_path.get("slogate").copied().unwrap_or(f64::NAN);
    let mut rel = String::new();
    if let (Some(h), Some(t)) = (per_path.get("haproxy-http"), per_path.get("haproxy-tcp")) {
        rel = format!("; {}x HAProxy `mode http`'s, {}x `mode tcp`'s", n(per_event / h, 2), n(per_event / t, 2));
    }
    if let Some(p) = per_path.get("slogate-plain") {
        let _ = write!(rel, "; plain build {} µs", n(*p, 1));
    }
    m.stated("event_cpu_us", per_event, format!("{} µs{rel}", n(per_event, 1)));
    if let Some(h) = per_path.get("haproxy-http") {
        let ratio = per_event / h;
        let extra =
            per_path.get("slogate-plain").filter(|p| **p != 0.0).map_or(String::new(), |p| format!("; plain build {}x", n(p / h, 2)));
        m.stated("event_cpu_vs_haproxy", ratio, format!("{}x ({} vs {} µs{extra})", n(ratio, 2), n(per_event, 1), n(*h, 1)));
    }
    Ok(errors)
}

/// A dhat profile's allocations (blocks) and their bytes.
fn heap_totals(path: &Path) -> Result<(f64, f64), String> {
    let d: serde_json::Value = read_json(path)?;
    let pps = d["pps"].as_array().map_or(&[][..], Vec::as_slice);
    let sum = |k: &str| pps.iter().filter_map(|p| p[k].as_f64()).sum();
    Ok((sum("tbk"), sum("tb")))
}

/// Allocations per request and per streamed event: the heap-profile
/// build's difference between a short and a long run, over the difference
/// in requests or events.
fn allocations(dir: &Path, f: &mut String, m: &mut Measured) -> Result<(), String> {
    f.push_str(
        "\n**allocations** (the heap-profile build: the difference between a short and a long run, over the difference in \
         requests or content events)\n\n| | allocations | bytes allocated |\n|---|---:|---:|\n",
    );
    // A run's allocations and their bytes (its heap profile), and the
    // requests wrk counted.
    let allocs = |name: &str| -> Result<[f64; 3], String> {
        let (blocks, bytes) = heap_totals(&dir.join(format!("{name}.heap.json")))?;
        let wrk = read_text(&dir.join(format!("{name}.wrk")))?;
        let requests = wrk.lines().find_map(|l| l.split(" requests in").next().filter(|_| l.contains(" requests in"))?.trim().parse().ok());
        Ok([blocks, bytes, requests.ok_or_else(|| format!("{name}.wrk: no requests counted"))?])
    };
    for kind in KINDS {
        let ([k1, b1, r1], [k2, b2, r2]) = (allocs(&format!("heap-{kind}-short"))?, allocs(&format!("heap-{kind}-long"))?);
        let (per, bytes) = ((k2 - k1) / (r2 - r1), (b2 - b1) / (r2 - r1));
        m.stated(&format!("{kind}_allocs"), per, format!("{} ({} bytes)", n(per, 1), thousands(bytes)));
        let _ = writeln!(f, "| per {kind} request | {} | {} |", n(per, 1), thousands(bytes));
    }
    let ((k1, b1), (k2, b2)) =
        (heap_totals(&dir.join("heap-streams-short.heap.json"))?, heap_totals(&dir.join("heap-streams-long.heap.json"))?);
    let events = |len: &str| {
        let p = dir.join(format!("heap-streams-{len}.metrics"));
        counter(&p, "slogate_inter_token_latency_seconds_count") + counter(&p, "slogate_time_to_first_token_seconds_count")
    };
    let (e1, e2) = (events("short"), events("long"));
    let (per, bytes) = ((k2 - k1) / (e2 - e1), (b2 - b1) / (e2 - e1));
    m.stated("event_allocs", per, format!("{} ({} bytes)", n(per, 2), thousands(bytes)));
    let _ = writeln!(
        f,
        "| per streamed event (a stream's own start and end spread over its 100 events) | {} | {} |",
        n(per, 2),
        thousands(bytes)
    );
    Ok(())
}

/// A callgrind dump's totals, by event (`Ir`, `I1mr`, `D1mr`, ...).
fn callgrind(path: &Path) -> Result<BTreeMap<String, f64>, String> {
    let (mut events, mut totals) = (Vec::new(), Vec::new());
    for l in read_text(path)?.lines() {
        if let Some(e) = l.strip_prefix("events:") {
            events = e.split_whitespace().map(String::from).collect();
        } else if let Some(t) = l.strip_prefix("summary:").or_else(|| l.strip_prefix("totals:")) {
            totals = t.split_whitespace().map(|v| v.parse().unwrap_or(f64::NAN)).collect();
        }
    }
    Ok(events.into_iter().zip(totals).collect())
}

/// Instructions per request under callgrind.
fn instructions(dir: &Path, f: &mut String, m: &mut Measured) -> Result<(), String> {
    f.push_str(
        "\n**instructions per request** (callgrind, with its simulation of this machine's first-level caches; \
         wrk at 8 connections)\n\n| kind | path | requests | instructions | I1 misses | D1 misses |\n|---|---|---:|---:|---:|---:|\n",
    );
    let t = Table::read(&dir.join("instructions.csv"))?;
    let mut cg = BTreeMap::new();
    for i in 0..t.rows.len() {
        let (c, count) = (callgrind(Path::new(t.text(i, "file")))?, t.at(i, "requests"));
        let x: BTreeMap<String, f64> = c.into_iter().map(|(k, v)| (k, v / count)).collect();
        let get = |k: &str| x.get(k).copied().unwrap_or(0.0);
        let ir = x.get("Ir").copied().unwrap_or(f64::NAN);
        let (kind, proxy) = (t.text(i, "kind"), t.text(i, "proxy"));
        let d1 = get("D1mr") + get("D1mw");
        let _ = writeln!(
            f,
            "| {kind} | {} | {} | {} | {} | {} |",
            name(proxy),
            thousands(count),
            thousands(ir),
            thousands(get("I1mr")),
            thousands(d1)
        );
        cg.insert((kind.to_string(), proxy.to_string()), ir);
    }
    for kind in KINDS {
        let h = cg.get(&(kind.to_string(), "haproxy-http".to_string()));
        for (path, key) in [("slogate", format!("{kind}_instructions")), ("slogate-plain", format!("{kind}_instructions_plain"))] {
            let Some(s) = cg.get(&(kind.to_string(), path.to_string())) else { continue };
            let rel = h.map_or(String::new(), |h| format!("; {}x HAProxy `mode http`'s", n(s / h, 2)));
            m.stated(&key, *s, format!("{}{rel}", thousands(*s)));
        }
    }
    Ok(())
}

/// The latency each proxy adds at 32 streams a path, over the direct path
/// of its own load; the failed requests.
fn latency(dir: &Path, f: &mut String, m: &mut Measured) -> Result<u64, String> {
    let lat = |n: &str| load(&dir.join(format!("lat-{n}.json")));
    let (ab, http, tcp, aa) = (lat("ab")?, lat("haproxy-http")?, lat("haproxy-tcp")?, lat("aa")?);
    let rows = [
        ("slogate", interleaved(&ab, 0, 5.0)),
        ("direct", interleaved(&ab, 1, 5.0)),
        ("HAProxy `mode http`", interleaved(&http, 0, 5.0)),
        ("direct", interleaved(&http, 1, 5.0)),
        ("HAProxy `mode tcp`", interleaved(&tcp, 0, 5.0)),
        ("direct", interleaved(&tcp, 1, 5.0)),
        ("A/A: direct", interleaved(&aa, 0, 5.0)),
        ("A/A: direct again", interleaved(&aa, 1, 5.0)),
    ];
    f.push_str(
        "\n**latency at 32 streams a path** (slogate on its defaults, then HAProxy in its place, then both paths direct: \
         one load each, its requests taking the two paths in turn; the path's share is the client's TTFT minus the engine's, \
         the ITL shift the client's ITL p99 minus the replica's)\n\n\
         | path | requests | failed | TTFT p50 | path's share of TTFT p50 | ITL p99 | ITL p99 shift |\n|---|---:|---:|---:|---:|---:|---:|\n",
    );
    let mut errors = 0;
    for (label, x) in &rows {
        errors += x.bad as u64;
        let _ = writeln!(
            f,
            "| {label} | {} | {} | {} ms | {} ms | {} ms | {} ms |",
            thousands(x.n as f64),
            x.bad,
            n(x.ttft50, 3),
            n(x.path50, 3),
            n(x.itl99, 3),
            signed(x.shift99, 3)
        );
    }
    // What each proxy adds over the direct path of its own load: (TTFT p50 share, ITL p99 shift).
    let added = [0, 2, 4, 6].map(|i| (rows[i].1.path50 - rows[i + 1].1.path50, rows[i].1.shift99 - rows[i + 1].1.shift99));
    let [(ttft, itl), (h_ttft, h_itl), (t_ttft, t_itl), (aa_ttft, aa_itl)] = added.map(|(a, b)| (signed(a, 3), signed(b, 3)));
    let _ = writeln!(
        f,
        "\nAdded TTFT p50: slogate {ttft} ms, HAProxy `mode http` {h_ttft}, `mode tcp` {t_ttft} (A/A {aa_ttft}); added ITL p99: {itl}, {h_itl}, {t_itl} ms (A/A {aa_itl})."
    );
    m.stated(
        "added_ttft_p50_ms",
        added[0].0,
        format!("{ttft} ms; HAProxy `mode http` {h_ttft}, `mode tcp` {t_ttft} (A/A control {aa_ttft})"),
    );
    let over = added[0].0 - added[1].0;
    let said = format!("{} ms (slogate {ttft}, HAProxy `mode http` {h_ttft}; `mode tcp` {t_ttft}, A/A control {aa_ttft})", signed(over, 3));
    m.stated("added_ttft_p50_over_haproxy_ms", over, said);
    m.stated("added_itl_p99_ms", added[0].1, format!("{itl} ms; HAProxy `mode http` {h_itl}, `mode tcp` {t_itl} (A/A control {aa_itl})"));
    Ok(errors)
}

/// Idle: each path's CPU with no traffic, as a share of one core.
fn idle(dir: &Path, hz: f64, f: &mut String, m: &mut Measured) -> Result<(), String> {
    let t = Table::read(&dir.join("idle.csv"))?;
    let mut pct = BTreeMap::new();
    if !t.rows.is_empty() {
        let _ = write!(
            f,
            "**idle** (no traffic for {} s, one simulated replica behind; CPU in clock ticks of {} ms)\n\n| path | CPU | share of a core |\n|---|---:|---:|\n",
            n(t.at(0, "secs"), 0),
            n(1000.0 / hz, 0)
        );
    }
    for i in 0..t.rows.len() {
        let (path, ticks, secs) = (t.text(i, "path"), t.at(i, "ticks"), t.at(i, "secs"));
        let share = ticks / hz / secs * 100.0;
        pct.insert(path.to_string(), share);
        let _ = writeln!(f, "| {} | {} ms | {} % |", name(path), n(ticks * 1000.0 / hz, 0), n(share, 3));
    }
    f.push('\n');
    let said = |x: f64| format!("{} % of a core", n(x, 3));
    if let Some(x) = pct.get("slogate") {
        let others = ["slogate-plain", "haproxy-http"]
            .iter()
            .filter_map(|p| pct.get(*p).map(|v| format!("{} {}", name(p), said(*v))))
            .collect::<Vec<_>>()
            .join(", ");
        m.stated("idle_cpu_pct", *x, format!("{} ({others})", said(*x)));
    }
    if let Some(x) = pct.get("slogate-plain") {
        m.stated("idle_cpu_pct_plain", *x, said(*x));
    }
    Ok(())
}

/// `bench report cost DIR HZ STREAMS`.
pub(super) fn cost(dir: &Path, hz: f64, streams_open: &str) -> Result<(), String> {
    let (mut f, mut m) = (String::new(), Measured::default());
    let mut errors = short(dir, hz, &mut f, &mut m)?;
    errors += streams(dir, hz, streams_open, &mut f, &mut m)?;
    allocations(dir, &mut f, &mut m)?;
    instructions(dir, &mut f, &mut m)?;
    errors += latency(dir, &mut f, &mut m)?;
    idle(dir, hz, &mut f, &mut m)?;
    m.stated("errors", errors as f64, errors.to_string());
    m.write(dir)?;
    write(&dir.join("report.md"), &f)
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_callgrind_dump_gives_its_totals_by_event() {
        let dir = tempfile::tempdir().expect("a folder");
        let p = dir.path().join("cg.out");
        std::fs::write(&p, "version: 1\nevents: Ir I1mr D1mr D1mw\nfn=main\n1 2 3 4 5\ntotals: 1000 20 30 40\n").expect("write");
        let t = super::callgrind(&p).expect("read");
        assert_eq!(t["Ir"], 1000.0);
        assert_eq!(t["D1mw"], 40.0);
        assert_eq!(t.len(), 4);
    }

    #[test]
    fn idle_cpu_is_each_paths_ticks_over_the_window_as_a_share_of_a_core() {
        let dir = tempfile::tempdir().expect("a folder");
        std::fs::write(dir.path().join("idle.csv"), "path,ticks,secs\nslogate,3,60\nslogate-plain,6,60\nhaproxy-http,0,60\n")
            .expect("write");
        let (mut f, mut m) = (String::new(), super::Measured::default());
        super::idle(dir.path(), 100.0, &mut f, &mut m).expect("report");
        m.write(dir.path()).expect("measured.json");
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.path().join("measured.json")).expect("read")).expect("json");
        let got = |k: &str| v[k]["value"].as_f64().expect(k);
        assert!((got("idle_cpu_pct") - 0.05).abs() < 1e-9, "3 ticks of 10 ms over 60 s");
        assert!((got("idle_cpu_pct_plain") - 0.1).abs() < 1e-9);
        assert!(v["idle_cpu_pct"]["text"].as_str().expect("text").contains("HAProxy `mode http` 0.000 %"), "{v}");
        assert!(f.contains("| **slogate** (release build) | 30 ms | 0.050 % |"), "{f}");
    }
}
