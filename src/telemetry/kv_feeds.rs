//! Exact prefix routing's event streams on `/metrics`: each replica's
//! feed is read when `/metrics` is scraped. The follower tasks count in
//! their own atomics and write no series, and a feed's liveness (a
//! matter of time since prompts were routed to it) is judged at the
//! scrape, so it is never stale.
//!
//! Which feeds there are is set when a pool goes live (a start or a
//! reload's swap), never while a reload is being prepared.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;

use super::labels::ReplicaLabels;

/// What one replica's feed has seen, as of now (also on `/slo.json`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub(crate) struct FeedSample {
    /// Its events tell what the replica holds now (else it is routed by estimate).
    pub(crate) alive: bool,
    /// Blocks indexed.
    pub(crate) blocks: u64,
    pub(crate) batches: u64,
    pub(crate) events: u64,
    /// Batches missed and not replayed.
    pub(crate) lost: u64,
    /// Batches recovered from the replica's replay socket.
    pub(crate) replayed: u64,
    /// Batches that could not be read.
    pub(crate) malformed: u64,
    /// Stored blocks whose parent the index did not know.
    pub(crate) unchained: u64,
    /// Stored blocks keyed by more than tokens (LoRA, multimodal, salt).
    pub(crate) beyond_tokens: u64,
    /// Times the index passed its bound and started again.
    pub(crate) index_restarts: u64,
}

/// A feed that can say what it has seen.
pub(crate) trait FeedSource: Send + Sync {
    fn sample(&self) -> FeedSample;
}

/// A replica's label and its feed.
pub(crate) type Source = (String, Arc<dyn FeedSource>);

/// The live pools' feeds, by pool.
#[derive(Default)]
pub(crate) struct KvFeeds {
    pools: Mutex<BTreeMap<String, Vec<Source>>>,
}

impl std::fmt::Debug for KvFeeds {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KvFeeds").field("pools", &self.lock().keys().collect::<Vec<_>>()).finish()
    }
}

impl KvFeeds {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Vec<Source>>> {
        self.pools.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Pool `pool` went live with these feeds (none: it has no exact mode).
    pub(crate) fn set(&self, pool: &str, feeds: Vec<Source>) {
        let mut pools = self.lock();
        if feeds.is_empty() {
            pools.remove(pool);
        } else {
            pools.insert(pool.to_string(), feeds);
        }
    }

    /// Forget the pools a reload removed.
    pub(crate) fn retain(&self, live: impl Fn(&str) -> bool) {
        self.lock().retain(|p, _| live(p));
    }

    fn samples(&self) -> Vec<(ReplicaLabels, FeedSample)> {
        let pools = self.lock();
        pools
            .iter()
            .flat_map(|(pool, feeds)| {
                feeds.iter().map(move |(replica, f)| (ReplicaLabels { pool: pool.clone(), replica: replica.clone() }, f.sample()))
            })
            .collect()
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct UnindexedLabels {
    pool: String,
    replica: String,
    why: String,
}

/// The series, read from [`KvFeeds`] at each scrape.
#[derive(Debug)]
pub(crate) struct KvFeedsCollector(pub(crate) Arc<KvFeeds>);

/// (name, help, counter?, value)
type Series = (&'static str, &'static str, bool, fn(&FeedSample) -> u64);

const SERIES: [Series; 7] = [
    (
        "replica_kv_events_alive",
        "1 while the replica's KV events say what its prefix cache holds (exact prefix routing); 0: routed by the estimate",
        false,
        |s| s.alive as u64,
    ),
    ("replica_kv_events_blocks", "Prompt blocks the replica's KV events say it holds, as indexed", false, |s| s.blocks),
    ("replica_kv_events_batches", "KV event batches received from the replica", true, |s| s.batches),
    ("replica_kv_events_lost_batches", "KV event batches missed (sequence numbers skipped) and not replayed", true, |s| s.lost),
    ("replica_kv_events_replayed_batches", "KV event batches recovered from the replica's replay socket", true, |s| s.replayed),
    ("replica_kv_events_malformed_batches", "KV event batches that could not be read", true, |s| s.malformed),
    ("replica_kv_events_index_restarts", "Times the replica's block index passed its bound and started again", true, |s| s.index_restarts),
];

impl Collector for KvFeedsCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let rows = self.0.samples();
        if rows.is_empty() {
            return Ok(());
        }
        for (name, help, counter, value) in SERIES {
            let kind = if counter { MetricType::Counter } else { MetricType::Gauge };
            let mut family = encoder.encode_descriptor(name, help, None, kind)?;
            for (labels, s) in &rows {
                let e = family.encode_family(labels)?;
                if counter {
                    ConstCounter::new(value(s)).encode(e)?;
                } else {
                    ConstGauge::new(value(s) as i64).encode(e)?;
                }
            }
        }
        let mut family = encoder.encode_descriptor(
            "replica_kv_events_unindexed_blocks",
            "Stored blocks the index could not use: why=unchained (their parent unknown: a missed event), \
             why=beyond_tokens (keyed by a LoRA adapter, media or a salt)",
            None,
            MetricType::Counter,
        )?;
        for (l, s) in &rows {
            for (why, v) in [("unchained", s.unchained), ("beyond_tokens", s.beyond_tokens)] {
                let labels = UnindexedLabels { pool: l.pool.clone(), replica: l.replica.clone(), why: why.to_string() };
                ConstCounter::new(v).encode(family.encode_family(&labels)?)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::metrics::openmetrics_to_prometheus;

    struct Fixed(FeedSample);
    impl FeedSource for Fixed {
        fn sample(&self) -> FeedSample {
            self.0
        }
    }

    fn source(replica: &str, s: FeedSample) -> Source {
        (replica.to_string(), Arc::new(Fixed(s)) as Arc<dyn FeedSource>)
    }

    fn exposition(feeds: &Arc<KvFeeds>) -> String {
        let mut registry = prometheus_client::registry::Registry::with_prefix("slogate");
        registry.register_collector(Box::new(KvFeedsCollector(feeds.clone())));
        let mut om = String::new();
        prometheus_client::encoding::text::encode(&mut om, &registry).expect("encode");
        openmetrics_to_prometheus(&om)
    }

    #[test]
    fn each_live_feed_is_read_at_the_scrape_and_a_removed_pool_leaves_no_series() {
        let feeds = Arc::new(KvFeeds::default());
        assert!(!exposition(&feeds).contains("kv_events"), "no exact pool, no series");
        let a = FeedSample { alive: true, blocks: 12, batches: 3, lost: 1, unchained: 2, ..FeedSample::default() };
        feeds.set("default", vec![source("r0", a), source("r1", FeedSample::default())]);
        let text = exposition(&feeds);
        for line in [
            "# TYPE slogate_replica_kv_events_alive gauge",
            "slogate_replica_kv_events_alive{pool=\"default\",replica=\"r0\"} 1",
            "slogate_replica_kv_events_alive{pool=\"default\",replica=\"r1\"} 0",
            "slogate_replica_kv_events_blocks{pool=\"default\",replica=\"r0\"} 12",
            "# TYPE slogate_replica_kv_events_batches_total counter",
            "slogate_replica_kv_events_batches_total{pool=\"default\",replica=\"r0\"} 3",
            "slogate_replica_kv_events_lost_batches_total{pool=\"default\",replica=\"r0\"} 1",
            "slogate_replica_kv_events_unindexed_blocks_total{pool=\"default\",replica=\"r0\",why=\"unchained\"} 2",
            "slogate_replica_kv_events_unindexed_blocks_total{pool=\"default\",replica=\"r0\",why=\"beyond_tokens\"} 0",
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line:?} in\n{text}");
        }
        feeds.retain(|p| p != "default");
        assert!(!exposition(&feeds).contains("kv_events"), "the pool was removed");
        feeds.set("default", vec![source("r0", a)]);
        feeds.set("default", Vec::new());
        assert!(!exposition(&feeds).contains("kv_events"), "the pool went live without exact mode");
    }
}
