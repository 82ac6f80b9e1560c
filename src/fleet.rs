//! Several instances in front of the same replicas (`fleet`).
//!
//! Each instance alone would fill every replica to its limit: three of them
//! put three times the work on the replicas, and batch from one instance
//! queues inside vLLM ahead of chat from another. With `fleet.peers` or
//! `fleet.peers_dns`, every instance reads the others' state from their
//! admin listeners (`GET /fleet.json`, with the admin token when one is
//! set) every `fleet.period` and takes its part of each replica's slots:
//!
//! - a replica's limit is the smallest any instance learned for it (or the
//!   fixed one), and each instance's learned limit counts every instance's
//!   requests on the replica;
//! - the slots are split by demand, interactive first: each instance's
//!   interactive demand (what its reservation follows) is met before any
//!   batch, then batch demand, the rest evenly. An instance gets at least
//!   one slot per healthy replica, so its first request never waits for
//!   the next exchange;
//! - a peer not heard for `peer_timeout` is lost: it keeps what it last
//!   held, at least an equal share, and what the replicas say they run
//!   beyond the instances heard from counts too (never over-admitting while
//!   a peer is merely unreachable). After `takeover_after` it is taken for
//!   dead: its share goes to the others, except what the replicas still run
//!   for it (a dead instance's streams end with its connections, so they
//!   let go within a scrape). A peer that answers again is counted as
//!   before; one that leaves the DNS name is forgotten.
//!
//! No external store: each instance's state is small (a few numbers per
//! replica) and every instance computes the same split from the same
//! inputs. The split never blocks a request: it only moves the replicas'
//! slot counts, which the request path reads as atomics.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::admission::queue::{Demand, DEMAND_MARGIN, DEMAND_WINDOW};
use crate::admission::PoolAdmission;
use crate::config::{Config, FleetConfig};
use crate::telemetry::metrics::{FleetPeerLabels, Metrics, ReplicaLabels};

/// An instance's interactive reservation scaled to its part of the fleet's
/// peak, never below what it has now.
fn scaled(reserve: usize, now: usize, scale: f64) -> usize {
    ((reserve as f64 * scale).ceil() as usize).max(now)
}

/// Where an instance's state is served on its admin listener.
pub(crate) const STATE_PATH: &str = "/fleet.json";
/// How often `fleet.peers_dns` is resolved again.
const RESOLVE_EVERY: Duration = Duration::from_secs(1);

/// What an instance tells its peers.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub(crate) struct State {
    pub(crate) id: String,
    pub(crate) pools: Vec<PoolState>,
    /// Its peers as it sees them (for people; peers do not read it).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) peers: Vec<PeerView>,
}

/// One pool of an instance's state.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub(crate) struct PoolState {
    pub(crate) name: String,
    /// Interactive requests it reserves for (its recent peak and more).
    pub(crate) interactive: usize,
    /// Interactive requests it has holding or waiting now.
    #[serde(default)]
    pub(crate) interactive_now: usize,
    /// Batch requests holding or waiting for a slot.
    pub(crate) batch: usize,
    /// Requests waiting in its queues.
    pub(crate) waiting: usize,
    pub(crate) replicas: Vec<ReplicaState>,
}

/// One replica, as an instance sees it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub(crate) struct ReplicaState {
    pub(crate) url: String,
    pub(crate) healthy: bool,
    /// Requests the instance has on it.
    pub(crate) inflight: usize,
    /// The replica's limit as the instance learned it (or the fixed one).
    pub(crate) limit: usize,
    /// The slots the instance may hold (its part of the limit).
    pub(crate) slots: usize,
}

/// A peer, for the status (`/fleet.json`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub(crate) struct PeerView {
    pub(crate) address: String,
    pub(crate) status: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) last_heard_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) error: Option<String>,
}

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

/// What a peer counts for at one moment.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Standing {
    /// Heard within `peer_timeout`.
    Fresh(Arc<State>),
    /// Not heard for `peer_timeout`, nor for `takeover_after`: keeps what it
    /// last said it held (if it ever said), at least an equal share.
    Lost(Option<Arc<State>>),
    /// Not heard for `takeover_after`: taken for dead.
    Gone,
}

impl Standing {
    fn name(&self) -> &'static str {
        match self {
            Standing::Fresh(_) => "fresh",
            Standing::Lost(_) => "lost",
            Standing::Gone => "gone",
        }
    }
}

/// How a peer heard at `heard` (never: `None`; a peer since `since`) stands at `now`.
pub(crate) fn standing(config: &FleetConfig, since: Instant, heard: Option<(Instant, &Arc<State>)>, now: Instant) -> Standing {
    let last = heard.map(|(t, _)| t).unwrap_or(since);
    let quiet = now.saturating_duration_since(last);
    match heard {
        Some((_, s)) if quiet < config.peer_timeout.get() => Standing::Fresh(s.clone()),
        _ if quiet < config.takeover_after.get() => Standing::Lost(heard.map(|(_, s)| s.clone())),
        _ => Standing::Gone,
    }
}

/// One replica as this instance sees it, for [`split`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Local {
    pub(crate) healthy: bool,
    pub(crate) inflight: usize,
    pub(crate) limit: usize,
    /// What the replica runs and queues for all its clients, when scraped.
    pub(crate) scraped: Option<u64>,
}

/// This instance's part of one replica: slots it may hold, and the
/// requests the others hold (or are assumed to).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Part {
    pub(crate) slots: usize,
    pub(crate) others: usize,
}

/// Share `capacity` among demands, smallest first: each gets its demand
/// or an equal part of what is left, whichever is less.
fn water_fill(capacity: f64, demands: &[f64]) -> Vec<f64> {
    let mut order: Vec<usize> = (0..demands.len()).collect();
    order.sort_by(|a, b| demands[*a].total_cmp(&demands[*b]));
    let mut left = capacity.max(0.0);
    let mut out = vec![0.0; demands.len()];
    for (k, &i) in order.iter().enumerate() {
        let give = demands[i].max(0.0).min(left / (demands.len() - k) as f64);
        out[i] = give;
        left -= give;
    }
    out
}

/// Each member's part of `capacity` slots (members' demands, this instance
/// first): interactive demand first, then batch, the rest evenly. Sums to
/// `capacity`.
pub(crate) fn shares(capacity: f64, demands: &[Demand]) -> Vec<f64> {
    if demands.is_empty() {
        return Vec::new();
    }
    let interactive = water_fill(capacity, &demands.iter().map(|d| d.interactive as f64).collect::<Vec<_>>());
    let rest = capacity - interactive.iter().sum::<f64>();
    let batch = water_fill(rest, &demands.iter().map(|d| d.batch as f64).collect::<Vec<_>>());
    let slack = (rest - batch.iter().sum::<f64>()).max(0.0) / demands.len() as f64;
    interactive.iter().zip(&batch).map(|(i, b)| i + b + slack).collect()
}

/// This instance's part of each of a pool's replicas (`replicas`: URL and
/// local view; `own`: its demand; `id`: its fleet id), given its peers'
/// standings (their states' pool of this name). Each replica's free slots
/// are divided among the heard instances by [`shares`], rounded so that the
/// parts add up to the slots (largest remainders first; every instance
/// ranks the same way, by id, rotating over the replicas). Every instance's
/// interactive reservation counts `scale` of itself (see [`scaled`]).
pub(crate) fn split(id: &str, own: Demand, replicas: &[(&str, Local)], peers: &[Standing], pool: &str, scale: f64) -> Vec<Part> {
    let pool_of = |s: &State| s.pools.iter().find(|p| p.name == pool).cloned().map(|p| (s.id.clone(), p));
    let fresh: Vec<(String, PoolState)> = peers.iter().filter_map(|p| if let Standing::Fresh(s) = p { pool_of(s) } else { None }).collect();
    let lost: Vec<Option<PoolState>> = peers
        .iter()
        .filter_map(|p| if let Standing::Lost(s) = p { Some(s.as_deref().and_then(pool_of).map(|x| x.1)) } else { None })
        .collect();
    let unheard = peers.iter().any(|p| !matches!(p, Standing::Fresh(_)));
    let members = 1 + fresh.len() + lost.len();
    let on = |p: &PoolState, url: &str| p.replicas.iter().find(|r| r.url == url).cloned();
    // Per replica: the slots the heard instances share, and what others hold.
    let mut free = Vec::with_capacity(replicas.len());
    for (url, r) in replicas {
        if !r.healthy {
            free.push((0usize, 0usize));
            continue;
        }
        let limit = fresh.iter().filter_map(|(_, p)| on(p, url)).filter(|x| x.healthy).map(|x| x.limit).fold(r.limit, usize::min);
        let heard: usize = fresh.iter().filter_map(|(_, p)| on(p, url)).map(|x| x.inflight).sum();
        let equal = limit.div_ceil(members);
        let claimed: usize =
            lost.iter().map(|p| p.as_ref().and_then(|p| on(p, url)).map_or(equal, |x| x.slots.min(limit).max(x.inflight).max(equal))).sum();
        // What the replica runs beyond the instances heard from: lost and dead
        // instances' requests (and any other client's).
        let beyond = if unheard { r.scraped.map_or(0, |t| (t as usize).saturating_sub(r.inflight + heard)) } else { 0 };
        let reserve = claimed.max(beyond);
        free.push((limit.saturating_sub(reserve), heard + reserve));
    }
    let capacity: usize = free.iter().map(|(f, _)| f).sum();
    let mut demands = vec![own];
    demands.extend(fresh.iter().map(|(_, p)| Demand {
        interactive: p.interactive,
        interactive_now: p.interactive_now,
        batch: p.batch,
        waiting: p.waiting,
    }));
    for d in &mut demands {
        d.interactive = scaled(d.interactive, d.interactive_now, scale);
    }
    let part = shares(capacity as f64, &demands);
    let n = demands.len();
    let fractions: Vec<f64> = if capacity == 0 { vec![1.0 / n as f64; n] } else { part.iter().map(|p| p / capacity as f64).collect() };
    // Members in id order (this instance is member 0).
    let mut by_id: Vec<(&str, usize)> = std::iter::once(id).chain(fresh.iter().map(|(i, _)| i.as_str())).zip(0..n).collect();
    by_id.sort();
    replicas
        .iter()
        .zip(free)
        .enumerate()
        .map(|(k, ((_, r), (f, others)))| {
            if !r.healthy {
                return Part { slots: 0, others };
            }
            let exact: Vec<f64> = fractions.iter().map(|x| f as f64 * x).collect();
            let floors: Vec<usize> = exact.iter().map(|e| (e + 1e-9).floor() as usize).collect();
            let left = f.saturating_sub(floors.iter().sum());
            // Rank members by remainder, then by id rotated by the replica's position.
            let mut rank: Vec<(usize, usize)> = by_id.iter().enumerate().map(|(pos, &(_, m))| ((pos + n - k % n) % n, m)).collect();
            rank.sort_by(|a, b| (exact[b.1] - floors[b.1] as f64).total_cmp(&(exact[a.1] - floors[a.1] as f64)).then(a.0.cmp(&b.0)));
            let extra = rank.iter().take(left).any(|&(_, m)| m == 0);
            Part { slots: (floors[0] + extra as usize).max(1), others }
        })
        .collect()
}

impl Fleet {
    pub(crate) fn new() -> Fleet {
        // A random id (the standard library's hasher seeds are random per process).
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u32(std::process::id());
        Fleet { id: format!("{:016x}", h.finish()), peers: Mutex::new(HashMap::new()), interactive: Mutex::default() }
    }

    pub(crate) fn id(&self) -> &str {
        &self.id
    }

    /// This instance's state now (with its peers, for people, when `with_peers`).
    pub(crate) fn state(&self, pools: &[Arc<PoolAdmission>], config: &FleetConfig, with_peers: bool) -> State {
        let pools = pools
            .iter()
            .map(|a| {
                let pool = a.pool();
                let d = a.demand();
                PoolState {
                    name: pool.config.name.clone(),
                    interactive: d.interactive,
                    interactive_now: d.interactive_now,
                    batch: d.batch,
                    waiting: d.waiting,
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
                }
            })
            .collect();
        let peers = if with_peers { self.peer_views(config, Instant::now()) } else { Vec::new() };
        State { id: self.id.clone(), pools, peers }
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
            let task = tokio::spawn(poll(self.id.clone(), peer.clone(), base, current.clone(), stop.clone()));
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
            let fresh: Vec<&PoolState> = standings
                .iter()
                .filter_map(|s| if let Standing::Fresh(s) = s { s.pools.iter().find(|p| p.name == pool.config.name) } else { None })
                .collect();
            let own = a.demand();
            // Peaks of separate instances rarely coincide: each reserves its
            // own peak scaled by the fleet's peak over the sum of the peaks.
            let now_total = own.interactive_now + fresh.iter().map(|p| p.interactive_now).sum::<usize>();
            let peaks = own.interactive + fresh.iter().map(|p| p.interactive).sum::<usize>();
            let fleet_peak = self.fleet_peak(&pool.config.name, now_total, now);
            let scale = if peaks == 0 { 1.0 } else { ((fleet_peak as f64 * DEMAND_MARGIN).ceil() / peaks as f64).min(1.0) };
            a.set_reservation_scale(scale);
            let fleet_slots: usize = pool.replicas.iter().filter(|r| r.is_healthy()).map(|r| r.max_inflight()).sum();
            a.set_fleet_interactive(fleet_slots, fresh.iter().map(|p| p.interactive_now).sum());
            let parts = split(&self.id, own, &locals, &standings, &pool.config.name, scale);
            for (r, part) in pool.replicas.iter().zip(parts) {
                r.set_fleet_share(Some((part.slots, part.others)));
                let labels = ReplicaLabels { pool: pool.config.name.clone(), replica: r.label().to_string() };
                metrics.replica_slots.get_or_create(&labels).set(part.slots as i64);
            }
            pool.set_others_waiting(fresh.iter().map(|p| p.waiting).sum());
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
        if let Some(c) = &view.controls {
            c.tenants.set_instances(1);
        }
        if let Ok(mut w) = self.interactive.lock() {
            w.clear();
        }
        for a in &view.pools {
            a.set_reservation_scale(1.0);
            a.set_fleet_interactive(0, 0);
            let pool = a.pool();
            for r in &pool.replicas {
                r.set_fleet_share(None);
                let labels = ReplicaLabels { pool: pool.config.name.clone(), replica: r.label().to_string() };
                metrics.replica_slots.get_or_create(&labels).set(r.slots() as i64);
            }
            pool.set_others_waiting(0);
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

/// Read one peer's state every `fleet.period` until it is forgotten or the
/// gateway stops.
async fn poll(own_id: String, peer: Arc<Peer>, base: http::Uri, current: Arc<Current>, mut stop: watch::Receiver<bool>) {
    let mut next = Instant::now();
    loop {
        let view = current();
        let config = view.config.fleet.clone();
        drop(view.pools);
        let timeout = config.peer_timeout.get() / 2;
        let answer = crate::upstream::conn::get_once(&base, STATE_PATH, view.bearer.as_ref(), timeout).await;
        let now = Instant::now();
        {
            let mut h = peer.heard.lock().unwrap_or_else(|e| e.into_inner());
            match answer {
                Ok((status, body)) if status.is_success() => match serde_json::from_slice::<State>(&body) {
                    Ok(state) => {
                        h.is_self = state.id == own_id;
                        h.at = Some(now);
                        h.state = Some(Arc::new(state));
                        h.error = None;
                    }
                    Err(e) => h.error = Some(format!("GET {STATE_PATH}: not a fleet state: {e}")),
                },
                Ok((status, _)) => h.error = Some(format!("GET {STATE_PATH} answered {status}")),
                Err(e) => h.error = Some(e),
            }
        }
        next = (next + config.period.get()).max(now);
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
                fleet.allocate(&view, Instant::now(), &metrics);
            }
            drop(view);
            tokio::select! {
                _ = tokio::time::sleep(config.period.get()) => {}
                _ = stop.changed() => {
                    fleet.set_peers_empty();
                    resolver.abort();
                    return;
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Dur;

    fn demand(interactive: usize, batch: usize) -> Demand {
        Demand { interactive, interactive_now: 0, batch, waiting: 0 }
    }

    fn local(limit: usize, inflight: usize, scraped: Option<u64>) -> Local {
        Local { healthy: true, inflight, limit, scraped }
    }

    /// A peer's state for pool `p`: per replica (URL, in-flight, limit, slots).
    fn peer(id: &str, d: Demand, replicas: &[(&str, usize, usize, usize)]) -> Arc<State> {
        Arc::new(State {
            id: id.into(),
            pools: vec![PoolState {
                name: "p".into(),
                interactive: d.interactive,
                interactive_now: d.interactive_now,
                batch: d.batch,
                waiting: d.waiting,
                replicas: replicas
                    .iter()
                    .map(|&(url, inflight, limit, slots)| ReplicaState { url: url.into(), healthy: true, inflight, limit, slots })
                    .collect(),
            }],
            peers: Vec::new(),
        })
    }

    #[test]
    fn interactive_demand_is_met_first_then_batch_then_the_rest_evenly() {
        let s = shares(10.0, &[demand(2, 100), demand(6, 0), demand(0, 1)]);
        assert_eq!(s, vec![3.0, 6.0, 1.0], "interactive 2 and 6 first; batch 2 left: 1 each to the two that want it");
        let s = shares(12.0, &[demand(1, 1), demand(1, 1)]);
        assert_eq!(s, vec![6.0, 6.0], "demand met, the rest evenly");
        let s = shares(10.0, &[demand(8, 0), demand(8, 50)]);
        assert_eq!(s, vec![5.0, 5.0], "interactive over capacity is shared evenly, batch gets nothing");
        assert!((shares(7.0, &[demand(3, 9), demand(0, 2), demand(1, 0)]).iter().sum::<f64>() - 7.0).abs() < 1e-9);
    }

    #[test]
    fn heard_peers_split_each_replica_by_demand_under_the_smallest_limit() {
        // The peer learned 12 for r1 (this instance 16): the fleet uses 12.
        let peers = [Standing::Fresh(peer("b", demand(4, 0), &[("r1", 3, 12, 6), ("r2", 1, 16, 6)]))];
        let parts = split("a", demand(0, 100), &[("r1", local(16, 9, None)), ("r2", local(16, 9, None))], &peers, "p", 1.0);
        // 28 slots: the peer's interactive 4 first, 24 to this instance's batch.
        assert_eq!(parts, vec![Part { slots: 10, others: 3 }, Part { slots: 14, others: 1 }], "24 slots in all, rounded by remainder");
        // Alone with its peer idle: half each, at least one.
        let peers = [Standing::Fresh(peer("b", demand(0, 0), &[("r1", 0, 16, 8)]))];
        assert_eq!(split("a", demand(0, 0), &[("r1", local(16, 0, None))], &peers, "p", 1.0), vec![Part { slots: 8, others: 0 }]);
        let peers = [Standing::Fresh(peer("b", demand(0, 500), &[("r1", 16, 16, 16)]))];
        assert_eq!(split("a", demand(0, 0), &[("r1", local(16, 0, None))], &peers, "p", 1.0)[0].slots, 1, "never below one slot");
        // A peer serving other pools only changes nothing here but the member count.
        let parts = split("a", demand(0, 5), &[("r1", local(16, 0, None))], &[Standing::Fresh(peer("b", demand(0, 0), &[]))], "q", 1.0);
        assert_eq!(parts[0].slots, 16);
    }

    #[test]
    fn the_parts_add_up_to_each_replicas_slots_and_remainders_rotate() {
        let urls = ["r1", "r2", "r3"];
        let replicas: Vec<(&str, Local)> = urls.iter().map(|u| (*u, local(16, 0, None))).collect();
        let state = |id: &str| peer(id, demand(0, 100), &[("r1", 0, 16, 5), ("r2", 0, 16, 5), ("r3", 0, 16, 5)]);
        let ids = ["a", "b", "c"];
        let parts: Vec<Vec<Part>> = ids
            .iter()
            .map(|me| {
                let peers: Vec<Standing> = ids.iter().filter(|i| *i != me).map(|i| Standing::Fresh(state(i))).collect();
                split(me, demand(0, 100), &replicas, &peers, "p", 1.0)
            })
            .collect();
        for k in 0..urls.len() {
            let sum: usize = parts.iter().map(|p| p[k].slots).sum();
            assert_eq!(sum, 16, "replica {k}: the three parts add up to its 16 slots: {parts:?}");
        }
        for (me, p) in ids.iter().zip(&parts) {
            let total: usize = p.iter().map(|x| x.slots).sum();
            assert_eq!(total, 16, "{me}: one extra slot each, on different replicas: {parts:?}");
        }
    }

    #[test]
    fn a_lost_peer_keeps_its_slots_and_a_gone_one_only_what_the_replica_still_runs() {
        // The replica runs 12, 2 of them this instance's: 10 beyond the instances heard.
        let r = [("r1", local(16, 2, Some(12)))];
        let quiet = [("r1", local(16, 2, Some(4)))];
        // Never heard: an equal share (8 of 16) is kept for it, or what the replica runs beyond.
        assert_eq!(split("a", demand(0, 100), &quiet, &[Standing::Lost(None)], "p", 1.0), vec![Part { slots: 8, others: 8 }]);
        assert_eq!(split("a", demand(0, 100), &r, &[Standing::Lost(None)], "p", 1.0), vec![Part { slots: 6, others: 10 }]);
        // Heard before holding 12 slots: those are kept, whatever the replica says.
        let last = peer("b", demand(0, 50), &[("r1", 11, 16, 12)]);
        assert_eq!(split("a", demand(0, 100), &quiet, &[Standing::Lost(Some(last))], "p", 1.0)[0].slots, 4);
        // It held one: at least an equal share is kept.
        let small = peer("b", demand(0, 1), &[("r1", 1, 16, 1)]);
        assert_eq!(split("a", demand(0, 100), &quiet, &[Standing::Lost(Some(small))], "p", 1.0)[0].slots, 8);
        // Gone: only what the replica still runs for others counts (10 of 16), then nothing.
        assert_eq!(split("a", demand(0, 100), &r, &[Standing::Gone], "p", 1.0)[0].slots, 6);
        let emptied = [("r1", local(16, 2, Some(2)))];
        assert_eq!(split("a", demand(0, 100), &emptied, &[Standing::Gone], "p", 1.0)[0].slots, 16);
        // Gone without a scrape: its share goes to the survivors.
        assert_eq!(split("a", demand(0, 100), &[("r1", local(16, 2, None))], &[Standing::Gone], "p", 1.0)[0].slots, 16);
        // An unhealthy replica gives no slots.
        let down = [("r1", Local { healthy: false, ..local(16, 0, None) })];
        assert_eq!(split("a", demand(0, 1), &down, &[], "p", 1.0)[0].slots, 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_peer_is_fresh_then_lost_then_gone_and_fresh_again_when_heard() {
        let config = FleetConfig { peer_timeout: Dur::secs(1), takeover_after: Dur::secs(3), ..FleetConfig::default() };
        let state = peer("b", demand(0, 0), &[]);
        let since = Instant::now();
        assert_eq!(standing(&config, since, None, since), Standing::Lost(None), "not heard yet: lost, not gone");
        assert_eq!(standing(&config, since, None, since + Duration::from_secs(3)), Standing::Gone);
        tokio::time::advance(Duration::from_secs(5)).await;
        let heard = Instant::now();
        let at = |secs: f64| heard + Duration::from_secs_f64(secs);
        assert_eq!(standing(&config, since, Some((heard, &state)), at(0.9)), Standing::Fresh(state.clone()));
        assert_eq!(standing(&config, since, Some((heard, &state)), at(1.0)), Standing::Lost(Some(state.clone())));
        assert_eq!(standing(&config, since, Some((heard, &state)), at(2.9)), Standing::Lost(Some(state.clone())));
        assert_eq!(standing(&config, since, Some((heard, &state)), at(3.0)), Standing::Gone);
        // It answers again.
        assert_eq!(standing(&config, since, Some((at(10.0), &state)), at(10.1)), Standing::Fresh(state));
    }
}
