//! How a pool's leases give their slots back: [`Seating`] for
//! [`PoolAdmission`] (the lease does not know the queue; the queue hands the
//! freed slot to the next waiter).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::PoolAdmission;
use crate::admission::lease::{Claim, Lease, Requeued, Seating};
use crate::config::Tier;
use crate::upstream::{Replica, ReplicaSlot, Room};

impl Seating for PoolAdmission {
    fn released(self: Arc<Self>, lease: &Lease) {
        if lease.fair {
            if let Some(mut q) = self.waiting.lock() {
                let q = q.of(lease.tier);
                if let Some(used) = lease.used.filter(|u| *u != lease.charged) {
                    q.settle(lease.share, used as f64 - lease.charged as f64);
                }
                q.ended(lease.share);
            }
        }
        match lease.tier {
            Tier::Batch => {
                self.batch_inflight.fetch_sub(1, Ordering::SeqCst);
            }
            Tier::Interactive => {
                self.interactive_inflight.fetch_sub(1, Ordering::SeqCst);
            }
        }
        if lease.short {
            self.short_inflight.fetch_sub(1, Ordering::SeqCst);
            if self.waiting.depth(Tier::Interactive) > 0 {
                self.clone().seat_short_waiters();
            }
        }
        self.released[lease.tier as usize].fetch_add(1, Ordering::Relaxed);
        self.waiting.slot_freed();
        if self.waiting.depth(Tier::Interactive) + self.waiting.depth(Tier::Batch) > 0 {
            self.dispatch();
        }
    }

    /// Keeps the tier's count: the lease moves, it does not end.
    fn another(&self, from: &Arc<Replica>, tier: Tier) -> Option<ReplicaSlot> {
        let pool = self.pool.load();
        let room = match tier {
            Tier::Interactive => Room::Over(0),
            Tier::Batch => Room::Leave(self.seats(&pool).batch_leaves()),
        };
        pool.pick(Some(from), room, tier, None).ok()
    }

    fn onto(&self, to: &Arc<Replica>, tier: Tier) -> Option<ReplicaSlot> {
        self.pool.load().slot_on(to, tier)
    }

    fn freed(self: Arc<Self>) {
        self.waiting.slot_freed();
        self.dispatch();
    }

    /// Only where a batch prompt can be held: under `upstream_priority`
    /// none is, and a first token frees no slot.
    fn prefilled(self: Arc<Self>) {
        if self.waiting.depth(Tier::Batch) > 0 && !self.pool.load().config.upstream_priority {
            self.dispatch();
        }
    }

    fn enlist(&self, victim: std::sync::Weak<crate::admission::preempt::Victim>) {
        self.preemption.enlist(victim);
    }

    fn ask_on(&self, replica: &Arc<Replica>) -> bool {
        replica.waits_for_a_slot(self.pool.load().config.upstream_priority)
            && self.preemption.ask_on(crate::admission::preempt::replica_key(replica), 1)
    }

    fn requeue(self: Arc<Self>, tier: Tier, claim: Claim) -> Requeued {
        Box::pin(async move { self.admit(tier, 0, claim, None).await.map(|g| g.lease) })
    }
}
