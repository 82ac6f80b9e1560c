//! Active health checks, model discovery and vLLM load scraping, one task
//! per replica. These tasks only write the replica's atomics; the request
//! path reads them and never waits on a check.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use tokio::sync::watch;

use super::{Pool, Replica, UpstreamClient};

/// Run health checks (and, for `auto` pools, model discovery; with
/// `scrape_metrics`, vLLM load scraping) for every replica of `pool` until
/// `stop` changes.
pub fn spawn(pool: Arc<Pool>, stop: watch::Receiver<bool>) -> Vec<tokio::task::JoinHandle<()>> {
    pool.replicas
        .iter()
        .map(|r| {
            let (pool, replica, stop) = (pool.clone(), r.clone(), stop.clone());
            tokio::spawn(async move { replica_loop(pool, replica, stop).await })
        })
        .collect()
}

async fn replica_loop(pool: Arc<Pool>, replica: Arc<Replica>, mut stop: watch::Receiver<bool>) {
    let h = pool.config.health.clone();
    let mut interval = tokio::time::interval(h.interval.get());
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut streak_ok = 0u32;
    let mut streak_bad = 0u32;
    let mut known = false;
    let mut tick = 0u64;
    let scrape = pool.config.scrape_metrics.get();
    let mut last_scrape: Option<tokio::time::Instant> = None;
    loop {
        tokio::select! {
            _ = interval.tick() => {}
            _ = stop.changed() => return,
        }
        let ok = get(&pool.client, &replica, &h.path, h.timeout.get()).await.is_some_and(|(status, _)| status.is_success());
        if ok {
            streak_ok += 1;
            streak_bad = 0;
        } else {
            streak_bad += 1;
            streak_ok = 0;
        }
        let was = replica.is_healthy();
        // The first check decides at once; after that the thresholds apply.
        let now = if !known {
            ok
        } else if was {
            streak_bad < h.unhealthy_after
        } else {
            streak_ok >= h.healthy_after
        };
        if !known || now != was {
            replica.set_healthy(now);
            if known || !now {
                if now {
                    tracing::info!(pool = %pool.config.name, replica = %replica.url, "replica healthy again");
                } else {
                    tracing::warn!(pool = %pool.config.name, replica = %replica.url, failures = streak_bad, "replica taken out: failing health checks");
                }
            }
        }
        known = true;
        if now && pool.auto && (tick % 15 == 0 || replica.models.load().is_empty()) {
            discover_models(&pool.client, &replica, h.timeout.get()).await;
        }
        if now && !scrape.is_zero() && last_scrape.is_none_or(|t| t.elapsed() >= scrape) {
            last_scrape = Some(tokio::time::Instant::now());
            scrape_load(&pool.client, &replica, h.timeout.get()).await;
        }
        tick += 1;
    }
}

async fn get(client: &UpstreamClient, replica: &Replica, path: &str, timeout: Duration) -> Option<(http::StatusCode, Bytes)> {
    let uri = format!("{}{}", replica.url, path);
    let req = http::Request::get(uri).body(Full::new(Bytes::new())).ok()?;
    let fut = async {
        let resp = client.request(req).await.ok()?;
        let status = resp.status();
        let body = resp.into_body().collect().await.ok()?.to_bytes();
        Some((status, body))
    };
    tokio::time::timeout(timeout, fut).await.ok().flatten()
}

async fn discover_models(client: &UpstreamClient, replica: &Replica, timeout: Duration) {
    let Some((status, body)) = get(client, replica, "/v1/models", timeout).await else { return };
    if !status.is_success() {
        return;
    }
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(&body) else { return };
    if let Some(list) = v.get("data").and_then(|d| d.as_array()) {
        replica.models.store(Arc::new(list.clone()));
    }
}

/// Read `vllm:num_requests_waiting` so least-loaded sees the replica's own queue.
async fn scrape_load(client: &UpstreamClient, replica: &Replica, timeout: Duration) {
    let Some((status, body)) = get(client, replica, "/metrics", timeout).await else { return };
    if !status.is_success() {
        return;
    }
    let text = String::from_utf8_lossy(&body);
    let waiting: f64 =
        text.lines().filter(|l| l.starts_with("vllm:num_requests_waiting")).filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok()).sum();
    replica.scraped_waiting.store(waiting.max(0.0) as u64, std::sync::atomic::Ordering::Relaxed);
}
