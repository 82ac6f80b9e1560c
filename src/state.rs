//! The one swappable snapshot of everything built from a config.
//!
//! 1. [`Snapshot::prepare`] builds the whole new snapshot and touches
//!    nothing live: it renames no replica, makes no metric series, starts
//!    no store worker. It may fail; a failed or discarded prepare leaves no
//!    trace.
//! 2. [`App::install`] cannot fail. It hands the long-lived parts their new
//!    parameters, makes the new series, renames moved replicas, starts a new
//!    limit store's worker, then swaps the snapshot in with one `ArcSwap`
//!    store.
//! 3. Shared across reloads on purpose, and reached from both snapshots
//!    while the swap runs: replicas of the same URL and access (health,
//!    in-flight, learned limit, connections), pool admissions (waiters and
//!    counts), class controls (windows, breaker, budget) and tenants (usage,
//!    quotas). What they measure is about the replicas and the callers, not
//!    about a config; a reload that reset it would reopen a breaker's
//!    question or forget a key's use.
//! 4. Each request loads the snapshot once and keeps that `Arc` until it
//!    ends, so a reload never changes a request midway.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::admission::{Controls, PoolAdmission};
use crate::classify::{AdminToken, Class, Classifier};
use crate::config::Config;
use crate::telemetry::access_log::AccessLogSlot;
use crate::telemetry::metrics::ReplicaLabels;
use crate::telemetry::Metrics;
use crate::upstream::{Access, Pool};

/// One pool as the request path sees it: its replicas (`upstream`) and the
/// admission in front of them, side by side.
pub(crate) struct Route {
    pub(crate) pool: Arc<Pool>,
    pub(crate) admission: Arc<PoolAdmission>,
}

/// Everything the request path needs, immutable once built.
pub(crate) struct Snapshot {
    pub(crate) config: Arc<Config>,
    pub(crate) pools: Vec<Route>,
    pub(crate) classifier: Classifier,
    /// What the admin listener requires (`server.admin_token_env`).
    pub(crate) admin_token: Option<AdminToken>,
    /// Where keys' limits are kept (`limits.redis`), if anywhere but here.
    pub(crate) store: Option<Arc<crate::limits::store::Store>>,
}

impl Snapshot {
    /// Build a snapshot. Fails before it builds anything, and changes nothing
    /// live either way: with `previous`, replicas of pools of the same name
    /// and their admissions (queues, batch count) carry over as they are,
    /// and get the new parameters only at [`App::install`].
    pub(crate) fn prepare(
        config: Config,
        metrics: &Metrics,
        controls: &Controls,
        previous: Option<&Snapshot>,
    ) -> Result<Snapshot, PrepareError> {
        let classifier = Classifier::new(&config, controls)?;
        let admin_token = match &config.server.admin_token_env {
            None => None,
            Some(var) => Some(AdminToken::from_env(var).ok_or_else(|| PrepareError::AdminToken { var: var.clone() })?),
        };
        // Every pool's URLs, TLS and key first: nothing is built for a config that fails.
        let access = config
            .pools
            .iter()
            .enumerate()
            .map(|(i, p)| Access::new(p).map_err(|source| PrepareError::Pool { pool: i, source }))
            .collect::<Result<Vec<_>, _>>()?;
        let store = controls.tenants.store_for(&config.limits)?;
        let mut pools = Vec::with_capacity(config.pools.len());
        for (p, access) in config.pools.iter().zip(access) {
            let before = previous.and_then(|s| s.pools.iter().find(|o| o.pool.config.name == p.name));
            let pool = Pool::new(p.clone(), access, before.map(|b| &*b.pool));
            let pool = Arc::new(pool);
            let admission = match before {
                Some(b) => b.admission.clone(),
                None => Arc::new(PoolAdmission::new(pool.clone(), config.tiers.clone(), metrics)),
            };
            pools.push(Route { pool, admission });
        }
        Ok(Snapshot { config: Arc::new(config), pools, classifier, admin_token, store })
    }

    /// The pool serving `model`: static names first, then discovered ones.
    pub(crate) fn pool_for(&self, model: &str) -> Option<&Route> {
        self.pools.iter().find(|r| r.pool.static_models.contains(model)).or_else(|| self.pools.iter().find(|r| r.pool.serves(model)))
    }

    pub(crate) fn default_class(&self) -> Arc<Class> {
        self.classifier.class(&self.config.default_class).cloned().unwrap_or_else(|| self.classifier.classes()[0].clone())
    }

    /// Ready: at least one healthy replica in every pool.
    pub(crate) fn ready(&self) -> bool {
        self.pools.iter().all(|r| r.pool.healthy_count() > 0)
    }
}

/// Give the long-lived parts a snapshot's parameters: class controls, pool
/// admissions (the pool they hand slots from, the tier limits), gauges.
fn activate(controls: &Controls, metrics: &Metrics, snapshot: &Snapshot) {
    controls.install(snapshot.classifier.classes().iter().map(|c| &c.control), &snapshot.config);
    controls.tenants.install(snapshot.classifier.tenants().iter().map(|(t, c)| (t, *c)));
    controls.tenants.set_store(snapshot.store.clone());
    for r in &snapshot.pools {
        r.admission.install(r.pool.clone(), snapshot.config.tiers.clone());
        r.pool.activate(metrics);
    }
    known_series(metrics, snapshot);
}

/// Every configured class's request series exist from the start, at zero
/// (for each model a pool names, else `unknown`): a class without traffic
/// shows its TTFT and ITL buckets, its queue time, its `ok` count and its latency verdicts by
/// signal, so its SLI rules give a ratio over zero requests rather than
/// nothing, and `rate()` sees its first requests.
fn known_series(metrics: &Metrics, snapshot: &Snapshot) {
    let mut models: Vec<&str> = snapshot.pools.iter().flat_map(|r| r.pool.static_models.iter().map(String::as_str)).collect();
    if models.is_empty() {
        models.push("unknown");
    }
    for class in snapshot.classifier.classes() {
        let series = class.control.series.load();
        for signal in crate::telemetry::metrics::Signal::ALL {
            series.judged(metrics, signal, true);
            series.judged(metrics, signal, false);
        }
        series.queue_time(metrics);
        for m in &models {
            let s = series.for_request(m, crate::config::Endpoint::Chat);
            s.ttft(metrics);
            s.itl(metrics);
            s.outcome(metrics, crate::telemetry::Outcome::ok);
        }
    }
}

/// Why a config that parsed cannot be served.
#[derive(Debug, thiserror::Error)]
pub enum PrepareError {
    #[error(transparent)]
    Keys(#[from] crate::classify::KeyError),
    /// A replica URL, a TLS file or the API key of a pool.
    #[error("pools[{pool}].{source}")]
    Pool { pool: usize, source: crate::upstream::PoolError },
    #[error("server.admin_token_env: environment variable {var} is not set or empty")]
    AdminToken { var: String },
    #[error(transparent)]
    Store(#[from] crate::limits::store::StoreError),
}

/// Why a reload was refused (the running config stays).
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    #[error("this gateway was not started from a config file")]
    NoConfigFile,
    /// Reloads are rate-limited; nothing was read.
    #[error("too many reloads in a row (up to {RELOAD_BURST}, then one per {RELOAD_EVERY:?}); retry in {retry_after:?}")]
    TooSoon { retry_after: std::time::Duration },
    #[error("{0}")]
    Config(#[from] crate::config::ConfigError),
    #[error(transparent)]
    Invalid(#[from] PrepareError),
}

/// Process-wide state shared by both listeners.
pub(crate) struct App {
    state: ArcSwap<Snapshot>,
    pub(crate) metrics: Arc<Metrics>,
    /// Per-class rolling windows, breakers and reduction triggers.
    pub(crate) controls: Arc<Controls>,
    /// The file `POST /-/reload` and SIGHUP read again.
    pub(crate) config_path: Option<PathBuf>,
    stop: watch::Receiver<bool>,
    /// Health-check tasks of the current snapshot's replicas.
    health: Mutex<Vec<JoinHandle<()>>>,
    /// One reload at a time.
    reloading: tokio::sync::Mutex<()>,
    /// Reloads allowed now (see [`RELOAD_BURST`]).
    reload_budget: Mutex<ReloadBudget>,
    /// This instance among the others in front of the same replicas (`fleet`).
    pub(crate) fleet: Arc<crate::fleet::Fleet>,
    /// The status page's last hour, sampled by its own task (see `status`).
    pub(crate) history: crate::telemetry::history::History,
    /// Where finished requests' lines go (`telemetry.access_log`).
    pub(crate) access_log: AccessLogSlot,
    /// The response bodies in flight, whose deadlines are checked even
    /// when nothing polls them.
    pub(crate) watchlist: Arc<crate::sync::Watchlist>,
    /// The config as given (its file's), before the replicas found in DNS.
    given: Mutex<Arc<Config>>,
    /// Per pool, the replica URLs its `replicas_dns` last named.
    found: Mutex<std::collections::HashMap<String, Vec<String>>>,
}

/// Reloads that may run back to back; after them, one per [`RELOAD_EVERY`].
/// A reload re-reads TLS files, rebuilds pools and restarts health checks:
/// a loop posting `/-/reload` must not keep the gateway doing only that.
pub(crate) const RELOAD_BURST: u32 = 10;
pub(crate) const RELOAD_EVERY: std::time::Duration = std::time::Duration::from_millis(200);

/// A token bucket of reloads.
struct ReloadBudget {
    tokens: u32,
    /// When the bucket last gained a token (or was full).
    since: tokio::time::Instant,
}

impl ReloadBudget {
    /// Take a reload; else how long until one is allowed.
    fn take(&mut self, now: tokio::time::Instant) -> Result<(), std::time::Duration> {
        let gained = (now.saturating_duration_since(self.since).as_millis() / RELOAD_EVERY.as_millis()) as u32;
        if gained > 0 {
            self.tokens = (self.tokens + gained).min(RELOAD_BURST);
            self.since += RELOAD_EVERY * gained;
        }
        if self.tokens == RELOAD_BURST {
            self.since = now;
        }
        if self.tokens == 0 {
            return Err((self.since + RELOAD_EVERY).saturating_duration_since(now));
        }
        self.tokens -= 1;
        Ok(())
    }
}

impl App {
    pub(crate) fn new(
        snapshot: Snapshot,
        metrics: Arc<Metrics>,
        controls: Arc<Controls>,
        config_path: Option<PathBuf>,
        stop: watch::Receiver<bool>,
        access_log: AccessLogSlot,
    ) -> App {
        activate(&controls, &metrics, &snapshot);
        let given = Mutex::new(snapshot.config.clone());
        App {
            given,
            found: Mutex::default(),
            state: ArcSwap::from_pointee(snapshot),
            metrics,
            controls,
            config_path,
            stop,
            health: Mutex::new(Vec::new()),
            reloading: tokio::sync::Mutex::new(()),
            reload_budget: Mutex::new(ReloadBudget { tokens: RELOAD_BURST, since: tokio::time::Instant::now() }),
            fleet: Arc::new(crate::fleet::Fleet::new()),
            history: Default::default(),
            access_log,
            watchlist: Default::default(),
        }
    }

    /// The swap step (cannot fail): the long-lived parts take the new
    /// snapshot's parameters, then the snapshot is stored.
    fn install(&self, snapshot: Snapshot) {
        activate(&self.controls, &self.metrics, &snapshot);
        self.state.store(Arc::new(snapshot));
    }

    /// A handle for the admission publisher: the running config and the
    /// pools' admissions, read at each of its ticks.
    pub(crate) fn publisher_view(self: &Arc<Self>) -> Box<crate::admission::Current> {
        let app = Arc::downgrade(self);
        Box::new(move || match app.upgrade() {
            Some(app) => {
                let snap = app.snapshot();
                (snap.config.clone(), snap.pools.iter().map(|r| r.admission.clone()).collect())
            }
            None => (Arc::new(Config::default()), Vec::new()),
        })
    }

    /// A handle for the fleet task: the running config, the pools'
    /// admissions and the admin token to show peers.
    pub(crate) fn fleet_view(self: &Arc<Self>) -> Box<crate::fleet::Current> {
        let app = Arc::downgrade(self);
        Box::new(move || match app.upgrade() {
            Some(app) => {
                let snap = app.snapshot();
                crate::fleet::View {
                    config: snap.config.clone(),
                    pools: snap.pools.iter().map(|r| r.admission.clone()).collect(),
                    bearer: snap.admin_token.as_ref().and_then(|t| t.bearer().cloned()),
                    controls: Some(app.controls.clone()),
                }
            }
            None => crate::fleet::View { config: Arc::new(Config::default()), pools: Vec::new(), bearer: None, controls: None },
        })
    }

    /// The current snapshot; hold it for the whole request.
    pub(crate) fn snapshot(&self) -> Arc<Snapshot> {
        self.state.load_full()
    }

    /// (Re)start health checks for the current snapshot's replicas, and
    /// the followers of their KV events (exact prefix routing).
    pub(crate) fn start_health_checks(&self) {
        let snap = self.snapshot();
        let mut tasks = Vec::new();
        for r in &snap.pools {
            tasks.extend(crate::upstream::health::spawn(r.pool.clone(), self.stop.clone()));
            if let Some(exact) = &r.pool.exact {
                tasks.extend(exact.spawn(&self.stop));
            }
        }
        let old = match self.health.lock() {
            Ok(mut h) => std::mem::replace(&mut *h, tasks),
            Err(_) => Vec::new(),
        };
        for t in old {
            t.abort();
        }
    }

    pub(crate) fn stop_health_checks(&self) {
        if let Ok(mut h) = self.health.lock() {
            for t in h.drain(..) {
                t.abort();
            }
        }
    }

    /// Read the config file again, validate it, build a whole new snapshot,
    /// then swap it in. On any problem the running config stays, the error
    /// is logged and `config_reload_failures_total` goes up.
    /// More than [`RELOAD_BURST`] reloads in a row, faster than one per
    /// [`RELOAD_EVERY`], are refused ([`ReloadError::TooSoon`]).
    pub(crate) async fn reload(&self) -> Result<(), ReloadError> {
        let allowed = self.reload_budget.lock().unwrap_or_else(|p| p.into_inner()).take(tokio::time::Instant::now());
        if let Err(retry_after) = allowed {
            tracing::warn!(?retry_after, "reload refused: too many reloads in a row");
            return Err(ReloadError::TooSoon { retry_after });
        }
        let _one = self.reloading.lock().await;
        let result = self.try_reload();
        match &result {
            Ok(()) => {
                self.metrics.reloads.inc();
                tracing::info!(path = ?self.config_path, "config reloaded");
            }
            Err(e) => {
                self.metrics.reload_failures.inc();
                tracing::error!(path = ?self.config_path, error = %e, "config reload rejected; the running config stays");
            }
        }
        result
    }

    /// The config as given, before the replicas found in DNS.
    pub(crate) fn given(&self) -> Arc<Config> {
        self.given.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Pool `pool`'s `replicas_dns` names `urls` now: when that changed,
    /// the pools are built again with them (new replicas probed before
    /// they take requests, gone ones drained), as a reload would.
    pub(crate) async fn found_replicas(&self, pool: &str, urls: Vec<String>) -> Result<bool, ReloadError> {
        let _one = self.reloading.lock().await;
        {
            let mut found = self.found.lock().unwrap_or_else(|p| p.into_inner());
            if found.get(pool) == Some(&urls) {
                return Ok(false);
            }
            found.insert(pool.to_string(), urls);
        }
        let config = self.with_found(&self.given());
        self.rebuild(config, None)?;
        Ok(true)
    }

    /// `config` with the replicas found in DNS added to the pools that look for them.
    fn with_found(&self, config: &Config) -> Config {
        let mut config = config.clone();
        let found = self.found.lock().unwrap_or_else(|p| p.into_inner());
        for pool in config.pools.iter_mut().filter(|p| p.replicas_dns.is_some()) {
            for url in found.get(&pool.name).into_iter().flatten() {
                if !pool.replicas.iter().any(|r| r.url.trim_end_matches('/') == url) {
                    pool.replicas.push(url.as_str().into());
                }
            }
        }
        config
    }

    fn try_reload(&self) -> Result<(), ReloadError> {
        let path = self.config_path.as_ref().ok_or(ReloadError::NoConfigFile)?;
        let config = Config::load(path)?;
        *self.given.lock().unwrap_or_else(|p| p.into_inner()) = Arc::new(config.clone());
        self.rebuild(self.with_found(&config), Some(path))
    }

    /// Build a whole new snapshot of `config` and swap it in (`path`: the
    /// file it was read from, whose access log is reopened).
    fn rebuild(&self, config: Config, path: Option<&std::path::Path>) -> Result<(), ReloadError> {
        let old = self.snapshot();
        if config.server.listen != old.config.server.listen || config.server.admin_listen != old.config.server.admin_listen {
            tracing::warn!("server.listen / server.admin_listen changes take effect at the next restart");
        }
        if config.server.busy_poll != old.config.server.busy_poll || config.server.short_sched_slice != old.config.server.short_sched_slice
        {
            tracing::warn!("server.busy_poll and server.short_sched_slice changes take effect at the next restart");
        }
        let new = Snapshot::prepare(config, &self.metrics, &self.controls, Some(&old))?;
        let kept: std::collections::HashSet<(String, String)> =
            new.pools.iter().flat_map(|r| r.pool.replicas.iter().map(|x| (r.pool.config.name.clone(), x.label().to_string()))).collect();
        self.install(new);
        self.start_health_checks();
        // SIGHUP and reload reopen the access log's file (logrotate moved it).
        if let Some(path) = path {
            self.access_log.configure(
                self.snapshot().config.telemetry.access_log.as_ref(),
                path.parent(),
                &self.metrics.access_log_dropped,
            );
        }
        // Series of replicas that are gone.
        for p in old.pools.iter().map(|r| &r.pool) {
            for r in &p.replicas {
                if !kept.contains(&(p.config.name.clone(), r.label().to_string())) {
                    let l = ReplicaLabels { pool: p.config.name.clone(), replica: r.label().to_string() };
                    self.metrics.inflight.remove(&l);
                    self.metrics.upstream_healthy.remove(&l);
                    self.metrics.replica_limit.remove(&l);
                    self.metrics.replica_batch_cut.remove(&l);
                }
            }
        }
        let live = self.snapshot();
        self.metrics.kv_feeds.retain(|name| live.pools.iter().any(|r| r.pool.config.name == name));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::config::{ClassConfig, Dur, KeyConfig, Tier};

    fn running(config: &Config) -> (App, Arc<Metrics>, Arc<Controls>) {
        let metrics = Arc::new(Metrics::new(config));
        let controls = Arc::new(Controls::new(metrics.clone()));
        let snap = Snapshot::prepare(config.clone(), &metrics, &controls, None).expect("prepare");
        let (_stop, rx) = watch::channel(false);
        (App::new(snap, metrics.clone(), controls.clone(), None, rx, AccessLogSlot::default()), metrics, controls)
    }

    /// Everything a reload could change, as the running gateway has it.
    fn live(app: &App, controls: &Controls) -> (Duration, Duration, Duration, usize, Vec<String>) {
        let snap = app.snapshot();
        let chat = snap.classifier.class("chat").expect("chat").control.clone();
        let admission = &snap.pools[0].admission;
        (
            chat.ttft_target(),
            admission.timeout(Tier::Interactive),
            admission.timeout(Tier::Batch),
            Arc::strong_count(&admission.pool()),
            controls.all().iter().map(|c| c.name.to_string()).collect(),
        )
    }

    #[tokio::test]
    async fn a_failed_or_discarded_prepare_leaves_the_running_state_as_it_was() {
        let config = Config::default();
        let (app, metrics, controls) = running(&config);
        let before = live(&app, &controls);
        let exposition = metrics.encode();

        // A new config that changes every long-lived part: a class's target,
        // the tiers, a new class, the breaker; and a key that cannot be read.
        let mut next = config.clone();
        next.classes.insert("chat".into(), ClassConfig { ttft: Dur::millis(120), ..config.classes["chat"].clone() });
        next.classes.insert("search".into(), config.classes["chat"].clone());
        next.tiers.interactive.queue_timeout = Dur::secs(7);
        next.tiers.batch.queue_timeout = Dur::secs(9);
        next.breaker.trip_ratio = 5.0;
        next.auth.keys = vec![KeyConfig {
            name: "k".into(),
            key_env: Some("SLOGATE_TEST_KEY_THAT_IS_NEVER_SET".into()),
            key_sha256: None,
            classes: vec!["chat".into()],
            weight: 1.0,
            limits: None,
            models: None,
            endpoints: None,
            cache_isolation: None,
        }];
        let old = app.snapshot();
        let failed = Snapshot::prepare(next.clone(), &metrics, &controls, Some(&old));
        let Err(e) = failed else { panic!("a key that cannot be read must fail the prepare") };
        assert!(
            matches!(&e, PrepareError::Keys(crate::classify::KeyError::EnvUnset { var, .. }) if var == "SLOGATE_TEST_KEY_THAT_IS_NEVER_SET"),
            "{e:?}"
        );
        assert!(std::error::Error::source(&e).is_some_and(|s| s.is::<std::env::VarError>()), "the cause is kept: {e:?}");
        assert_eq!(e.to_string(), "auth key `k`: environment variable SLOGATE_TEST_KEY_THAT_IS_NEVER_SET is not set");
        assert_eq!(live(&app, &controls), before, "a failed prepare changed the running state");
        assert_eq!(metrics.encode(), exposition, "a failed prepare changed the metrics");

        // Prepared and thrown away: still nothing live changes.
        next.auth.keys.clear();
        let discarded = Snapshot::prepare(next.clone(), &metrics, &controls, Some(&old)).expect("prepare");
        assert_eq!(live(&app, &controls), before, "a prepare changed the running state before the swap");
        drop(discarded);
        assert_eq!(live(&app, &controls), before);

        // The swap is what applies it.
        let prepared = Snapshot::prepare(next, &metrics, &controls, Some(&old)).expect("prepare");
        app.install(prepared);
        let (ttft, interactive, batch, _, classes) = live(&app, &controls);
        assert_eq!((ttft, interactive, batch), (Duration::from_millis(120), Duration::from_secs(7), Duration::from_secs(9)));
        assert!(classes.contains(&"search".to_string()));
    }

    /// Prepare builds the whole snapshot and touches nothing live: a kept
    /// replica whose position moved is not renamed, a new replica, a new
    /// class and a changed limit store make no series, and the store starts
    /// no worker. Install does all of it.
    #[tokio::test]
    async fn prepare_renames_nothing_makes_no_series_and_starts_no_store_until_install() {
        let mut config = Config::default();
        config.pools[0].replicas = vec!["http://127.0.0.1:9/kept".into()];
        let (app, metrics, controls) = running(&config);
        let old = app.snapshot();
        let kept = old.pools[0].pool.replicas[0].clone();
        let pool = config.pools[0].name.clone();
        assert_eq!(kept.public_name(), format!("{pool}-1").as_str());
        let exposition = metrics.encode();
        assert!(exposition.contains("slogate_limits_store_up 0"), "{exposition}");

        let mut next = config.clone();
        next.pools[0].replicas = vec!["http://127.0.0.1:9/new".into(), "http://127.0.0.1:9/kept".into()];
        next.classes.insert("search".into(), config.classes["chat"].clone());
        next.limits.redis = Some("redis://127.0.0.1:1".into());
        let prepared = Snapshot::prepare(next.clone(), &metrics, &controls, Some(&old)).expect("prepare");
        assert!(Arc::ptr_eq(&prepared.pools[0].pool.replicas[1], &kept), "the replica is kept, not rebuilt");
        assert_eq!(kept.public_name(), format!("{pool}-1").as_str(), "renamed before the swap");
        assert_eq!(metrics.encode(), exposition, "prepare made series or started the store");
        drop(prepared);
        assert_eq!(metrics.encode(), exposition);

        app.install(Snapshot::prepare(next, &metrics, &controls, Some(&old)).expect("prepare"));
        assert_eq!(kept.public_name(), format!("{pool}-2").as_str(), "renamed at the swap");
        let after = metrics.encode();
        assert!(after.contains("replica=\"http://127.0.0.1:9/new\""), "the new replica's series at the swap: {after}");
        assert!(after.contains("class=\"search\""), "the new class's series at the swap");
        assert!(after.contains("slogate_limits_store_up 1"), "the store's worker started at the swap");
    }

    /// Ten reloads back to back, then one per 200 ms; a quiet spell refills
    /// the burst. The refusal says when to come back and reads nothing.
    #[tokio::test(start_paused = true)]
    async fn reloads_are_rate_limited_to_a_burst_then_one_per_interval() {
        let (app, _, _) = running(&Config::default());
        for i in 0..RELOAD_BURST {
            assert!(matches!(app.reload().await, Err(ReloadError::NoConfigFile)), "reload {i} runs");
        }
        match app.reload().await {
            Err(ReloadError::TooSoon { retry_after }) => assert_eq!(retry_after, RELOAD_EVERY),
            other => panic!("the 11th in a row is refused: {other:?}"),
        }
        tokio::time::advance(Duration::from_millis(150)).await;
        assert!(matches!(app.reload().await, Err(ReloadError::TooSoon { retry_after }) if retry_after == Duration::from_millis(50)));
        tokio::time::advance(Duration::from_millis(50)).await;
        assert!(matches!(app.reload().await, Err(ReloadError::NoConfigFile)), "one more after the interval");
        assert!(matches!(app.reload().await, Err(ReloadError::TooSoon { .. })));
        tokio::time::advance(RELOAD_EVERY * RELOAD_BURST * 3).await;
        for i in 0..RELOAD_BURST {
            assert!(matches!(app.reload().await, Err(ReloadError::NoConfigFile)), "after a quiet spell, reload {i} runs");
        }
        assert!(matches!(app.reload().await, Err(ReloadError::TooSoon { .. })), "the burst refills to its size, not more");
    }
}
