//! Handing free slots to waiters: which tier, which tenant, which of its
//! waiters, on which replica.
//!
//! With prefix-aware routing a queued request is placed where its prompt's
//! prefix is cached. Taking the waiters strictly in order would give each
//! freed slot to the next waiter wherever the slot is: in a queue that
//! stays long (overload), a request would find its cache one time in as
//! many replicas as there are. So the slot goes to the first of the next
//! [`WINDOW`] waiters (in their order) that a replica holding its prefix
//! has a free slot for, and only when none of them has one, to the first
//! waiter wherever (a slot is never left idle while someone waits).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use tokio::time::Instant;

use super::leasing::Asking;
use super::{PoolAdmission, STARVATION_GUARD_INTERVAL};
use crate::admission::lease::{Claim, Lease};
use crate::admission::waiting::{Queues, Waiter};
use crate::config::Tier;
use crate::upstream::prefix::RouteKey;
use crate::upstream::PickError;

/// How far above the slots a short request's own seat may be: any healthy
/// replica takes it, whatever its streams hold.
const BESIDE: usize = usize::MAX >> 2;

/// How many waiters, from the front, a freed slot is matched against.
pub(super) const WINDOW: usize = 16;

/// What giving a lease to one waiter came to.
enum Given {
    Served,
    /// Its client had gone away: the lease is back.
    Gone(Lease),
    Nobody,
}

/// What handing a lease to a tier's waiters came to.
enum Handed {
    /// A waiter took it.
    Served,
    /// Every waiter tried had gone away: the lease is left over.
    Spare(Lease),
    Nobody,
}

impl PoolAdmission {
    /// Hand free slots to waiters: interactive first, batch within its share,
    /// batch first once per guard interval when interactive is not at risk.
    pub(crate) fn dispatch(self: &Arc<Self>) {
        // Leases nobody took are dropped after the lock is released (dropping
        // one re-enters `released`).
        let mut spare: Vec<Lease> = Vec::new();
        {
            let Some(mut q) = self.waiting.lock() else { return };
            let now = Instant::now();
            loop {
                let has_i = !q.interactive.is_empty();
                let has_b = !q.batch.is_empty();
                // Batch has waited a guard interval, and got nothing for as long.
                let guard_due = !self.interactive_at_risk.load(Ordering::Relaxed)
                    && q.batch.oldest().is_some_and(|w| now.saturating_duration_since(w.enqueued) >= STARVATION_GUARD_INTERVAL)
                    && q.last_batch_grant.is_none_or(|t| now.saturating_duration_since(t) >= STARVATION_GUARD_INTERVAL);
                let order: &[Tier] = match (has_i, has_b) {
                    (false, false) => break,
                    (true, false) => &[Tier::Interactive],
                    (false, true) => &[Tier::Batch],
                    (true, true) if guard_due => &[Tier::Batch, Tier::Interactive],
                    (true, true) => &[Tier::Interactive, Tier::Batch],
                };
                let mut served = false;
                for &tier in order {
                    // Interactive: the first tenant in the fair order that may take a
                    // slot now (one at its share leaves the reserve to the others).
                    let tenant = match tier {
                        Tier::Interactive => q.interactive.first_tenant_where(|w| self.leaves_room(&q, tier, w.claim)),
                        Tier::Batch => q.batch.first_tenant(),
                    };
                    let Some(tenant) = tenant else { continue };
                    let Ok((lease, chosen)) = self.lease_for_next(&q, tier, tenant) else { continue };
                    match self.hand(&mut q, tier, tenant, chosen, lease, now) {
                        Handed::Served => {
                            served = true;
                            break;
                        }
                        Handed::Spare(l) => spare.push(l),
                        Handed::Nobody => {}
                    }
                }
                if !served {
                    break;
                }
            }
        }
        drop(spare);
    }

    /// One of the pool's seats for short requests, if one is free
    /// ([`crate::admission::seats::Seats::short_seats`]), on any healthy
    /// replica whatever its streams hold.
    pub(super) fn short_seat(self: &Arc<Self>, key: Option<&RouteKey>) -> Option<Lease> {
        let most = self.seats(&self.pool.load()).short_seats();
        self.short_inflight.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| (n < most).then_some(n + 1)).ok()?;
        match self.try_lease_over(Tier::Interactive, BESIDE, key) {
            Ok(mut lease) => {
                lease.short = true;
                Some(lease)
            }
            Err(_) => {
                self.short_inflight.fetch_sub(1, Ordering::SeqCst);
                None
            }
        }
    }

    /// A short request's seat came free: short requests that queued (all
    /// the seats were taken when they came) take free ones, in order.
    pub(super) fn seat_short_waiters(self: &Arc<Self>) {
        // A lease nobody took is dropped after the lock is released.
        let mut spare: Option<Lease> = None;
        {
            let Some(mut q) = self.waiting.lock() else { return };
            let now = Instant::now();
            loop {
                let next = q.interactive.iter().find(|w| w.claim.short).map(|w| (w.claim.share.tenant, w.id, w.key.clone()));
                let Some((tenant, id, key)) = next else { break };
                let Some(lease) = spare.take().or_else(|| self.short_seat(key.as_deref())) else { break };
                let Some(w) = q.interactive.remove(tenant, id) else {
                    spare = Some(lease);
                    break;
                };
                match self.give(&mut q, Tier::Interactive, w, lease, now) {
                    Given::Served => {}
                    Given::Gone(l) => spare = Some(l),
                    Given::Nobody => break,
                }
            }
        }
        drop(spare);
    }

    /// A slot for one of `tenant`'s next waiters in `tier`: the first of
    /// them (up to [`WINDOW`]) that a replica holding its prompt's prefix
    /// has a free slot for (with its id), else one for the first waiter.
    /// A preempted stream waits first in its tenant's line and takes the
    /// next slot wherever it is: its client holds part of its answer, and
    /// passed over for waiters whose prefix is cached it could wait
    /// minutes (docs/design/preemption.md, rule 9).
    fn lease_for_next(self: &Arc<Self>, q: &Queues, tier: Tier, tenant: u32) -> Result<(Lease, Option<u64>), PickError> {
        let queue = match tier {
            Tier::Interactive => &q.interactive,
            Tier::Batch => &q.batch,
        };
        if queue.first_of(tenant, 1).any(|w| w.claim.resumed) {
            return self.try_lease_over(tier, 0, None).map(|l| (l, None));
        }
        let next: Vec<_> = queue.first_of(tenant, WINDOW).map(|w| (w.id, w.key.clone())).collect();
        if next.len() > 1 {
            for (id, key) in &next {
                if let Some(lease) = key
                    .as_deref()
                    .and_then(|k| self.try_lease_on(Asking { tier, extra: 0, key: Some(k), holding: true, patient: false }).ok())
                {
                    return Ok((lease, Some(*id)));
                }
            }
        }
        let first = next.first().and_then(|(_, k)| k.clone());
        // The tenant's first waiter has waited a fleet period: a seat no
        // instance holds is its to take, though others have requests
        // waiting (docs/design/fleet.md rule 9).
        let patient = tier == Tier::Interactive
            && self
                .fleet
                .load()
                .as_ref()
                .is_some_and(|f| queue.first_of(tenant, 1).any(|w| Instant::now().saturating_duration_since(w.enqueued) >= f.period));
        self.try_lease_on(Asking { tier, extra: 0, key: first.as_deref(), holding: false, patient }).map(|l| (l, None))
    }

    /// Give `lease` to `chosen` (a waiter's id), else to `tenant`'s first
    /// waiter; to the next one if that one's client went away.
    fn hand(self: &Arc<Self>, q: &mut Queues, tier: Tier, tenant: u32, chosen: Option<u64>, mut lease: Lease, now: Instant) -> Handed {
        let mut chosen = chosen;
        loop {
            let next = match chosen.take() {
                Some(id) => q.of(tier).remove(tenant, id),
                None => q.of(tier).pop_tenant(tenant),
            };
            let Some(w) = next else { return Handed::Spare(lease) };
            match self.give(q, tier, w, lease, now) {
                Given::Served => return Handed::Served,
                Given::Gone(l) => lease = l,
                Given::Nobody => return Handed::Nobody,
            }
        }
    }

    /// Give `lease` to `w`, taken out of `tier`'s queue: it is counted out
    /// of the queue, and its tenant charged once its client has the lease.
    fn give(&self, q: &mut Queues, tier: Tier, w: Waiter, mut lease: Lease, now: Instant) -> Given {
        self.waiting.dec(tier, w.bytes);
        if tier == Tier::Interactive {
            self.note_interactive();
        }
        let standing = self.standing(q, tier, w.claim);
        lease.claimed(w.claim, standing);
        match w.tx.send(Ok(lease)) {
            Ok(()) => {
                if w.claim.fair {
                    q.of(tier).charge(w.claim.share, w.claim.tokens as f64);
                }
                if tier == Tier::Batch {
                    q.last_batch_grant = Some(now);
                }
                Given::Served
            }
            // Its client went away in the meantime: the lease, claimed by
            // nobody (its tenant was never charged), goes to the next one.
            Err(Ok(mut l)) => {
                l.claimed(Claim::default(), Default::default());
                Given::Gone(l)
            }
            Err(Err(_)) => Given::Nobody,
        }
    }
}
