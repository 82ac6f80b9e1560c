//! Several instances in front of the same replicas (`fleet`): every
//! instance reads the others' state from their admin listeners
//! (`GET /fleet.json`) every `fleet.period` and takes its part of each
//! replica's slots ([`split`]). A peer unheard keeps its part until it is
//! taken for dead. No external store, and the split never blocks a request:
//! it only moves the replicas' slot counts, which the request path reads as
//! atomics. The rules are docs/design/fleet.md's.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::hash::{BuildHasher, Hasher};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::admission::seats::{FleetWord, Reserve, DEMAND_WINDOW};
use crate::admission::PoolAdmission;
use crate::config::{Config, FleetConfig};
use crate::telemetry::metrics::{FleetPeerLabels, Metrics, ReplicaLabels};

mod prefix;
mod split;
mod wire;

pub(crate) use split::{interactive_scale, reserve_part, split, standing, Local, Standing};
pub(crate) use wire::{PeerView, PoolState, ReplicaState, State};

/// Where an instance's state is served on its admin listener.
pub(crate) const STATE_PATH: &str = "/fleet.json";
/// How often `fleet.peers_dns` is resolved again.
const RESOLVE_EVERY: Duration = Duration::from_secs(1);
/// The longest a read of [`STATE_PATH`] is held for news (`?wait_ms=`).
const HOLD_AT_MOST: Duration = Duration::from_secs(1);

/// What the fleet task reads at each tick.
pub(crate) struct View {
    pub(crate) config: Arc<Config>,
    pub(crate) pools: Vec<Arc<PoolAdmission>>,
    /// `Authorization` for the peers' admin listeners (`server.admin_token_env`).
    pub(crate) bearer: Option<http::HeaderValue>,
    /// Where the keys' limits are split among the live instances.
    pub(crate) controls: Option<Arc<crate::admission::Controls>>,
}

pub(crate) type Current = dyn Fn() -> View + Send + Sync;

/// This instance's membership: its id and its peers.
pub(crate) struct Fleet {
    id: String,
    peers: Mutex<HashMap<String, Arc<Peer>>>,
    /// Per pool: the fleet's interactive requests (holding or waiting, all
    /// instances heard) at each tick of the last [`DEMAND_WINDOW`].
    interactive: Mutex<HashMap<String, std::collections::VecDeque<(Instant, usize)>>>,
    /// A peer's read came back early with news: the parts are computed
    /// again now, not at the next period (rule 15).
    news: Arc<tokio::sync::Notify>,
}

/// One other instance (or this one, reached by its address).
struct Peer {
    address: String,
    /// When it became a peer (a never-heard peer is lost from here).
    since: Instant,
    heard: Mutex<Heard>,
    poller: Mutex<Option<JoinHandle<()>>>,
}

#[derive(Default)]
struct Heard {
    at: Option<Instant>,
    state: Option<Arc<State>>,
    /// It answered with this instance's id.
    is_self: bool,
    error: Option<String>,
}

impl Fleet {
    pub(crate) fn new() -> Fleet {
        // A random id (the standard library's hasher seeds are random per process).
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u32(std::process::id());
        Fleet { id: format!("{:016x}", h.finish()), peers: Mutex::new(HashMap::new()), interactive: Mutex::default(), news: Arc::default() }
    }

    /// A peer's read of this instance's state, held for at most `wait` (and
    /// [`HOLD_AT_MOST`]) until one of `pools` has news for it (rule 15), or
    /// not at all where news came since the count it last saw (`seen`).
    /// True when news ended it.
    pub(crate) async fn hold(pools: &[Arc<PoolAdmission>], wait: Duration, seen: Option<u64>) -> bool {
        // Watched before the count is read: news between the two is not lost.
        let waits: Vec<_> = pools
            .iter()
            .map(|a| {
                let mut news = a.news();
                Box::pin(async move { news.changed().await.is_ok() })
            })
            .collect();
        if seen.is_some_and(|n| n != news_count(pools)) {
            return true;
        }
        let wait = tokio::time::sleep(wait.min(HOLD_AT_MOST));
        if waits.is_empty() {
            wait.await;
            return false;
        }
        tokio::select! {
            (told, _, _) = futures_util::future::select_all(waits) => told,
            _ = wait => false,
        }
    }

    pub(crate) fn id(&self) -> &str {
        &self.id
    }

    /// This instance's state now (with its peers, for people, when
    /// `with_peers`; with its prefix-aware pools' routing decisions
    /// numbered after `since`, for a peer that asks).
    pub(crate) fn state(&self, pools: &[Arc<PoolAdmission>], config: &FleetConfig, with_peers: bool, since: Option<u64>) -> State {
        let sent_seq = prefix::last_seq();
        let news = news_count(pools);
        let pools = pools
            .iter()
            .map(|a| {
                let pool = a.pool();
                let d = a.demand();
                let (block, sent) = prefix::sent(&pool, since);
                let owned = prefix::owned(&pool, since);
                PoolState {
                    name: pool.config.name.clone(),
                    interactive: d.interactive,
                    interactive_now: d.interactive_now,
                    batch: d.batch,
                    batch_held: a.batch_inflight(),
                    waiting: d.waiting,
                    interactive_waiting: a.interactive_waiting(),
                    replicas: pool
                        .replicas
                        .iter()
                        .map(|r| ReplicaState {
                            url: r.url.clone(),
                            healthy: r.is_healthy(),
                            inflight: r.inflight(),
                            limit: r.max_inflight(),
                            slots: r.slots(),
                        })
                        .collect(),
                    block,
                    sent,
                    owned,
                }
            })
            .collect();
        let peers = if with_peers { self.peer_views(config, Instant::now()) } else { Vec::new() };
        State { id: self.id.clone(), pools, sent_seq, peers, woken: false, news }
    }

    /// The peers as they stand now (for the status page).
    pub(crate) fn peers(&self, config: &FleetConfig) -> Vec<PeerView> {
        self.peer_views(config, Instant::now())
    }

    fn peer_views(&self, config: &FleetConfig, now: Instant) -> Vec<PeerView> {
        let mut out: Vec<PeerView> = self
            .all_peers()
            .iter()
            .map(|p| {
                let h = p.heard.lock().unwrap_or_else(|e| e.into_inner());
                let status = if h.is_self { "self" } else { standing(config, p.since, h.at.zip(h.state.as_ref()), now).name() };
                PeerView {
                    address: p.address.clone(),
                    status: status.to_string(),
                    id: h.state.as_ref().map(|s| s.id.clone()),
                    last_heard_ms: h.at.map(|t| now.saturating_duration_since(t).as_millis() as u64),
                    error: h.error.clone(),
                }
            })
            .collect();
        out.sort_by(|a, b| a.address.cmp(&b.address));
        out
    }

    fn all_peers(&self) -> Vec<Arc<Peer>> {
        self.peers.lock().unwrap_or_else(|e| e.into_inner()).values().cloned().collect()
    }

    /// Make the peers exactly `addresses` (admin base URLs): new ones get a
    /// poller, ones no longer listed are forgotten.
    fn set_peers(self: &Arc<Self>, addresses: &[String], current: &Arc<Current>, stop: &watch::Receiver<bool>) {
        let mut peers = self.peers.lock().unwrap_or_else(|e| e.into_inner());
        peers.retain(|address, p| {
            let keep = addresses.contains(address);
            if !keep {
                if let Some(t) = p.poller.lock().unwrap_or_else(|e| e.into_inner()).take() {
                    t.abort();
                }
            }
            keep
        });
        for address in addresses {
            if peers.contains_key(address) {
                continue;
            }
            let Ok(base) = crate::config::parse_peer_url(address) else { continue };
            let peer =
                Arc::new(Peer { address: address.clone(), since: Instant::now(), heard: Mutex::default(), poller: Mutex::new(None) });
            let task = tokio::spawn(poll(self.id.clone(), peer.clone(), base, current.clone(), self.news.clone(), stop.clone()));
            *peer.poller.lock().unwrap_or_else(|e| e.into_inner()) = Some(task);
            peers.insert(address.clone(), peer);
        }
    }

    /// One tick: every pool's replicas take this instance's part of them.
    pub(crate) fn allocate(&self, view: &View, now: Instant, metrics: &Metrics) {
        let config = &view.config.fleet;
        let mut standings = Vec::new();
        let mut counts: HashMap<&'static str, i64> = [("fresh", 0), ("lost", 0), ("gone", 0)].into_iter().collect();
        for p in self.all_peers() {
            let h = p.heard.lock().unwrap_or_else(|e| e.into_inner());
            if h.is_self {
                continue;
            }
            let s = standing(config, p.since, h.at.zip(h.state.as_ref()), now);
            *counts.entry(s.name()).or_default() += 1;
            standings.push(s);
        }
        // Keys' limits are split among this instance and the peers not
        // taken for gone (a lost one may still serve its part).
        let live = 1 + standings.iter().filter(|s| !matches!(s, Standing::Gone)).count();
        if let Some(c) = &view.controls {
            c.tenants.set_instances(live);
        }
        for (state, n) in counts {
            metrics.fleet_peers.get_or_create(&FleetPeerLabels { state: state.to_string() }).set(n);
        }
        for a in &view.pools {
            let pool = a.pool();
            let locals: Vec<(&str, Local)> = pool
                .replicas
                .iter()
                .map(|r| {
                    let local =
                        Local { healthy: r.is_healthy(), inflight: r.inflight(), limit: r.max_inflight(), scraped: r.scraped_total() };
                    (r.url.as_str(), local)
                })
                .collect();
            let fresh: Vec<(&str, &PoolState)> = standings
                .iter()
                .filter_map(|s| match s {
                    Standing::Fresh(s) => s.pools.iter().find(|p| p.name == pool.config.name).map(|p| (s.id.as_str(), p)),
                    _ => None,
                })
                .collect();
            let own = a.demand();
            // Peaks of separate instances rarely coincide: the fleet's peak
            // is the peak of their sum, and its reservation follows that.
            // The slots are split by each one's peak scaled so that together
            // they count for the reservation, and the reservation is parted
            // by their demand.
            let now_total = own.interactive_now + fresh.iter().map(|p| p.1.interactive_now).sum::<usize>();
            let peaks = own.interactive + fresh.iter().map(|p| p.1.interactive).sum::<usize>();
            let fleet_peak = self.fleet_peak(&pool.config.name, now_total, now);
            // The fleet's slots are its limits' (rule 4), not this
            // instance's own: batch past its part counts against them.
            let fleet_slots: usize =
                locals.iter().filter(|(_, l)| l.healthy).map(|(url, l)| split::fleet_limit(url, l.limit, fresh.iter().map(|p| p.1))).sum();
            let weights: Vec<(&str, usize)> =
                std::iter::once((self.id.as_str(), own.interactive)).chain(fresh.iter().map(|(id, p)| (*id, p.interactive))).collect();
            let whole = a.fleet_reservation(fleet_slots, fleet_peak);
            let scale = interactive_scale(whole.normal, peaks);
            let part = reserve_part(whole, &weights);
            let others_interactive = fresh.iter().map(|p| p.1.interactive_now).sum();
            pool.set_others_reserve_free(reserve_free(whole, part, others_interactive));
            a.set_fleet((fleet_slots > 0).then(|| FleetWord {
                slots: fleet_slots,
                whole,
                part,
                others_interactive,
                others_batch: fresh.iter().map(|p| p.1.batch_held).sum(),
                period: config.period.get(),
            }));
            let parts = split(&self.id, own, &locals, &standings, &pool.config.name, scale);
            let chat_waits = fresh.iter().map(|p| p.1.interactive_waiting).sum();
            a.set_others_wait(chat_waits > 0);
            set_parts(a, &pool, &parts, chat_waits, metrics);
            pool.set_others_waiting(fresh.iter().map(|p| p.1.waiting).sum());
        }
        // Slots may have appeared: hand them out.
        for a in &view.pools {
            a.dispatch();
        }
    }

    /// The fleet's interactive peak for `pool` over [`DEMAND_WINDOW`], with `total` now.
    fn fleet_peak(&self, pool: &str, total: usize, now: Instant) -> usize {
        let mut all = self.interactive.lock().unwrap_or_else(|e| e.into_inner());
        let w = all.entry(pool.to_string()).or_default();
        w.push_back((now, total));
        while w.front().is_some_and(|(t, _)| now.saturating_duration_since(*t) > DEMAND_WINDOW) {
            w.pop_front();
        }
        w.iter().map(|(_, n)| *n).max().unwrap_or(total)
    }

    /// Alone again (the fleet was configured away): every replica's slots are its limit.
    fn leave(&self, view: &View, metrics: &Metrics) {
        self.set_peers_empty();
        prefix::journal(&view.pools, false, std::time::Duration::ZERO);
        if let Some(c) = &view.controls {
            c.tenants.set_instances(1);
        }
        if let Ok(mut w) = self.interactive.lock() {
            w.clear();
        }
        for a in &view.pools {
            a.set_fleet(None);
            let pool = a.pool();
            for r in &pool.replicas {
                r.set_fleet_share(None);
                let labels = ReplicaLabels { pool: pool.config.name.clone(), replica: r.label().to_string() };
                metrics.replica_slots.get_or_create(&labels).set(r.slots() as i64);
            }
            pool.set_others_waiting(0);
            pool.set_others_reserve_free(0);
            a.set_others_wait(false);
        }
    }

    fn set_peers_empty(&self) {
        for (_, p) in self.peers.lock().unwrap_or_else(|e| e.into_inner()).drain() {
            if let Some(t) = p.poller.lock().unwrap_or_else(|e| e.into_inner()).take() {
                t.abort();
            }
        }
    }
}

/// Seats of the others' reserved parts (the fleet's `whole` reservation
/// less this instance's `part`) that their interactive requests neither
/// hold nor wait for: their waiting batch does not fill them, so an
/// interactive request here may take one at once (rule 9).
fn reserve_free(whole: Reserve, part: Reserve, others_interactive: usize) -> usize {
    whole.normal.saturating_sub(part.normal).saturating_sub(others_interactive)
}

/// The news `pools` told so far, together (wrapping).
fn news_count(pools: &[Arc<PoolAdmission>]) -> u64 {
    pools.iter().fold(0u64, |n, a| n.wrapping_add(a.news_count()))
}

/// This instance's `parts` of `pool`'s replicas take effect. Seats it holds
/// past its part on a replica full as last heard, while `chat_waits`
/// interactive requests wait at the other instances, go back now, not as
/// its streams end (fleet.md rule 9).
fn set_parts(a: &PoolAdmission, pool: &crate::upstream::Pool, parts: &[split::Part], chat_waits: usize, metrics: &Metrics) {
    for (r, part) in pool.replicas.iter().zip(parts) {
        r.set_fleet_share(Some((part.slots, part.others)));
        r.set_fleet_limit(part.limit);
        let labels = ReplicaLabels { pool: pool.config.name.clone(), replica: r.label().to_string() };
        metrics.replica_slots.get_or_create(&labels).set(part.slots as i64);
        if chat_waits > 0
            && r.inflight() + part.others >= part.limit
            && a.preempt_for_peers(r, r.inflight().saturating_sub(part.slots).min(chat_waits))
        {
            tracing::info!(pool = %pool.config.name, replica = %r.label(), "a batch stream held past this instance's part asked for its slot: another instance's interactive request waits");
        }
    }
}

/// Read one peer's state every `fleet.period` until it is forgotten or the
/// gateway stops. Each read asks the peer to hold it for the period and
/// answer early with news (rule 15): such an answer has the parts computed
/// again at once, through `news`, and the next read sent at once.
async fn poll(
    own_id: String,
    peer: Arc<Peer>,
    base: http::Uri,
    current: Arc<Current>,
    news: Arc<tokio::sync::Notify>,
    mut stop: watch::Receiver<bool>,
) {
    // The last of its routing decisions read (see [`prefix::take_in`]).
    let mut read = 0u64;
    // The count of its news in its last answer.
    let mut seen: Option<u64> = None;
    loop {
        let view = current();
        let config = view.config.fleet.clone();
        drop(view.pools);
        let timeout = config.peer_timeout.get() / 2;
        let sent = Instant::now();
        let is_self = peer.heard.lock().unwrap_or_else(|e| e.into_inner()).is_self;
        // Held for the period, well inside the timeout; this instance's own
        // state is read at once.
        let hold = if is_self { Duration::ZERO } else { config.period.get().min(timeout / 2) };
        let mut path = format!("{STATE_PATH}?since={read}&wait_ms={}", hold.as_millis());
        if let Some(n) = seen {
            let _ = write!(path, "&news={n}");
        }
        let answer = crate::upstream::conn::get_once(&base, &path, view.bearer.as_ref(), timeout + hold).await;
        let now = Instant::now();
        let heard = match answer {
            Ok((status, body)) if status.is_success() => {
                serde_json::from_slice::<State>(&body).map_err(|e| format!("GET {STATE_PATH}: not a fleet state: {e}"))
            }
            Ok((status, _)) => Err(format!("GET {STATE_PATH} answered {status}")),
            Err(e) => Err(e),
        };
        // Its routing decisions go into the indexes, outside the lock, and
        // are not kept with its state.
        let heard = heard.map(|mut state| {
            if state.id != own_id {
                prefix::take_in(&current().pools, &state, &mut read);
            }
            state.pools.iter_mut().for_each(|p| {
                p.sent = Vec::new();
                p.owned = Vec::new();
            });
            state
        });
        let woken = matches!(&heard, Ok(state) if state.woken && state.id != own_id);
        if let Ok(state) = &heard {
            seen = Some(state.news);
        }
        {
            let mut h = peer.heard.lock().unwrap_or_else(|e| e.into_inner());
            match heard {
                Ok(state) => {
                    h.is_self = state.id == own_id;
                    h.at = Some(now);
                    h.state = Some(Arc::new(state));
                    h.error = None;
                }
                Err(e) => h.error = Some(e),
            }
        }
        // A peer that held the read answers at the period's end: the next
        // read goes at once. One that answers at once (itself, an older
        // instance, an error) is read again a period after this read.
        let next = if woken {
            news.notify_one();
            // News told without pause does not turn this into a busy loop.
            (sent + config.period.get() / 10).max(now)
        } else {
            (sent + config.period.get()).max(now)
        };
        tokio::select! {
            _ = tokio::time::sleep_until(next) => {}
            _ = stop.changed() => return,
        }
    }
}

/// The peers' admin URLs from `fleet.peers` and the last resolution of `fleet.peers_dns`.
fn addresses(config: &FleetConfig, resolved: &[std::net::SocketAddr]) -> Vec<String> {
    let mut out: Vec<String> = config.peers.iter().map(|p| p.trim().trim_end_matches('/').to_string()).collect();
    out.extend(resolved.iter().map(|a| format!("http://{a}")));
    out.sort();
    out.dedup();
    out
}

/// The fleet task: keep the peers as configured (and as `peers_dns`
/// resolves), and recompute this instance's part of the replicas every
/// `fleet.period`. Does nothing while no fleet is configured.
/// How often an instance with no peers configured looks at the config again.
const ALONE_CHECK: std::time::Duration = std::time::Duration::from_secs(1);

pub(crate) fn run(fleet: Arc<Fleet>, metrics: Arc<Metrics>, current: Box<Current>, mut stop: watch::Receiver<bool>) -> JoinHandle<()> {
    let current: Arc<Current> = Arc::from(current);
    let resolved: Arc<Mutex<Vec<std::net::SocketAddr>>> = Arc::default();
    let resolver = tokio::spawn(resolve(current.clone(), resolved.clone(), stop.clone()));
    tokio::spawn(async move {
        let mut joined = false;
        loop {
            let view = current();
            let config = view.config.fleet.clone();
            if !config.enabled() {
                if joined {
                    fleet.leave(&view, &metrics);
                    joined = false;
                    tracing::info!("fleet: no peers configured; this instance is alone");
                }
            } else {
                if !joined {
                    tracing::info!(id = fleet.id(), peers = ?config.peers, peers_dns = ?config.peers_dns, "fleet: joining");
                }
                joined = true;
                let dns = if config.peers_dns.is_some() { resolved.lock().unwrap_or_else(|e| e.into_inner()).clone() } else { Vec::new() };
                fleet.set_peers(&addresses(&config, &dns), &current, &stop);
                prefix::journal(&view.pools, true, config.period.get());
                fleet.allocate(&view, Instant::now(), &metrics);
            }
            drop(view);
            // Alone, it only looks for a reload that names peers.
            let wait = if config.enabled() { config.period.get() } else { ALONE_CHECK.max(config.period.get()) };
            let tick = Instant::now() + wait;
            loop {
                tokio::select! {
                    _ = tokio::time::sleep_until(tick) => break,
                    // A peer's news: the parts follow it now (rule 15).
                    _ = fleet.news.notified(), if joined => fleet.allocate(&current(), Instant::now(), &metrics),
                    _ = stop.changed() => {
                        fleet.set_peers_empty();
                        resolver.abort();
                        return;
                    }
                }
            }
        }
    })
}

/// Resolve `fleet.peers_dns` every [`RESOLVE_EVERY`] into `into`. A failed
/// lookup keeps the last answer: a DNS hiccup does not drop members.
async fn resolve(current: Arc<Current>, into: Arc<Mutex<Vec<std::net::SocketAddr>>>, mut stop: watch::Receiver<bool>) {
    loop {
        let name = current().config.fleet.peers_dns.clone();
        if let Some(name) = name {
            let lookup = async {
                let (host, port) = crate::config::parse_host_port(&name).map_err(std::io::Error::other)?;
                let addrs: Vec<std::net::SocketAddr> = tokio::net::lookup_host((host.as_str(), port)).await?.collect();
                Ok::<_, std::io::Error>(addrs)
            };
            match tokio::time::timeout(RESOLVE_EVERY * 5, lookup).await {
                Ok(Ok(mut addrs)) => {
                    addrs.sort();
                    addrs.dedup();
                    *into.lock().unwrap_or_else(|e| e.into_inner()) = addrs;
                }
                Ok(Err(e)) => tracing::warn!(name, error = %e, "fleet: cannot resolve fleet.peers_dns; keeping the last answer"),
                Err(_) => tracing::warn!(name, "fleet: fleet.peers_dns did not resolve in time; keeping the last answer"),
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(RESOLVE_EVERY) => {}
            _ = stop.changed() => return,
        }
    }
}
