//! Which replica serves a request: `round_robin`, `least_loaded`, or
//! `prefix_aware`. The rules, and why, are in docs/design/prefix-routing.md.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use super::prefix::{home, PerReplica, RouteKey};
use super::replica::SLOW_GAPS;
use super::take::{Reach, Seat};
use super::{PickError, Pool, Replica, ReplicaSlot, Room};
use crate::config::{Balance, Tier};

/// A healthy candidate with its rank, read once: other requests move the
/// counts while this one sorts, and a key that changes between comparisons
/// is not an order (the sort panics on that).
struct Ranked<'a> {
    /// Interactive on a slow replica, or batch on a fast one: tried last.
    away: bool,
    /// What a request sent there now waits for: prefills ahead
    /// (`least_loaded`), or prefill bytes ahead plus its own not cached
    /// plus its load (`prefix_aware`).
    cost: u64,
    load: u64,
    /// Not the prompt's home (false sorts first): the last tie-breaker.
    away_from_home: bool,
    itl: Duration,
    i: usize,
    r: &'a Arc<Replica>,
    /// Prompt bytes expected not cached there, and expected cached.
    uncached: u64,
    matched: u64,
    /// The prompt's block size (0 without a prompt).
    block: u64,
}

impl Ranked<'_> {
    /// This replica holds at least half the prompt (and a block) more than
    /// `other`: sending it there instead would compute that again.
    fn saves_over(&self, other: &Ranked<'_>) -> bool {
        let bytes = self.matched + self.uncached;
        self.matched >= other.matched + (bytes / 2).max(self.block.max(1))
    }

    /// This replica, full to its limit, would start an interactive request
    /// sooner than `other`, which has a seat for it, would (rule 11): on an
    /// engine that runs interactive requests first, `other` has at least a
    /// prompt more of the prefill such a request waits for (in the rank's
    /// unit: this prompt's bytes, or one prefill without a prompt), and
    /// this replica's engine does not run all its slots, so it takes the
    /// request in at once (taking cache blocks from batch), where at its
    /// slots the request would wait for one to free.
    fn starts_sooner_than(&self, other: &Ranked<'_>, tier: Tier, reach: Reach) -> bool {
        let prompt = (self.matched + self.uncached).max(1);
        other.cost >= self.cost.saturating_add(prompt) && !self.r.readings.runs_its_slots() && other.r.has_seat(tier, reach)
    }
}

/// Why no slot was taken on the ranked replicas.
enum Missed {
    /// Every one was full (or, for interactive, slow).
    Full,
    /// A batch prompt was held where it would have made the next
    /// interactive request late (docs/design/preemption.md, rule 14).
    Held,
}

/// A replica full to its limit may take an interactive request up to half
/// its slots above it (at least one): one whose prompt it holds, when the
/// replicas with room would compute at least half the prompt again, or, on
/// an engine that runs interactive requests first, one that would wait a
/// prompt's prefill longer on the replicas with room
/// (docs/design/prefix-routing.md rule 11).
const FULL_OVER_DIV: usize = 2;

impl Pool {
    /// A fleet peer sent a prompt of `blocks` (and `session` hint) to the
    /// replica at `url`: the prefix index records it as it does this
    /// instance's own decisions. False when no replica here has that URL.
    pub(crate) fn heard_sent(&self, url: &str, blocks: &[u64], session: Option<u64>) -> bool {
        let Some(i) = self.replicas.iter().position(|r| r.url == url) else { return false };
        self.prefix.record_heard(blocks, session, i, self.replicas[i].cache_blocks(self.config.prefix.block.0));
        true
    }

    /// A peer of the fleet made response `id` on the replica at `url` for
    /// `tenant` (see [`owners`](super::owners)); false when this pool has no such replica.
    pub(crate) fn heard_owner(&self, url: &str, id: &str, tenant: &str) -> bool {
        let Some(r) = self.replicas.iter().find(|r| r.url == url) else { return false };
        self.owners.heard(id, r, tenant.into());
        true
    }

    /// Pick a healthy replica with a free slot for a request of `tier`,
    /// skipping `exclude`, and take the slot; `room`: how far an interactive
    /// request may go above the slots, or what a batch request leaves free.
    /// `key`: the request's prompt, for `prefix_aware`.
    ///
    /// `least_loaded` ranks replicas first by the prefills the request would
    /// wait behind (requests sent there without a first token yet; see
    /// [`Replica::prefills_ahead`]), then by in-flight plus vLLM's waiting
    /// queue. Time to first token is mostly the prefill work ahead of a
    /// request, not how many streams decode beside it: two replicas with the
    /// same in-flight count differ by whole steps in what a new request
    /// waits if one is in the middle of a burst of prefills. `prefix_aware`
    /// counts that work in prompt bytes, less what each replica's cache is
    /// expected to hold of this prompt (see [`Pool::ranked`]).
    pub(crate) fn pick(
        &self,
        exclude: Option<&Arc<Replica>>,
        room: Room,
        tier: Tier,
        key: Option<&RouteKey>,
    ) -> Result<ReplicaSlot, PickError> {
        self.pick_among(exclude, room, tier, key, false)
    }

    /// A slot on `replica`, one of this pool's, where a request must go (a
    /// follow-up to a stored response: its state is there, and nowhere
    /// else): taken above its slots if need be, as the engine queues what
    /// it cannot start. `None` when it is not healthy, or no longer one of
    /// the pool's.
    pub(crate) fn slot_on(&self, replica: &Arc<Replica>, tier: Tier) -> Option<ReplicaSlot> {
        let ours = self.replicas.iter().any(|r| Arc::ptr_eq(r, replica));
        // Held to no free seat (`must`): it cannot go elsewhere.
        (ours
            && replica.is_healthy()
            && replica.try_take(tier, Reach { over: usize::MAX / 2, unheld: true, must: true, ..Reach::default() }).is_some())
        .then(|| ReplicaSlot::new(replica, tier))
    }

    /// [`Pool::pick`] for a queued request that may let a slot go to
    /// another waiter: only a replica known to hold as much of `key`'s
    /// prompt as any does (within a block); any when none is known to hold
    /// any of it. `Saturated` when none of those has a free slot.
    pub(crate) fn pick_holding(&self, room: Room, tier: Tier, key: &RouteKey) -> Result<ReplicaSlot, PickError> {
        self.pick_among(None, room, tier, Some(key), true)
    }

    fn pick_among(
        &self,
        exclude: Option<&Arc<Replica>>,
        room: Room,
        tier: Tier,
        key: Option<&RouteKey>,
        holding: bool,
    ) -> Result<ReplicaSlot, PickError> {
        let (over, reserved) = match room {
            Room::Over(over) | Room::Patient(over) => (over.div_ceil(self.healthy_count().max(1)), 0),
            Room::Leave(reserved) | Room::Unheld(reserved) => (0, reserved),
        };
        let unheld = matches!(room, Room::Unheld(_));
        let others_wait = self.others_wait() && !matches!(room, Room::Patient(_));
        let lend = if tier == Tier::Interactive { self.others_reserve_free() } else { 0 };
        let reach = Reach { over, unheld, prioritised: self.config.upstream_priority, others_wait, lend, must: false };
        let n = self.replicas.len();
        let start = self.rr.fetch_add(1, Ordering::Relaxed);
        let mut any_healthy = false;
        let candidates = (0..n).map(|k| (start + k) % n).filter(|&i| {
            let r = &self.replicas[i];
            let ok = r.is_healthy() && exclude.is_none_or(|e| !Arc::ptr_eq(e, r));
            any_healthy |= ok;
            ok
        });
        if self.config.balance == Balance::RoundRobin {
            for i in candidates {
                let r = &self.replicas[i];
                if let Some(seat) = r.try_take(tier, reach) {
                    return Ok(self.taken(r, tier, seat));
                }
            }
        } else {
            let key = key.filter(|_| self.config.balance == Balance::PrefixAware);
            let mut ranked = self.ranked(candidates, tier, key);
            if holding {
                let most = ranked.iter().map(|x| x.matched).max().unwrap_or(0);
                let block = key.map_or(0, |k| k.block);
                ranked.retain(|x| x.matched + block >= most);
            }
            match self.take_ranked(ranked, reach, reserved, tier, key) {
                Ok(slot) => return Ok(slot),
                Err(Missed::Held) => return Err(PickError::Held),
                Err(Missed::Full) => {}
            }
        }
        Err(if any_healthy { PickError::Saturated } else { PickError::NoHealthy })
    }

    /// The candidates' ranks. With a prompt (`prefix_aware`), a replica's
    /// cost is the expected prefill work a request sent there waits for and
    /// does, in prompt bytes: the bytes other requests still prefill there,
    /// plus this prompt's bytes its cache is not expected to hold, plus
    /// `load_weight` blocks per request it holds or queues. A replica the
    /// index saw the prompt's leading blocks go to is expected to hold
    /// them; the one its session hint went to, all of it. Where cost and
    /// load tie, the prompt's home (the same on every instance of a fleet)
    /// goes first.
    fn ranked<'a>(&'a self, candidates: impl Iterator<Item = usize>, tier: Tier, key: Option<&RouteKey>) -> PerReplica<Ranked<'a>> {
        let priority = self.config.upstream_priority;
        let known = key.map(|k| self.known_cached(k));
        let home = key.and_then(|k| self.home_of(k));
        candidates
            .map(|i| {
                let r = &self.replicas[i];
                let load = r.load_score();
                let itl = r.itl_mean();
                let away_from_home = home != Some(i);
                match (key, &known) {
                    (Some(k), Some(known)) => {
                        let uncached = k.bytes.saturating_sub(known[i]);
                        let weight = (self.config.prefix.load_weight * k.block as f64 * load as f64) as u64;
                        let cost = r.prefill_bytes_ahead(tier, priority) + uncached + weight;
                        Ranked { away: false, cost, load, away_from_home, itl, i, r, uncached, matched: known[i], block: k.block }
                    }
                    _ => {
                        let cost = r.prefills_ahead(tier, priority) as u64;
                        Ranked { away: false, cost, load, away_from_home, itl, i, r, uncached: 0, matched: 0, block: 0 }
                    }
                }
            })
            .collect()
    }

    /// For each replica, the bytes of `key`'s prompt its cache is known to
    /// hold: the leading blocks the index saw go there, or more where its
    /// KV events say it holds more (exact mode, while they come); all of
    /// it where its session went.
    fn known_cached(&self, key: &RouteKey) -> PerReplica<u64> {
        let n = self.replicas.len();
        let mut known: PerReplica<u64> = self.prefix.matched(key, n).into_iter().map(|b| (b as u64 * key.block).min(key.bytes)).collect();
        // Exact mode: what a replica's events say it holds, where they
        // come, or what was sent there if more: the events name a prompt's
        // blocks only once its prefill is done, so a burst of one prefix
        // would otherwise scatter before the first of it is computed.
        if let Some(exact) = self.exact.as_ref().filter(|_| !key.token_keys.is_empty()) {
            for (k, feed) in known.iter_mut().zip(&exact.feeds) {
                if feed.alive() {
                    *k = (*k).max(key.bytes_of_token_blocks(feed.held().run(&key.token_keys)));
                }
            }
        }
        if let Some(s) = self.prefix.session(key).filter(|&s| s < n) {
            known[s] = key.bytes;
        }
        known
    }

    /// The prompt's home among the healthy replicas: the same on every
    /// instance, so the first request of a prefix new to all of them goes
    /// to the same replica from each (when the replicas tie). Only in a
    /// fleet: alone, ties go round (rule 9).
    fn home_of(&self, key: &RouteKey) -> Option<usize> {
        if !self.prefix.journaling() {
            return None;
        }
        let healthy = self.url_keys.iter().copied().enumerate().filter(|(i, _)| self.replicas[*i].is_healthy());
        key.anchor().and_then(|a| home(a, healthy))
    }

    /// Take a slot on the best-ranked replica that has one. A replica is
    /// slow while its streams' mean gap is more than SLOW_GAPS times the
    /// fastest healthy one's. Interactive goes only to the others (on a
    /// slow one it would miss its ITL whatever it waited: better to wait
    /// for a slot where it will not); batch goes to a slow one first.
    /// On an engine that serves first come, first served, a batch prompt
    /// goes only where it leaves the next interactive request time for its
    /// first token (docs/design/preemption.md, rule 14); `Held` where that
    /// kept it from every replica it was not kept from otherwise.
    fn take_ranked(
        &self,
        mut ranked: PerReplica<Ranked<'_>>,
        reach: Reach,
        reserved: usize,
        tier: Tier,
        key: Option<&RouteKey>,
    ) -> Result<ReplicaSlot, Missed> {
        let fastest = ranked.iter().map(|x| x.itl).filter(|m| !m.is_zero()).min();
        let (mut any_slow, mut fast_slots, mut fast_batch) = (false, 0, 0);
        for x in &mut ranked {
            let slow = fastest.is_some_and(|f| x.itl > f.mul_f64(SLOW_GAPS));
            x.away = slow == (tier == Tier::Interactive);
            any_slow |= slow;
            if !slow {
                fast_slots += x.r.slots();
                fast_batch += x.r.seats.batch_held.load(Ordering::Relaxed);
            }
        }
        // While a replica is slow, interactive requests can use only the
        // others: the seats reserved for them must be there. Batch takes a
        // seat on those only while it leaves `reserved` of their slots to
        // interactive (the slow ones are its own).
        let batch_may_take_fast = !any_slow || fast_batch + reserved < fast_slots;
        // Stable: the rotating start breaks ties.
        ranked.sort_by_key(|x| (x.away, x.cost, x.load, x.away_from_home));
        // The best-ranked replica, where it was full: an interactive
        // request whose prompt it holds may go up to half its slots above
        // there rather than be computed again elsewhere, or, where the
        // engine runs interactive requests first, rather than wait behind
        // a prompt's more interactive prefill elsewhere (rule 11).
        let mut full_best: Option<&Ranked<'_>> = None;
        // A prompt known, on an engine without priorities: batch's prefill
        // is ahead of the next interactive request's there.
        let hold = tier == Tier::Batch && key.is_some() && !self.config.upstream_priority;
        let mut missed = Missed::Full;
        for (n, x) in ranked.iter().enumerate() {
            // (For batch the replicas ranked away are the fast ones.)
            if x.away && (tier == Tier::Interactive || !batch_may_take_fast) {
                return Err(missed);
            }
            if hold && !x.r.takes_batch_prompt(x.uncached) {
                missed = Missed::Held;
                continue;
            }
            let above = |b: &&Ranked<'_>| b.saves_over(x) || (reach.prioritised && b.starts_sooner_than(x, tier, reach));
            if let Some(best) = full_best.filter(|b| tier == Tier::Interactive && above(b)) {
                if let Some(seat) = best.r.try_take(tier, Reach { over: reach.over + best.r.slots().div_ceil(FULL_OVER_DIV), ..reach }) {
                    return Ok(self.seat(best, tier, key, seat));
                }
                full_best = None;
            }
            if let Some(seat) = x.r.try_take(tier, reach) {
                return Ok(self.seat(x, tier, key, seat));
            }
            if n == 0 {
                full_best = Some(x);
            }
        }
        Err(missed)
    }

    /// The slot `try_take` took on `r`, a lent seat counted there.
    fn taken(&self, r: &Arc<Replica>, tier: Tier, seat: Seat) -> ReplicaSlot {
        let mut slot = ReplicaSlot::new(r, tier);
        slot.count_lent(seat);
        slot
    }

    /// The slot taken on `x`: its prefill counted there at once (a request
    /// routed on another worker meanwhile must see it), then the prompt
    /// recorded.
    fn seat(&self, x: &Ranked<'_>, tier: Tier, key: Option<&RouteKey>, seat: Seat) -> ReplicaSlot {
        let mut slot = self.taken(x.r, tier, seat);
        if let Some(k) = key {
            slot.prefill(x.uncached, self.config.upstream_priority);
            self.prefix.record(k, x.i, x.r.cache_blocks(k.block));
            // New full blocks to compute there: its events should name them soon.
            let stores = x.matched < k.bytes_of_token_blocks(k.token_keys.len());
            if let Some(feed) = self.exact.as_ref().and_then(|e| e.feeds.get(x.i)).filter(|_| stores) {
                feed.routed();
            }
            x.r.routed(k.bytes, x.matched);
        }
        slot
    }
}

/// The routing decision's cost, for `examples/prefix_cost.rs`: a
/// prefix-aware pool of `replicas` (healthy; nothing listens), its index
/// holding `prefixes` prompts of `blocks` blocks (each sent once, round the
/// replicas, each replica's cache holding half of what it was sent), then
/// `samples` decisions for prompts drawn from them, each timed from the
/// pick to its slot taken (hashing the prompt not included).
pub(crate) fn decisions(replicas: usize, prefixes: usize, blocks: usize, samples: usize) -> Vec<Duration> {
    use crate::config::{InflightLimit, PoolConfig};
    let mut cfg = PoolConfig {
        replicas: (0..replicas).map(|i| format!("http://127.0.0.1:{}", 10_000 + i).into()).collect(),
        max_inflight_per_replica: InflightLimit::Fixed(1_000_000),
        ..PoolConfig::default()
    };
    cfg.prefix.index_blocks = (prefixes * blocks).max(1) as u32;
    let block = cfg.prefix.block.0 as usize;
    let Ok(access) = super::Access::new(&cfg) else { return Vec::new() };
    let pool = Pool::new(cfg, access, None);
    for r in &pool.replicas {
        r.set_healthy(true);
    }
    let prompt = |p: usize| {
        let mut text = format!("prompt {p:08} ").into_bytes();
        text.resize(blocks * block, b'x');
        RouteKey::of(&[&text], block, blocks, None)
    };
    // Each replica states a cache that holds half of what it is sent here,
    // as vLLM's metrics do: every decision's blocks then push others out.
    let per_replica = (prefixes * blocks).div_ceil(replicas.max(1)) as u64;
    for r in &pool.replicas {
        r.readings.cache_tokens.store((per_replica / 2).max(1) * block as u64 / 4, Ordering::Relaxed);
    }
    for p in 0..prefixes {
        let i = p % replicas;
        pool.prefix.record(&prompt(p), i, pool.replicas[i].cache_blocks(block as u64));
    }
    let mut out = Vec::with_capacity(samples);
    for s in 0..samples {
        let key = prompt((s * 7919) % prefixes.max(1));
        let t = tokio::time::Instant::now();
        let slot = pool.pick(None, Room::Over(0), Tier::Interactive, Some(&key));
        out.push(t.elapsed());
        drop(slot);
    }
    out
}

#[cfg(test)]
mod tests;
