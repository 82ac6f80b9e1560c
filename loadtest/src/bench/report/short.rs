//! Report of `loadtest/bench/short.sh`: embeddings requests' latency
//! through the gateway against straight to a replica, while chat streams
//! overload the replicas' slots, and what chat waited in the same runs.
//!
//! ```text
//! bench report short DIR C
//! ```

use std::fmt::Write as _;
use std::path::Path;

use super::out::{n, percent, signed, write, Measured};
use super::records::{done, load, pct_floor, window};
use crate::loadgen::Record;

struct Side {
    emb: usize,
    emb_failed: usize,
    emb50: f64,
    emb99: f64,
    emb_queue99: f64,
    chat: usize,
    chat_refused: f64,
    chat_queue50: f64,
    chat_queue99: f64,
}

fn summary(dir: &Path, name: &str) -> Result<Side, String> {
    let r = load(&dir.join(format!("{name}.json")))?;
    let (warmup, _) = window(&r);
    let recs: Vec<&Record> = r.records.iter().filter(|x| x.start_s >= warmup).collect();
    let of = |stream: &str, served: bool| -> Vec<&Record> {
        recs.iter().copied().filter(|x| x.stream == stream && (!served || done(x))).collect()
    };
    let (emb, chat, emb_ok, chat_ok) = (of("emb", false), of("chat", false), of("emb", true), of("chat", true));
    let e2e: Vec<f64> = emb_ok.iter().map(|x| x.e2e_ms).collect();
    let queue = |v: &[&Record]| v.iter().map(|x| x.queue_ms.unwrap_or(0.0)).collect::<Vec<f64>>();
    let chat_queue = queue(&chat_ok);
    Ok(Side {
        emb: emb.len(),
        emb_failed: emb.len() - emb_ok.len(),
        emb50: pct_floor(&e2e, 0.5),
        emb99: pct_floor(&e2e, 0.99),
        emb_queue99: pct_floor(&queue(&emb_ok), 0.99),
        chat: chat.len(),
        chat_refused: chat.iter().filter(|x| x.outcome == "rejected").count() as f64 / chat.len().max(1) as f64,
        chat_queue50: pct_floor(&chat_queue, 0.5),
        chat_queue99: pct_floor(&chat_queue, 0.99),
    })
}

/// `bench report short DIR C`.
pub(super) fn short(dir: &Path, c: f64) -> Result<(), String> {
    let (g, x) = (summary(dir, "gateway")?, summary(dir, "direct")?);
    let (added99, added50) = (g.emb99 - x.emb99, g.emb50 - x.emb50);
    let mut m = Measured::default();
    m.stated("emb_p99_added_ms", added99, format!("{} ms", signed(added99, 2)));
    m.stated("emb_queue_p99_ms", g.emb_queue99, format!("{} ms", n(g.emb_queue99, 2)));
    m.plain("emb_failed", g.emb_failed as f64);
    m.write(dir)?;
    let mut f = format!(
        "Capacity C = {} req/s. Added by the gateway to the embeddings: {} ms at p50, {} ms at p99. In the same run chat, admitted as streams are, waited up to {} ms in the queue (p99 of those admitted) and {} % of it was refused: what an embeddings request would meet without seats of its own.\n\n",
        n(c, 2),
        signed(added50, 2),
        signed(added99, 2),
        n(g.chat_queue99, 0),
        percent(g.chat_refused, 1)
    );
    f += "| path | embeddings | failed | e2e p50 ms | e2e p99 ms | queue p99 ms | chat requests | chat refused | chat queue p50 ms | chat queue p99 ms |\n";
    f += "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n";
    for (name, s) in [("gateway", &g), ("direct", &x)] {
        let _ = writeln!(
            f,
            "| {name} | {} | {} | {} | {} | {} | {} | {} % | {} | {} |",
            s.emb,
            s.emb_failed,
            n(s.emb50, 2),
            n(s.emb99, 2),
            n(s.emb_queue99, 2),
            s.chat,
            percent(s.chat_refused, 1),
            n(s.chat_queue50, 0),
            n(s.chat_queue99, 0)
        );
    }
    f += "\nIn `direct` the embeddings never pass the gateway: their queue column is 0.\n";
    write(&dir.join("report.md"), &f)
}
