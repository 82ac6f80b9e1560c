//! One replica: where it is, its health, its slots (held until a stream
//! ends), what it reports and what its streams measure (first tokens,
//! gaps), and its learned limit. Taking one of its slots is `take.rs`; a
//! request's hold on one is a `ReplicaSlot` (`slot.rs`).

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use arc_swap::ArcSwap;
use http::HeaderValue;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;

use super::parts::{Address, Connection, Health, LimitSignals, Readings, RoutingStats, Seats};
use super::share::Share;
use super::{conn, limit, tls};
use crate::config::Tier;
use crate::error::GatewayError;
use crate::sync::AtomicF64;
use crate::telemetry::metrics::{Metrics, ReplicaLabels};

/// One upstream vLLM server, composed of its parts (`parts.rs`).
pub(crate) struct Replica {
    /// Base URL as configured, e.g. `http://127.0.0.1:8000`.
    pub(crate) url: String,
    /// `replicas[].name`, when the config gives one.
    pub(super) name: Option<String>,
    /// What clients are shown (`x-slogate-replica`, error bodies): the name,
    /// else `<pool>-<position>`, set when a pool with it is built.
    pub(super) public: ArcSwap<HeaderValue>,
    /// Its series, made when its pool goes live ([`Replica::go_live`]): a
    /// prepared pool that is never installed shows nothing.
    pub(super) gauges: std::sync::OnceLock<ReplicaGauges>,
    /// When it was made: where its clocks in milliseconds count from.
    pub(super) born: tokio::time::Instant,
    /// Its slots: how many there are, this instance's part of them, and who holds them (interactive, batch, prefilling).
    pub(super) seats: Seats,
    /// Whether it is routed to, and why.
    pub(crate) health: Health,
    /// What its own `/metrics` and `/v1/models` said when last read.
    pub(crate) readings: Readings,
    /// How it is reached: idle connections, TLS, its key.
    pub(crate) conn: Connection,
    /// What the learned limit reads of it since it last looked, and the controller itself.
    pub(super) learning: LimitSignals,
    /// What routing reads of how it serves: its prefix cache's hits, the gaps between its tokens, when it last delivered.
    pub(super) routing: RoutingStats,
    /// Where requests go: its scheme and authority, and the `Host` they carry.
    pub(crate) address: Address,
}

/// A replica whose streams' mean gap is more than this many times the
/// fastest healthy replica's is slow: interactive requests wait for the others.
pub(super) const SLOW_GAPS: f64 = 1.5;

impl Replica {
    /// Does the replica get a key of its pool's (`pools[].api_key_env`)?
    pub(crate) fn has_api_key(&self) -> bool {
        self.conn.authorization().is_some()
    }

    /// A replica at `url` (its base `base`), `initial` slots, not yet healthy.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn new(
        url: &str,
        name: Option<String>,
        public: HeaderValue,
        base: http::Uri,
        tls: Option<tls::ReplicaTls>,
        api_key: Option<HeaderValue>,
        initial: usize,
        limit_params: limit::LimitParams,
    ) -> Replica {
        Replica {
            url: url.to_string(),
            name,
            public: ArcSwap::from_pointee(public),
            gauges: std::sync::OnceLock::new(),
            born: tokio::time::Instant::now(),
            seats: Seats {
                inflight: AtomicUsize::new(0),
                prefilling: [AtomicUsize::new(0), AtomicUsize::new(0)],
                prefill_bytes: [AtomicU64::new(0), AtomicU64::new(0)],
                batch_held: AtomicUsize::new(0),
                lent: AtomicUsize::new(0),
                batch_cut: AtomicUsize::new(0),
                max_inflight: AtomicUsize::new(initial),
                allowance: AtomicUsize::new(usize::MAX),
                others_inflight: AtomicUsize::new(0),
                fleet_limit: AtomicUsize::new(usize::MAX),
            },
            health: Health {
                healthy: AtomicBool::new(false),
                verdict: super::verdict::Verdict::default(),
                health_error: ArcSwap::from_pointee(None),
            },
            readings: Readings {
                scraped_total: AtomicU64::new(u64::MAX),
                scraped_waiting: AtomicU64::new(0),
                cache_tokens: AtomicU64::new(0),
                most_running: AtomicU64::new(0),
                models: ArcSwap::from_pointee(Vec::new()),
                scrape: crate::sync::Rest::default(),
                llamacpp: AtomicBool::new(false),
            },
            conn: Connection { idle: conn::IdleConns::default(), tls, api_key },
            learning: LimitSignals {
                controller: std::sync::Mutex::new(limit::Controller::new(limit_params)),
                inflight_peak: AtomicUsize::new(0),
                refused: AtomicBool::new(false),
                first_token_share: AtomicU64::new(0),
                first_token_n: AtomicU64::new(0),
                first_token_max: AtomicU64::new(0),
                first_token_p90: AtomicF64::new(0.0),
                first_token_p50: AtomicF64::new(0.0),
                dispatched: AtomicU64::new(0),
                dispatched_seen: AtomicU64::new(0),
                controlled_at_ms: AtomicU64::new(0),
                logged_limit: AtomicUsize::new(initial),
            },
            routing: RoutingStats {
                expected_hits: Share::default(),
                reported_hits: Share::default(),
                itl_mean_us: AtomicF64::new(0.0),
                itl_at_ms: AtomicU64::new(0),
                delivered_at_ms: AtomicU64::new(0),
                first_token: Default::default(),
                outlook: Default::default(),
            },
            address: Address { host: base.authority().and_then(|a| HeaderValue::from_str(a.as_str()).ok()), base },
        }
    }

    /// How metrics, traces and the status page label it: its name, else its URL.
    pub(crate) fn label(&self) -> &str {
        self.name.as_deref().unwrap_or(&self.url)
    }

    /// What clients are shown: its name, else `<pool>-<position>`; never the URL.
    pub(crate) fn public_name(&self) -> HeaderValue {
        (**self.public.load()).clone()
    }

    /// [`public_name`](Replica::public_name) as text.
    pub(super) fn shown(&self) -> String {
        String::from_utf8_lossy(self.public_name().as_bytes()).into_owned()
    }

    pub(super) fn failed(&self, e: conn::SendError) -> GatewayError {
        GatewayError::Upstream { replica: self.shown(), detail: e.public_message(), url: self.url.clone(), source: Box::new(e) }
    }

    pub(crate) fn inflight(&self) -> usize {
        self.seats.inflight()
    }
    /// Requests of `tier` held here that have no first token yet.
    pub(crate) fn prefilling(&self, tier: Tier) -> usize {
        self.seats.prefilling(tier)
    }
    /// See [`Seats::prefills_ahead`](super::parts::Seats::prefills_ahead).
    pub(super) fn prefills_ahead(&self, tier: Tier, upstream_priority: bool) -> usize {
        self.seats.prefills_ahead(tier, upstream_priority)
    }
    /// See [`Seats::prefill_bytes_ahead`](super::parts::Seats::prefill_bytes_ahead).
    pub(super) fn prefill_bytes_ahead(&self, tier: Tier, upstream_priority: bool) -> u64 {
        self.seats.prefill_bytes_ahead(tier, upstream_priority)
    }
    /// Prefix-aware routing sent a prompt of `bytes` here, expecting `matched` of them cached.
    pub(super) fn routed(&self, bytes: u64, matched: u64) {
        self.routing.routed(bytes, matched, self.gauges.get().map(|g| (&g.routed_bytes, &g.matched_bytes)));
    }
    /// The engine reported `prompt` tokens for a request served here, `cached` of them from its prefix cache.
    pub(crate) fn served_prompt(&self, prompt: u64, cached: u64) {
        self.routing.served_prompt(prompt, cached, self.gauges.get().map(|g| (&g.prompt_tokens, &g.cached_tokens)));
    }
    /// Since the start: the share of the prompt bytes sent here that
    /// prefix-aware routing expected cached, and the share of prompt tokens
    /// the engine reported cached (`None` before any).
    pub(crate) fn hit_ratios(&self) -> (Option<f64>, Option<f64>) {
        self.routing.hit_ratios()
    }
    /// The replica's limit: learned, or fixed (for the whole fleet when
    /// several instances share it).
    pub(crate) fn max_inflight(&self) -> usize {
        self.seats.max_inflight()
    }
    /// The slots this instance may hold: the limit, or its part of it in a fleet.
    pub(crate) fn slots(&self) -> usize {
        self.seats.slots()
    }
    /// See [`Seats::set_fleet_share`](super::parts::Seats::set_fleet_share).
    pub(crate) fn set_fleet_share(&self, share: Option<(usize, usize)>) {
        self.seats.set_fleet_share(share);
    }
    /// See [`Seats::set_fleet_limit`](super::parts::Seats::set_fleet_limit).
    pub(crate) fn set_fleet_limit(&self, limit: usize) {
        self.seats.set_fleet_limit(limit);
    }
    /// What the replica runs and queues for all its clients, as last scraped.
    pub(crate) fn scraped_total(&self) -> Option<u64> {
        self.readings.scraped_total()
    }
    pub(crate) fn set_scraped_total(&self, total: Option<f64>) {
        self.readings.set_scraped_total(total);
    }
    /// How many of the prefix index's blocks of `block` bytes its KV cache
    /// holds, where its `/metrics` said how large the cache is.
    pub(super) fn cache_blocks(&self, block: u64) -> Option<usize> {
        super::prefix::cache_blocks(self.readings.cache_tokens.load(Ordering::Relaxed), block)
    }
    /// Requests may be sent here: it passes its checks, or its pool is in panic.
    pub(crate) fn is_healthy(&self) -> bool {
        self.health.is_healthy()
    }
    /// It passes its checks (and its traffic has not failed since).
    pub(crate) fn is_passing(&self) -> bool {
        self.health.is_passing()
    }
    /// The verdict on it (and so whether it is routed to, unless its pool is in panic).
    pub(crate) fn set_healthy(&self, up: bool) {
        self.health.verdict.set(up);
        self.health.healthy.store(up, Ordering::Relaxed);
        if let Some(g) = self.gauges.get() {
            g.healthy.set(up as i64);
        }
        if up {
            // Its load is read as soon as it may take requests.
            self.readings.scrape.poke();
        } else {
            self.readings.forget_running();
        }
    }
    /// Route to it or not, whatever its verdict (its pool's panic).
    pub(super) fn set_routed(&self, routed: bool) {
        self.health.set_routed(routed);
    }

    /// Why the replica is not healthy, as its last failed check said.
    pub(crate) fn health_error(&self) -> Option<String> {
        self.health.error()
    }
    pub(crate) fn set_health_error(&self, reason: Option<String>) {
        self.health.set_error(reason);
    }

    /// Show this replica's health on its gauge (a replica that just joined:
    /// unhealthy until its first check passes).
    pub(crate) fn publish_health(&self) {
        if let Some(g) = self.gauges.get() {
            g.healthy.set(self.is_passing() as i64);
        }
    }

    /// Its pool `pool` goes live: its series exist from now on, showing
    /// what it holds now.
    pub(super) fn go_live(&self, metrics: &Metrics, pool: &str) {
        let g = self.gauges.get_or_init(|| {
            let labels = ReplicaLabels { pool: pool.to_string(), replica: self.label().to_string() };
            ReplicaGauges {
                inflight: metrics.inflight.get_or_create(&labels).clone(),
                healthy: metrics.upstream_healthy.get_or_create(&labels).clone(),
                limit: metrics.replica_limit.get_or_create(&labels).clone(),
                batch_cut: metrics.replica_batch_cut.get_or_create(&labels).clone(),
                routed_bytes: metrics.replica_prefix_routed_bytes.get_or_create(&labels).clone(),
                matched_bytes: metrics.replica_prefix_matched_bytes.get_or_create(&labels).clone(),
                prompt_tokens: metrics.replica_prompt_tokens.get_or_create(&labels).clone(),
                cached_tokens: metrics.replica_cached_prompt_tokens.get_or_create(&labels).clone(),
                prediction_error: metrics.first_token_prediction_error.get_or_create(&labels, PREDICTION_ERROR_BOUNDS),
                predicted_late: metrics.first_token_predicted_late.get_or_create(&labels).clone(),
            }
        });
        g.inflight.set(self.inflight() as i64);
        g.batch_cut.set(self.seats.batch_cut.load(Ordering::Relaxed) as i64);
    }

    /// An interactive request sent here got its first token `after` its
    /// dispatch; its class's TTFT target is `target`.
    pub(crate) fn record_first_token(&self, after: std::time::Duration, target: std::time::Duration) {
        self.learning.first_token(after, target);
    }

    /// A stream of any class here had `gaps` gaps between its tokens over
    /// `span` (reported every few gaps, and at its end). The replica's mean
    /// gap moves a fifth of the way to this report's: it follows a replica
    /// that slows down (or recovers) within a second or so. Every class counts: a
    /// replica's step time is the same for all its streams, so batch keeps
    /// it measured while interactive requests go elsewhere.
    pub(crate) fn record_itl(&self, span: std::time::Duration, gaps: u64) {
        if gaps == 0 {
            return;
        }
        self.routing.record_itl(span.as_secs_f64() * 1e6 / gaps as f64, self.born.elapsed());
    }

    /// Tokens came from this replica just now.
    pub(crate) fn delivered(&self) {
        self.routing.delivered(self.born.elapsed());
    }

    /// Has it delivered tokens within `window`? A replica streaming tokens is
    /// alive, whatever its health endpoint says under that load.
    pub(crate) fn delivered_within(&self, window: std::time::Duration) -> bool {
        self.routing.delivered_within(window, self.born.elapsed())
    }

    /// The mean gap between tokens of the streams that ended here lately
    /// (zero before any, and once none has ended for a while: see
    /// [`RoutingStats::itl_mean`]).
    pub(crate) fn itl_mean(&self) -> std::time::Duration {
        self.routing.itl_mean(self.born.elapsed())
    }

    /// The time from dispatch to first token a request with `work` bytes
    /// of prefill (what is ahead of it here and its own) is predicted to
    /// take here; `None` until the replica's first tokens taught it.
    pub(super) fn predict_first_token(&self, work: u64) -> Option<std::time::Duration> {
        self.routing.predict_first_token(work, self.born.elapsed())
    }

    /// A first token came `took` after dispatch for `work` bytes of
    /// prefill: the prediction made then judged (its error in the
    /// replica's series), and the model taught.
    pub(super) fn first_token_came(&self, work: u64, predicted: Option<std::time::Duration>, took: std::time::Duration) {
        if let (Some(p), Some(g)) = (predicted, self.gauges.get()) {
            g.prediction_error.observe(took.abs_diff(p).as_secs_f64());
            if took > p {
                g.predicted_late.inc();
            }
        }
        self.routing.learn_first_token(work, took, self.born.elapsed());
    }

    /// An interactive request with a first-token `target` and `work` bytes
    /// of its own prefill was sent here: what batch leaves room for.
    pub(super) fn interactive_sent(&self, target: std::time::Duration, work: u64) {
        self.routing.outlook.sent(target, work, self.born.elapsed());
    }

    /// The interactive requests' mean target and own prefill work here (see
    /// [`super::first_token::Outlook`]).
    #[cfg(test)]
    pub(crate) fn interactive_outlook(&self) -> Option<(std::time::Duration, u64)> {
        self.routing.outlook.get(self.born.elapsed())
    }

    /// May a batch prompt of `work` bytes (not expected cached) go here
    /// now, on an engine that serves first come, first served? Always
    /// where no other batch prompt is being prefilled (so interactive
    /// prompts never keep batch out, and batch is never starved);
    /// otherwise where an interactive request sent after it would still be
    /// predicted its first token within half its target
    /// (docs/design/preemption.md, rule 14). Always in a fleet, where this
    /// instance sees only its own prompts of those ahead (measured: three
    /// gateways holding completed far less than one).
    pub(super) fn takes_batch_prompt(&self, work: u64) -> bool {
        self.seats.prefilling(Tier::Batch) == 0
            || self.seats.in_fleet()
            || self.routing.leaves_interactive_time(self.seats.prefill_bytes_ahead(Tier::Batch, false), work, self.born.elapsed())
    }

    /// Interactive requests' time from dispatch to first token over their
    /// class's target: its recent 90th percentile (0 before any).
    pub(crate) fn first_token_p90(&self) -> f64 {
        self.learning.first_token_p90()
    }

    /// The same time's recent median (0 before any).
    pub(crate) fn first_token_p50(&self) -> f64 {
        self.learning.first_token_p50()
    }

    /// The replica refused a request (429 or 503).
    pub(crate) fn note_refused(&self) {
        self.learning.note_refused();
    }

    /// As if the controller had moved the limit to `n`.
    #[cfg(test)]
    pub(crate) fn set_limit(&self, n: usize) {
        self.set_max_inflight(n);
    }

    /// Set the slot count (a fixed limit, or the controller's).
    pub(super) fn set_max_inflight(&self, n: usize) {
        self.seats.max_inflight.store(n, Ordering::Relaxed);
        if let Some(g) = self.gauges.get() {
            g.limit.set(n as i64);
        }
    }

    /// Every slot of the pool was taken: a learned limit still in slow start
    /// grows now (see [`limit::Controller::grow_on_demand`]); not in a fleet,
    /// where the other instances' requests share the replica. True if it grew.
    pub(crate) fn grow_on_demand(&self) -> bool {
        if self.seats.others_inflight.load(Ordering::Relaxed) > 0 {
            return false;
        }
        let allowed = {
            let mut c = self.learning.controller();
            if !c.grow_on_demand() {
                return false;
            }
            c.allowed()
        };
        self.set_max_inflight(allowed);
        true
    }

    /// The requests the engine says it runs at once (`None`: not said), as
    /// its learned limit keeps them.
    pub(crate) fn declared_slots(&self) -> Option<usize> {
        self.learning.controller().declared()
    }

    /// The engine said how many requests it runs at once (llama.cpp's
    /// server's `total_slots`): the controller keeps them whatever the
    /// limit now (a reload to a learned limit starts within them) and,
    /// where the pool `learns` its limits, the limit stays within them from
    /// now on, this one included (docs/design/learned-limits.md, rule 16).
    pub(crate) fn declare_slots(&self, slots: usize, learns: bool, pool: &str) {
        let (was, allowed) = {
            let mut c = self.learning.controller();
            let was = c.declared();
            c.declare(Some(slots));
            (was, c.allowed())
        };
        if !learns {
            return;
        }
        self.set_max_inflight(allowed);
        if was != Some(slots) {
            tracing::info!(pool, replica = %self.label(), slots, limit = allowed, "the replica declares how many requests it runs at once: its learned limit stays within them");
        }
    }

    /// One period of the learned limit: the replica's load as scraped, and
    /// what the request path noted since the last period.
    /// `demand`: requests wait in the gateway for the pool's slots.
    pub(crate) fn control(&self, pool: &str, load: Load, demand: bool) {
        // In a fleet the limit is the replica's, for every instance's requests.
        let others = self.seats.others_inflight.load(Ordering::Relaxed);
        let p = self.learning.period(self.born.elapsed().as_millis() as u64, self.inflight());
        // Requests sent in the time of one engine step (the mean gap between
        // tokens): about that many wait in the replica's queue between their
        // arrival and its next step, at any load.
        let mut in_transit = if p.since_ms > 0 { p.sent as f64 * 1000.0 / p.since_ms as f64 * self.itl_mean().as_secs_f64() } else { 0.0 };
        // In a fleet the others send too, about in proportion to what they hold here.
        let mine = self.inflight();
        if mine > 0 {
            in_transit *= (mine + others) as f64 / mine as f64;
        }
        let sample = limit::Sample {
            waiting: load.waiting,
            running: load.running,
            waits_only_when_full: load.waits_only_when_full,
            inflight_peak: p.inflight_peak + others,
            inflight_now: self.inflight() + others,
            demand,
            refused: p.refused,
            first_token: p.first_token,
            first_token_max: p.first_token_max,
            in_transit,
            batch_now: self.seats.batch_held.load(Ordering::Relaxed),
        };
        let (limit, cut) = {
            let mut c = self.learning.controller();
            c.update(sample);
            (c.allowed(), c.batch_cut())
        };
        let was = self.seats.batch_cut.swap(cut, Ordering::Relaxed);
        if let Some(g) = self.gauges.get() {
            g.batch_cut.set(cut as i64);
        }
        self.set_max_inflight(limit);
        if was == 0 && cut > 0 {
            tracing::info!(pool, replica = %self.label(), limit, batch_cut = cut, "batch leaves seats of the limit to interactive requests here (their first tokens late under load, or the replica's capacity moving under the limit)");
        }
        if let Some(logged) = self.learning.moved_from(limit) {
            tracing::info!(pool, replica = %self.label(), from = logged, to = limit, waiting = ?sample.waiting, refused = sample.refused, "learned in-flight limit moved");
        }
    }

    /// Nothing is sent here by any instance of the fleet: its load scrape may rest.
    pub(super) fn unused(&self) -> bool {
        self.inflight() == 0 && self.seats.others_inflight.load(Ordering::Relaxed) == 0
    }

    /// Does an interactive request here with no first token likely wait
    /// for one of the engine's slots, so that a batch stream's slot given
    /// up helps it (docs/design/preemption.md, rule 1)? Where its last
    /// scrape said requests wait inside it, or the fleet (this gateway
    /// alone, or with the others' requests as last heard) has more
    /// requests on it than a scrape ever saw it run (its slots: the last
    /// scrape may be a period older than the request); under
    /// `upstream_priority`, only where that scrape also saw it run (nearly)
    /// all the requests it was ever seen running: below its slots, such an
    /// engine runs an interactive prompt at once and takes its cache blocks
    /// from batch itself, and the request waits for prefill, which a slot
    /// does not give.
    pub(crate) fn waits_for_a_slot(&self, upstream_priority: bool) -> bool {
        let most = self.readings.most_running();
        // In a fleet, every instance's requests there, the others' as last heard.
        let sent = self.inflight() + self.seats.others_inflight.load(Ordering::Relaxed);
        let past_its_slots = most > 0 && sent as u64 > most;
        (self.readings.scraped_waiting.load(Ordering::Relaxed) > 0 || past_its_slots)
            && (!upstream_priority || self.readings.runs_its_slots())
    }

    /// Is its limit at least the most requests a scrape ever saw running
    /// inside it, its engine's slots (so that neither its KV cache nor late
    /// first tokens hold it lower)? False where no scrape said what it runs.
    pub(crate) fn limit_at_its_slots(&self) -> bool {
        let most = self.readings.most_running();
        most > 0 && self.max_inflight() as u64 >= most
    }

    pub(super) fn load_score(&self) -> u64 {
        self.inflight() as u64 + self.readings.scraped_waiting.load(Ordering::Relaxed)
    }
}

/// What a replica said of its load (its `/metrics`); `None` where it did not say.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Load {
    pub(crate) waiting: Option<f64>,
    pub(crate) running: Option<f64>,
    /// The engine gives a waiting request a slot as soon as one frees
    /// (llama.cpp's server), so a request waits there only while every
    /// slot is busy: its queue says it is full, however its running count
    /// moved (docs/design/learned-limits.md, rule 5).
    pub(crate) waits_only_when_full: bool,
}

/// A replica's own series.
pub(super) struct ReplicaGauges {
    pub(super) inflight: Gauge,
    pub(super) healthy: Gauge,
    /// `slogate_replica_limit{pool,replica}`.
    pub(super) limit: Gauge,
    /// `slogate_replica_batch_cut{pool,replica}`.
    pub(super) batch_cut: Gauge,
    /// `slogate_replica_prefix_routed_bytes_total`, `..._matched_bytes_total`.
    pub(super) routed_bytes: Counter,
    pub(super) matched_bytes: Counter,
    /// `slogate_replica_prompt_tokens_total`, `slogate_replica_cached_prompt_tokens_total`.
    pub(super) prompt_tokens: Counter,
    pub(super) cached_tokens: Counter,
    /// `slogate_first_token_prediction_error_seconds{pool,replica}`, and
    /// `slogate_first_token_predicted_late_total`: how far off the
    /// predicted time to first token was, and how often it came later.
    pub(super) prediction_error: crate::telemetry::histogram::AtomicHistogram,
    pub(super) predicted_late: Counter,
}

/// The buckets of a prediction's error, in seconds.
const PREDICTION_ERROR_BOUNDS: &[f64] = &[0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0];
