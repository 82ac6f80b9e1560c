//! Replicas that follow the cluster: each pool with `replicas_dns` has its
//! name resolved every `replicas_dns.every`, and the addresses it names
//! now become the pool's replicas besides the listed ones
//! ([`App::found_replicas`]): one that appears is probed by the health
//! checks before it takes a request, one that goes is drained (its
//! requests in flight finish where they are). A lookup that fails keeps
//! the last answer: a DNS hiccup does not empty a pool.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use crate::state::App;
use crate::upstream::dns;

/// How often the pools' settings are read again (a reload may add or drop
/// a `replicas_dns`), at least.
const LOOK_AGAIN: Duration = Duration::from_secs(1);

/// Resolve every pool's `replicas_dns` when it is due, until `stop`.
pub(crate) async fn run(app: Arc<App>, mut stop: watch::Receiver<bool>) {
    let mut due: HashMap<String, Instant> = HashMap::new();
    loop {
        let config = app.given();
        let now = Instant::now();
        let mut next = now + LOOK_AGAIN;
        for pool in &config.pools {
            let Some(d) = &pool.replicas_dns else { continue };
            let at = due.entry(pool.name.clone()).or_insert(now);
            if *at <= now {
                *at = now + d.every.get();
                let scheme = if pool.tls.is_some() { "https" } else { "http" };
                match dns::replica_urls(d, scheme).await {
                    Ok(urls) => match app.found_replicas(&pool.name, urls.clone()).await {
                        Ok(true) => {
                            tracing::info!(pool = %pool.name, name = %d.name, replicas = ?urls, "replicas_dns: the pool's replicas changed")
                        }
                        Ok(false) => {}
                        Err(e) => tracing::error!(pool = %pool.name, error = %e, "replicas_dns: the pool could not be built again"),
                    },
                    Err(e) => {
                        tracing::warn!(pool = %pool.name, name = %d.name, error = %e, "replicas_dns: lookup failed; keeping the last answer")
                    }
                }
            }
            next = next.min(*at);
        }
        tokio::select! {
            _ = tokio::time::sleep_until(next) => {}
            _ = stop.changed() => return,
        }
    }
}
