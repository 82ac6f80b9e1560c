//! Taking a slot now, without queueing: how far above its slots an
//! interactive request may go, batch within its room, and the pick on the
//! pool's replicas (docs/design/seats.md).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::PoolAdmission;
use crate::admission::lease::Lease;
use crate::config::Tier;
use crate::upstream::prefix::RouteKey;
use crate::upstream::{PickError, Pool, Room};

/// What a request asks of the pool's slots now.
#[derive(Debug, Clone, Copy)]
pub(super) struct Asking<'a> {
    pub(super) tier: Tier,
    /// How many more an interactive request may go above the slots.
    pub(super) extra: usize,
    /// Its prompt, for prefix-aware routing.
    pub(super) key: Option<&'a RouteKey>,
    /// Only on a replica holding the most of `key`'s prompt ([`Pool::pick_holding`]).
    pub(super) holding: bool,
    /// An interactive request that has waited a fleet period ([`Room::Patient`]).
    pub(super) patient: bool,
}

impl PoolAdmission {
    /// How far above the slot count an interactive request may go now: what
    /// batch holds above its limit, and with `upstream_priority` the rest of
    /// the reserved share (see [`crate::admission::seats::Seats::interactive_over_prioritised`]).
    pub(super) fn interactive_over(&self, pool: &Pool) -> usize {
        let seats = self.seats(pool);
        if !pool.config.upstream_priority {
            return seats.batch_excess();
        }
        seats.interactive_over_prioritised(|| {
            pool.replicas.iter().filter(|r| r.is_healthy()).map(|r| r.inflight()).sum::<usize>().saturating_sub(seats.cap)
        })
    }

    /// Take a slot for a request of `tier` now, if one is free: a healthy
    /// replica with a free slot and, for batch, room under the batch limit.
    /// Does not queue.
    #[cfg(test)]
    pub(crate) fn try_lease(self: &Arc<Self>, tier: Tier) -> Result<Lease, PickError> {
        self.try_lease_over(tier, 0, None)
    }

    /// [`PoolAdmission::try_lease`], an interactive request allowed `extra`
    /// more above the slots.
    /// `key`: the request's prompt, for prefix-aware routing.
    pub(super) fn try_lease_over(self: &Arc<Self>, tier: Tier, extra: usize, key: Option<&RouteKey>) -> Result<Lease, PickError> {
        self.try_lease_on(Asking { tier, extra, key, holding: false, patient: false })
    }

    /// Take a slot as `ask` says. A replica still in slow start takes more
    /// at once when every slot is taken (docs/design/learned-limits.md rule
    /// 15), so a fresh gateway does not queue what its replicas could run.
    pub(super) fn try_lease_on(self: &Arc<Self>, ask: Asking<'_>) -> Result<Lease, PickError> {
        match self.lease_now(ask) {
            Err(PickError::Saturated) if self.pool.load().grow_on_demand() => self.lease_now(ask),
            leased => leased,
        }
    }

    fn lease_now(self: &Arc<Self>, ask: Asking<'_>) -> Result<Lease, PickError> {
        let Asking { tier, extra, key, holding, patient } = ask;
        let pool = self.pool.load();
        let room = match tier {
            Tier::Interactive if patient => Room::Patient(self.interactive_over(&pool) + extra),
            Tier::Interactive => Room::Over(self.interactive_over(&pool) + extra),
            Tier::Batch => {
                // Within the batch ceiling (see [`Seats::batch_ceiling`]);
                // in a fleet whose replicas run interactive requests first,
                // past it on seats no instance holds, within the fleet's
                // batch (see [`Seats::batch_room`]).
                let seats = self.seats(&pool);
                let limit = if pool.config.upstream_priority { seats.batch_room() } else { seats.batch_ceiling() };
                let Ok(held) = self.batch_inflight.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| (n < limit).then_some(n + 1))
                else {
                    return Err(if pool.healthy_count() == 0 { PickError::NoHealthy } else { PickError::Saturated });
                };
                if held < seats.batch_ceiling() {
                    Room::Leave(seats.batch_leaves())
                } else {
                    Room::Unheld(seats.batch_leaves())
                }
            }
        };
        let picked = match (key, holding) {
            (Some(k), true) => pool.pick_holding(room, tier, k),
            _ => pool.pick(None, room, tier, key),
        };
        match picked {
            Ok(slot) => {
                if tier == Tier::Interactive {
                    self.interactive_inflight.fetch_add(1, Ordering::SeqCst);
                }
                Ok(Lease::new(slot, tier, self.clone()))
            }
            Err(e) => {
                if tier == Tier::Batch {
                    self.batch_inflight.fetch_sub(1, Ordering::SeqCst);
                }
                Err(e)
            }
        }
    }
}
