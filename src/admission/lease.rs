//! A request's hold on one replica slot ([`Lease`]), counted against its
//! tier's share and its tenant's, and given back exactly once.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::fair::Share;
use super::queue::{Claim, PoolAdmission};
use crate::config::Tier;
use crate::upstream::{Replica, ReplicaSlot, Room};

/// A request's hold on one replica slot, counted against its tier's share.
/// It travels inside the response body and is released exactly once, by
/// `Drop`, when the stream ends or the client goes away (never when the
/// response headers arrive); the freed slot goes to the next waiter.
pub(crate) struct Lease {
    pub(super) slot: ReplicaSlot,
    pub(super) tier: Tier,
    pub(super) admission: Arc<PoolAdmission>,
    /// Whose service it is, and the tokens charged to it when it was granted.
    pub(super) share: Share,
    pub(super) charged: u64,
    /// Its tenant's service is accounted for (see [`Claim::fair`]).
    pub(super) fair: bool,
    /// The tokens it used, once the replica said (settled against `charged` at the end).
    pub(super) used: Option<u64>,
    /// Its tenant held less than its fair part of the tier when it was granted.
    pub(super) under_share: bool,
}

impl Lease {
    pub(crate) fn replica(&self) -> &Arc<Replica> {
        self.slot.replica()
    }

    /// The request's first token arrived: the replica no longer counts it
    /// among the prefills a new request would wait behind.
    pub(crate) fn first_token(&mut self) {
        self.slot.prefilled();
    }

    /// Granted for `claim`: whose service it is and what it was charged;
    /// `under_share`: its tenant held less than its fair part of the tier.
    pub(super) fn claimed(&mut self, claim: Claim, under_share: bool) {
        (self.share, self.charged, self.fair, self.under_share) = (claim.share, claim.tokens, claim.fair, under_share);
    }

    /// Its `priority` for vLLM's scheduler, which serves lower values first:
    /// interactive before batch, and among interactive requests a tenant
    /// under its fair part before the others (its prefill does not wait
    /// behind a heavy tenant's in the replica).
    pub(crate) fn upstream_priority(&self, tier: crate::config::Tier) -> i64 {
        match tier {
            crate::config::Tier::Interactive if self.under_share => -1,
            crate::config::Tier::Interactive => 0,
            crate::config::Tier::Batch => 1,
        }
    }

    /// The replica said the request used `tokens` (prompt plus completion):
    /// its tenant's service is settled to that when the lease goes.
    pub(crate) fn settle(&mut self, tokens: u64) {
        self.used = Some(tokens);
    }

    #[cfg(test)]
    pub(crate) fn tier(&self) -> Tier {
        self.tier
    }
}

impl crate::upstream::Attempts for Lease {
    fn replica(&self) -> &Arc<Replica> {
        self.slot.replica()
    }

    /// Move to a slot on another healthy replica, keeping the tier's count;
    /// the slot left behind goes to the next waiter.
    fn move_to_another(&mut self) -> bool {
        let pool = self.admission.pool.load();
        let room = match self.tier {
            Tier::Interactive => Room::Over(0),
            Tier::Batch => self.admission.batch_room(&pool),
        };
        match pool.pick(Some(self.slot.replica()), room, self.tier) {
            Ok(other) => {
                self.slot = other;
                self.admission.dispatch();
                true
            }
            Err(_) => false,
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        // The slot first, so the waiter handed it below can take it.
        self.slot.release();
        if self.fair {
            if let Ok(mut q) = self.admission.inner.lock() {
                let q = q.of(self.tier);
                if let Some(used) = self.used.filter(|u| *u != self.charged) {
                    q.settle(self.share, used as f64 - self.charged as f64);
                }
                q.ended(self.share);
            }
        }
        match self.tier {
            Tier::Batch => self.admission.batch_inflight.fetch_sub(1, Ordering::SeqCst),
            Tier::Interactive => self.admission.interactive_inflight.fetch_sub(1, Ordering::SeqCst),
        };
        self.admission.released(self.tier);
    }
}

impl std::fmt::Debug for Lease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lease").field("replica", &self.slot.replica().url).field("tier", &self.tier).finish()
    }
}
