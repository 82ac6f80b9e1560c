//! The two-tier queue in front of a pool's replica slots: a request takes
//! a slot ([`Lease`]) or waits in its tier's fair queue; a freed slot goes
//! to interactive first, batch keeps to its ceiling ([`Seats`]), and a
//! starvation guard hands batch one slot per [`STARVATION_GUARD_INTERVAL`].
//! Queues are bounded, timed, and shed as docs/design/seats.md says.
//!
//! Wake-ups cannot be lost: a waiter registers itself (counter, SeqCst) and
//! only then retries for a slot; a release frees the slot (SeqCst) and only
//! then checks the counter. One of the two always sees the other.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use arc_swap::{ArcSwap, ArcSwapOption};
use prometheus_client::metrics::gauge::Gauge;
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;

use super::fair::{OverShare, Standing};
use super::lease::{Claim, Granted, Lease, OverWhy, Refusal};
use super::rates;
use super::seats::{Demand, FleetWord, Reserve, Seats, DEMAND_MARGIN, NARROW_PER_TICK};
use super::waiting::{Queues, WaitGuard, Waiter, Waiting};
use crate::config::{Tier, TiersConfig};
use crate::sync::AtomicF64;
use crate::telemetry::metrics::{Metrics, PoolLabels, PoolTierLabels, TierLabel};
use crate::upstream::prefix::RouteKey;
use crate::upstream::{PickError, Pool};
use deadlines::Deadlines;

/// Batch gets at least one slot this often while interactive waits but is
/// not at risk.
pub(crate) const STARVATION_GUARD_INTERVAL: Duration = Duration::from_secs(1);

/// What [`PoolAdmission::enqueue`] did with a request.
enum Enqueued {
    /// A slot after all.
    Granted(Lease),
    /// Queued as waiter `id`; the slot or refusal comes on the channel.
    Waiting(u64, oneshot::Receiver<Result<Lease, Refusal>>),
}

/// Admission to one pool's replicas: its queues, its tier shares and the
/// pool it hands slots from. One per pool name, kept across reloads (so are
/// the waiters and the batch count); a reload's swap installs the new pool
/// and limits with [`PoolAdmission::install`].
pub(crate) struct PoolAdmission {
    /// The upstream pool slots come from (the current snapshot's).
    pool: ArcSwap<Pool>,
    /// The requests waiting for a slot.
    waiting: Waiting,
    /// The tiers' limits; replaced on reload.
    tiers: ArcSwap<TiersConfig>,
    /// Slots held by batch requests. Invariant: only changed by
    /// [`PoolAdmission::try_lease`] and [`Lease`]'s drop.
    batch_inflight: AtomicUsize,
    /// Short requests holding a seat of their own (see [`Seats::short_seats`]).
    short_inflight: AtomicUsize,
    /// Slots held by interactive requests (same invariant).
    interactive_inflight: AtomicUsize,
    /// Interactive requests holding or waiting for a slot: the most since the last tick.
    interactive_high: AtomicUsize,
    /// Interactive demand's peak over [`DEMAND_WINDOW`], published each tick:
    /// what the reservation follows.
    interactive_demand: AtomicUsize,
    /// Leases released so far, per tier (for the service rates).
    released: [AtomicU64; 2],
    /// Slots freed per second, per tier; 0 = not known yet.
    rates: [AtomicF64; 2],
    /// Published by the publisher: some interactive class is over its TTFT target.
    interactive_at_risk: AtomicBool,
    /// Published each tick: the least the reservation may narrow to
    /// ([`Seats::narrowed`]); `usize::MAX` while it may not.
    narrowed: AtomicUsize,
    /// In a fleet: the fleet's word, each period (`None` alone).
    fleet: ArcSwapOption<FleetWord>,
    /// Per tier: the moment the last refused client was told to come back,
    /// in microseconds after `born` (see [`PoolAdmission::schedule`]).
    retry_cursor: [AtomicU64; 2],
    born: Instant,
    /// `slogate_pool_seats` per tier and `slogate_pool_reserved_seats`, set each tick.
    seat_gauges: [Gauge; 3],
    /// Batch streams that may give their slots up for interactive requests.
    pub(super) preemption: super::preempt::Preemption,
}

impl PoolAdmission {
    /// Admission for a new pool (not live until its snapshot is swapped in).
    pub(crate) fn new(pool: Arc<Pool>, tiers: TiersConfig, metrics: &Metrics) -> Self {
        let name = pool.config.name.clone();
        let held = |tier| metrics.pool_seats.get_or_create(&PoolTierLabels { pool: name.clone(), tier }).clone();
        let seat_gauges = [
            held(TierLabel::interactive),
            held(TierLabel::batch),
            metrics.pool_reserved_seats.get_or_create(&PoolLabels { pool: name.clone() }).clone(),
        ];
        PoolAdmission {
            pool: ArcSwap::new(pool),
            waiting: Waiting::new(metrics),
            tiers: ArcSwap::from_pointee(tiers),
            batch_inflight: AtomicUsize::new(0),
            short_inflight: AtomicUsize::new(0),
            interactive_inflight: AtomicUsize::new(0),
            interactive_high: AtomicUsize::new(0),
            interactive_demand: AtomicUsize::new(0),
            released: [AtomicU64::new(0), AtomicU64::new(0)],
            rates: [AtomicF64::new(0.0), AtomicF64::new(0.0)],
            interactive_at_risk: AtomicBool::new(false),
            narrowed: AtomicUsize::new(usize::MAX),
            fleet: ArcSwapOption::empty(),
            retry_cursor: [AtomicU64::new(0), AtomicU64::new(0)],
            born: Instant::now(),
            seat_gauges,
            preemption: Default::default(),
        }
    }

    /// The swap step of a reload (cannot fail): hand slots out from `pool`
    /// with `tiers`' limits from now on; waiting requests keep their place.
    pub(crate) fn install(&self, pool: Arc<Pool>, tiers: TiersConfig) {
        self.pool.store(pool);
        self.tiers.store(Arc::new(tiers));
    }

    /// The pool slots come from now.
    pub(crate) fn pool(&self) -> Arc<Pool> {
        self.pool.load_full()
    }

    /// Slots held by batch requests.
    pub(crate) fn batch_inflight(&self) -> usize {
        self.batch_inflight.load(Ordering::SeqCst)
    }

    /// The pool's seats now: its slots, what the tiers hold and wait for,
    /// and the estimates the reservation follows (see [`Seats`]).
    fn seats(&self, pool: &Pool) -> Seats {
        let fleet = self.fleet.load().as_deref().copied();
        Seats {
            cap: pool.capacity(),
            share: self.tiers.load().interactive.reserved_share.clamp(0.0, 1.0),
            interactive_held: self.interactive_inflight.load(Ordering::SeqCst),
            interactive_waiting: self.waiting.depth(Tier::Interactive),
            batch_held: self.batch_inflight.load(Ordering::SeqCst),
            demand_peak: self.interactive_demand.load(Ordering::Relaxed),
            fleet,
            at_risk: self.interactive_at_risk.load(Ordering::Relaxed),
            preempts: pool.config.preempts(),
            narrowed: Some(self.narrowed.load(Ordering::Relaxed)).filter(|n| *n != usize::MAX),
        }
    }

    /// The most slots batch may hold now (see [`Seats::batch_limit`]).
    #[cfg(test)]
    pub(crate) fn batch_limit(&self) -> usize {
        self.seats(&self.pool.load()).batch_limit()
    }

    /// The fleet's word for this period (`None`: alone).
    pub(crate) fn set_fleet(&self, word: Option<FleetWord>) {
        self.fleet.store(word.map(Arc::new));
    }

    /// The reservation one instance holding the fleet's `slots` would make
    /// for the fleet's interactive `peak` (see [`Reserve::whole`]).
    pub(crate) fn fleet_reservation(&self, slots: usize, peak: usize) -> Reserve {
        Reserve::whole(slots, self.tiers.load().interactive.reserved_share.clamp(0.0, 1.0), peak, self.pool.load().config.preempts())
    }

    /// This instance's demand on the pool, for the fleet's split of the
    /// replicas' slots: interactive (what its reservation follows: the recent
    /// peak and a quarter more, or what holds and waits now if that is more),
    /// batch (holding and waiting now), and how many of both wait.
    pub(crate) fn demand(&self) -> Demand {
        let waiting_i = self.waiting.depth(Tier::Interactive);
        let waiting_b = self.waiting.depth(Tier::Batch);
        let now = self.interactive_inflight.load(Ordering::Relaxed) + waiting_i;
        let peak = (self.interactive_demand.load(Ordering::Relaxed) as f64 * DEMAND_MARGIN).ceil() as usize;
        Demand {
            interactive: now.max(peak),
            interactive_now: now,
            batch: self.batch_inflight.load(Ordering::Relaxed) + waiting_b,
            waiting: waiting_i + waiting_b,
        }
    }

    /// Interactive requests holding or waiting for a slot now; raises the tick's high mark.
    fn note_interactive(&self) {
        let now = self.interactive_inflight.load(Ordering::Relaxed) + self.waiting.depth(Tier::Interactive);
        self.interactive_high.fetch_max(now, Ordering::Relaxed);
    }
    /// Request body bytes waiting in `tier`'s queue.
    pub(crate) fn waiting_bytes(&self, tier: Tier) -> u64 {
        self.waiting.bytes(tier)
    }

    /// Requests waiting in `tier`'s queue.
    pub(crate) fn depth(&self, tier: Tier) -> usize {
        self.waiting.depth(tier)
    }

    /// It holds no slot, queues nothing, and remembers no interactive
    /// demand: its periodic upkeep has nothing to do.
    pub(crate) fn at_rest(&self) -> bool {
        [&self.batch_inflight, &self.short_inflight, &self.interactive_inflight, &self.interactive_demand]
            .iter()
            .all(|n| n.load(Ordering::Relaxed) == 0)
            && self.depth(Tier::Interactive) == 0
            && self.depth(Tier::Batch) == 0
    }

    /// How long a request of `tier` may wait for a slot.
    pub(crate) fn timeout(&self, tier: Tier) -> Duration {
        self.tiers.load().of(tier).queue_timeout.get()
    }

    /// Slots of `tier` freed per second, once measured.
    fn rate(&self, tier: Tier) -> Option<f64> {
        let r = self.rates[tier as usize].load();
        (r > 0.0).then_some(r)
    }

    fn batch_rate(&self) -> Option<f64> {
        self.rate(Tier::Batch)
    }

    /// How long until a request at `position` in `tier`'s queue gets a slot.
    fn retry_after(&self, tier: Tier, position: usize) -> Duration {
        rates::queue_wait(position, self.rate(tier))
    }

    /// When a client refused now in `tier` should come back, from the
    /// `estimate` of when capacity returns: no sooner than that, and no
    /// sooner than one drain interval after the client refused before it.
    /// Refused clients are so told to return at the rate the tier frees
    /// slots, not all at the moment the estimate names (which every client
    /// refused while a queue drains would share). Without a measured rate,
    /// the estimate. (docs/design/seats.md, rule 19.)
    pub(crate) fn schedule(&self, tier: Tier, estimate: Duration) -> Duration {
        let Some(rate) = self.rate(tier) else { return estimate };
        let now = self.born.elapsed().as_micros() as u64;
        let step = (1e6 / rate) as u64;
        let horizon = now + crate::error::RETRY_AFTER_MAX.as_micros() as u64;
        let cursor = &self.retry_cursor[tier as usize];
        let mut cur = cursor.load(Ordering::Relaxed);
        loop {
            let at = cur.max(now + estimate.as_micros() as u64).min(horizon);
            match cursor.compare_exchange_weak(cur, (at + step).min(horizon), Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => return Duration::from_micros(at - now),
                Err(c) => cur = c,
            }
        }
    }

    /// Where `claim`'s tenant stands in `tier` now (always `Alone` for
    /// batch, or without keys).
    fn standing(&self, q: &Queues, tier: Tier, claim: Claim) -> Standing {
        if !(claim.fair && tier == Tier::Interactive) {
            return Standing::Alone;
        }
        q.interactive.standing(claim.share, self.pool.load().capacity())
    }

    /// The refusal of an over-share tenant's request that ran into `why`.
    fn over_share(&self, over: OverShare, why: OverWhy) -> Refusal {
        Refusal::OverShare { retry_after: rates::share_wait(&over, self.rate(Tier::Interactive)), over, why }
    }

    pub(crate) fn set_interactive_at_risk(&self, at_risk: bool) {
        self.interactive_at_risk.store(at_risk, Ordering::Relaxed);
    }

    /// Get a slot for a request of `tier` whose body is `bytes` long,
    /// waiting in the queue if needed. Dropping the future (the client went
    /// away) leaves the queue at once.
    /// `key`: its prompt, for prefix-aware routing.
    pub(crate) async fn admit(
        self: &Arc<Self>,
        tier: Tier,
        bytes: u64,
        claim: Claim,
        key: Option<Arc<RouteKey>>,
    ) -> Result<Granted, Refusal> {
        let start = Instant::now();
        // Several tenants in the interactive tier: the decision needs their
        // shares (under the lock, in `enqueue`).
        let shared = claim.fair && tier == Tier::Interactive;
        if self.waiting.ahead_of(tier) == 0 && !shared {
            match self.try_lease_over(tier, 0, key.as_deref()) {
                Ok(lease) => {
                    if tier == Tier::Interactive {
                        self.note_interactive();
                    }
                    return Ok(Granted { lease: self.charge(tier, lease, claim), waited: Duration::ZERO });
                }
                Err(PickError::NoHealthy) => return Err(Refusal::NoHealthy),
                Err(PickError::Saturated | PickError::Held) => {}
            }
        }
        let deadlines = self.deadlines(tier, claim, start);
        let waiter = Waiter { id: 0, bytes, enqueued: start, deadline: deadlines.last(), claim, key, tx: oneshot::channel().0 };
        let (id, rx) = match self.enqueue(tier, waiter, &deadlines)? {
            Enqueued::Granted(lease) => return Ok(Granted { lease, waited: start.elapsed() }),
            Enqueued::Waiting(id, rx) => (id, rx),
        };
        let guard = WaitGuard { waiting: &self.waiting, tier, tenant: claim.share.tenant, id };
        let result = self.wait(rx, &deadlines, tier, claim).await;
        drop(guard);
        result.map(|lease| Granted { lease, waited: start.elapsed() })
    }

    /// Why a request of `claim` with a body of `bytes` may not join `tier`'s
    /// queue `q` now, if it may not. A full interactive queue takes a request
    /// of a tenant within its part in place of the newest waiter of the
    /// tenant furthest over its part, which is refused.
    fn refused_entry(&self, q: &mut Queues, tier: Tier, claim: Claim, bytes: u64) -> Option<Refusal> {
        if claim.resumed {
            // A preempted stream was served: it waits, whatever the queue holds.
            return None;
        }
        let len = q.of(tier).len();
        let retry_after = self.retry_after(tier, len);
        if tier == Tier::Batch && !q.interactive.is_empty() {
            return Some(Refusal::Shed { retry_after });
        }
        let standing = self.standing(q, tier, claim);
        let full = len >= self.tiers.load().of(tier).queue_capacity as usize;
        let bytes_full = self.waiting_bytes(tier).saturating_add(bytes) > self.tiers.load().of(tier).queue_max_bytes.0;
        match standing {
            Standing::Over(over) if full || bytes_full => return Some(self.over_share(over, OverWhy::Full)),
            _ if full && !(claim.fair && tier == Tier::Interactive && self.displace(q)) => return Some(Refusal::QueueFull { retry_after }),
            _ if bytes_full => return Some(Refusal::QueueBytesFull { retry_after }),
            _ => {}
        }
        let hopeless = |rate| Duration::from_secs_f64((len as f64 + 1.0) / rate) > self.timeout(tier);
        (tier == Tier::Batch && self.batch_rate().is_some_and(hopeless)).then_some(Refusal::Hopeless { retry_after })
    }

    /// Refuse the newest interactive waiter of the tenant furthest over its
    /// part, if one is over it: its place goes to a tenant within its part.
    fn displace(&self, q: &mut Queues) -> bool {
        let cap = self.pool.load().capacity();
        let Some((tenant, id)) = q.interactive.most_over(cap) else { return false };
        let Some(w) = q.interactive.remove(tenant, id) else { return false };
        self.waiting.dec(Tier::Interactive, w.bytes);
        let refusal = match q.interactive.standing(w.claim.share, cap) {
            Standing::Over(over) => self.over_share(over, OverWhy::Displaced),
            _ => Refusal::QueueFull { retry_after: self.retry_after(Tier::Interactive, q.interactive.len()) },
        };
        let _ = w.tx.send(Err(refusal));
        true
    }

    /// Under the queue lock: refuse `w`, grant it a slot after all, or queue it.
    fn enqueue(self: &Arc<Self>, tier: Tier, mut w: Waiter, deadlines: &Deadlines) -> Result<Enqueued, Refusal> {
        let Some(mut q) = self.waiting.lock() else { return Err(Refusal::NoHealthy) };
        let claim = w.claim;
        if let Some(lease) = self.seat_above(&mut q, tier, claim, w.key.as_deref()) {
            return Ok(Enqueued::Granted(lease));
        }
        if let Some(refusal) = self.refused_now(&q, tier, claim, deadlines, Instant::now()) {
            return Err(refusal);
        }
        if let Some(refusal) = self.refused_entry(&mut q, tier, claim, w.bytes) {
            return Err(refusal);
        }
        let first = self.waiting.ahead_of(tier) == 0 && self.leaves_room(&q, tier, claim);
        self.waiting.inc(tier, w.bytes);
        if first {
            // Registered first, then retry: a concurrent release either
            // sees us waiting or we see its freed slot.
            match self.try_lease_over(tier, 0, w.key.as_deref()) {
                Ok(mut lease) => {
                    self.waiting.dec(tier, w.bytes);
                    if tier == Tier::Interactive {
                        self.note_interactive();
                    }
                    let standing = self.standing(&q, tier, claim);
                    if claim.fair {
                        q.of(tier).charge(claim.share, claim.tokens as f64);
                    }
                    lease.claimed(claim, standing);
                    return Ok(Enqueued::Granted(lease));
                }
                Err(PickError::NoHealthy) => {
                    self.waiting.dec(tier, w.bytes);
                    return Err(Refusal::NoHealthy);
                }
                Err(PickError::Saturated | PickError::Held) => {}
            }
        }
        let (tx, rx) = oneshot::channel();
        q.next_id += 1;
        (w.id, w.tx) = (q.next_id, tx);
        q.of(tier).push(w);
        if tier == Tier::Interactive {
            self.note_interactive();
            self.preempt_if_late(&q, deadlines);
        }
        Ok(Enqueued::Waiting(q.next_id, rx))
    }

    /// A seat above the slots for an interactive request that should not wait
    /// behind the streams holding them: a short one (embeddings, rerank,
    /// tokenize: it holds a slot for milliseconds, they for seconds) takes
    /// one of the pool's seats for short requests ([`Seats::short_seats`])
    /// on any healthy replica, whatever its streams hold (even above a
    /// limit that was just cut); one of a tenant under its fair part of the
    /// slots, which does not wait behind a tenant over it, one of
    /// [`Seats::fair_headroom`] above the slots. The next slot freed is not
    /// handed on, so the seat is given back by those that wait, not by
    /// this request.
    fn seat_above(self: &Arc<Self>, q: &mut Queues, tier: Tier, claim: Claim, key: Option<&RouteKey>) -> Option<Lease> {
        if tier != Tier::Interactive {
            return None;
        }
        let seats = self.seats(&self.pool.load());
        let standing = self.standing(q, tier, claim);
        let mut lease = if claim.short {
            self.short_seat(key)?
        } else if standing == Standing::Under {
            self.try_lease_over(tier, seats.fair_headroom(), key).ok()?
        } else {
            return None;
        };
        self.note_interactive();
        if claim.fair {
            q.interactive.charge(claim.share, claim.tokens as f64);
        }
        lease.claimed(claim, standing);
        Some(lease)
    }

    /// Charge a lease granted at once (nobody waiting) to its tenant.
    fn charge(&self, tier: Tier, mut lease: Lease, claim: Claim) -> Lease {
        if !claim.fair {
            return lease;
        }
        if let Some(mut q) = self.waiting.lock() {
            let standing = self.standing(&q, tier, claim);
            q.of(tier).charge(claim.share, claim.tokens as f64);
            lease.claimed(claim, standing);
        }
        lease
    }

    /// May `claim` take a slot now? Yes, except for an interactive request of
    /// a tenant holding its fair part or more while other tenants are
    /// active: it leaves the last of the slots free ([`Seats::leaves_fair_reserve`]), so
    /// another tenant's request starts at once on a real seat instead of
    /// waiting for one of its streams to end (a replica full to its
    /// `max_num_seqs` queues a request sent above it, whatever its priority).
    fn leaves_room(&self, q: &Queues, tier: Tier, claim: Claim) -> bool {
        if !(claim.fair && tier == Tier::Interactive && q.interactive.others_active(claim.share)) {
            return true;
        }
        let seats = self.seats(&self.pool.load());
        q.interactive.under_share(claim.share, seats.cap) || seats.leaves_fair_reserve()
    }

    /// Periodic work (the publisher): measure the batch service rate, reject
    /// queued batch requests that cannot make their deadline, publish the
    /// seats each tier holds and the reservation, hand out slots that
    /// appeared without a release (a replica came back).
    pub(crate) fn tick(self: &Arc<Self>, now: Instant) {
        let mut hopeless = Vec::new();
        if let Some(mut q) = self.waiting.lock() {
            // The interactive demand the reservation follows: the peak of the
            // ticks within the window (the high mark restarts from what is there now).
            let current = self.interactive_inflight.load(Ordering::Relaxed) + self.waiting.depth(Tier::Interactive);
            let high = self.interactive_high.swap(current, Ordering::Relaxed).max(current);
            self.interactive_demand.store(q.rates.demand_peak(now, high), Ordering::Relaxed);
            // Once the replicas have held at their slots, the reservation
            // narrows a seat or so a tick from what it was (rule 4).
            let pool = self.pool.load();
            let narrowed = if q.rates.at_slots_held(now, pool.prioritised_at_its_slots()) {
                self.seats(&pool).reserved().saturating_sub(NARROW_PER_TICK)
            } else {
                usize::MAX
            };
            self.narrowed.store(narrowed, Ordering::Relaxed);
            // For the learned limits: is there demand beyond the slots?
            pool.set_waiting(q.interactive.len() + q.batch.len());
            for tier in [Tier::Interactive, Tier::Batch] {
                let busy = !q.of(tier).is_empty();
                if !busy {
                    // Nobody waits: capacity is back, and what earlier
                    // refusals were told no longer delays the next.
                    self.retry_cursor[tier as usize].store(0, Ordering::Relaxed);
                }
                if let Some(rate) = q.rates.rate(tier, now, self.released[tier as usize].load(Ordering::Relaxed), busy) {
                    self.rates[tier as usize].store(rate);
                }
            }
            if let Some(rate) = self.batch_rate() {
                let waiting = q.batch.iter().filter(|w| !w.claim.resumed).map(|w| (w.id, w.claim.share.tenant, w.deadline)).collect();
                for (id, t) in rates::hopeless(waiting, rate, now) {
                    if let Some(w) = q.batch.remove(t, id) {
                        hopeless.push(w);
                    }
                }
            }
        }
        let seats = self.seats(&self.pool.load());
        let [interactive, batch, reserved] = &self.seat_gauges;
        interactive.set(seats.interactive_held as i64);
        batch.set(seats.batch_held as i64);
        reserved.set(seats.reserved() as i64);
        for w in hopeless {
            self.waiting.dec(Tier::Batch, w.bytes);
            let retry_after = self.retry_after(Tier::Batch, self.depth(Tier::Batch));
            let _ = w.tx.send(Err(Refusal::Hopeless { retry_after }));
        }
        self.dispatch();
    }
}

mod deadlines;
mod dispatch;
mod leasing;
mod peers;
mod seating;

#[cfg(test)]
mod tests;
