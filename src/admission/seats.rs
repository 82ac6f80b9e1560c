//! The seat arithmetic of a pool's admission: how many slots batch may
//! hold, the work-conserving interactive reservation (it follows
//! interactive demand, between a headroom and `reserved_share`), the fleet's
//! part of it, and the demand other instances are told.

use std::sync::atomic::Ordering;
use std::time::Duration;

use super::queue::{Demand, PoolAdmission};
use crate::upstream::{Pool, Room};

/// How far back the interactive demand the reservation follows looks.
pub(crate) const DEMAND_WINDOW: Duration = Duration::from_secs(30);
/// Slots kept free for interactive requests even after a quiet spell, as a
/// share of the pool's slots (at least one).
pub(super) const HEADROOM_SHARE: f64 = 0.05;
/// Seats above a pool's slots that interactive requests of tenants under
/// their fair part may take instead of waiting, as a share of the slots (at
/// least one). Each is given back at the next slot freed (not handed on).
pub(super) const FAIR_HEADROOM: f64 = 0.1;
/// Slots a tenant at or over its fair part leaves free while other tenants
/// are active, as a share of the pool's slots (at least one).
pub(super) const FAIR_RESERVE: f64 = 0.1;
/// The reservation covers the interactive demand's recent peak and this much more.
pub(crate) const DEMAND_MARGIN: f64 = 1.25;

/// The headroom of `cap` slots ([`HEADROOM_SHARE`], at least one).
pub(super) fn headroom(cap: usize) -> usize {
    ((cap as f64 * HEADROOM_SHARE).ceil() as usize).max(1)
}

impl PoolAdmission {
    /// Slots held by batch requests.
    #[cfg(test)]
    pub(crate) fn batch_inflight(&self) -> usize {
        self.batch_inflight.load(Ordering::SeqCst)
    }

    /// The most slots batch may hold: all but those reserved for
    /// interactive requests (at least one while any is free to share).
    ///
    /// The reservation is work-conserving: it follows interactive demand
    /// (its peak over [`DEMAND_WINDOW`], plus a quarter) up to
    /// `tiers.interactive.reserved_share` of the slots, and never goes below
    /// a headroom of [`HEADROOM_SHARE`] of them (at least one) while the
    /// share is not zero. With no interactive traffic batch may use all but
    /// the headroom; when interactive comes back, the headroom serves it at
    /// once, freed slots go to it first, and the reservation grows with its
    /// demand at the next tick. While an interactive class's TTFT P99 is
    /// over its target, the whole share is reserved.
    pub(crate) fn batch_limit(&self) -> usize {
        let cap = self.pool.load().capacity();
        self.batch_limit_of(cap, self.reserved(cap))
    }

    /// The batch limit on `cap` slots with `reserved` of them reserved.
    pub(super) fn batch_limit_of(&self, cap: usize, reserved: usize) -> usize {
        if reserved == 0 {
            return cap;
        }
        let share = self.tiers.load().interactive.reserved_share.clamp(0.0, 1.0);
        if share < 1.0 {
            (cap - reserved).max(1)
        } else {
            cap - reserved
        }
    }

    /// Interactive requests holding or waiting for a slot now, plus the
    /// headroom (0 with no reserved share). Batch admission leaves these
    /// too, even past the reservation's share (see
    /// [`PoolAdmission::try_lease_over`]).
    pub(super) fn reserved_now(&self, cap: usize) -> usize {
        let share = self.tiers.load().interactive.reserved_share.clamp(0.0, 1.0);
        if share == 0.0 || cap == 0 {
            return 0;
        }
        let now = self.interactive_inflight.load(Ordering::Relaxed) + self.waiting_interactive.load(Ordering::Relaxed);
        (now + headroom(cap)).min(cap)
    }

    /// What a batch request leaves to interactive ones where it picks a replica.
    pub(super) fn batch_room(&self, pool: &Pool) -> Room {
        let cap = pool.capacity();
        Room::Leave(self.reserved(cap).max(self.reserved_now(cap)))
    }

    /// The slots of `cap` reserved for interactive requests now (see
    /// [`PoolAdmission::batch_limit`]).
    pub(super) fn reserved(&self, cap: usize) -> usize {
        let share = self.tiers.load().interactive.reserved_share.clamp(0.0, 1.0);
        if share == 0.0 || cap == 0 {
            return 0;
        }
        let most = cap - (cap as f64 * (1.0 - share)).floor() as usize;
        let demand = self.interactive_demand.load(Ordering::Relaxed) as f64 * self.reservation_scale();
        // An interactive class over its TTFT target takes the whole share back.
        if self.interactive_at_risk.load(Ordering::Relaxed) {
            most
        } else {
            ((demand * DEMAND_MARGIN).ceil() as usize + headroom(cap)).min(most)
        }
    }

    /// The fleet's word: the replicas have `slots` for all instances, and the
    /// others hold or queue `interactive` interactive requests (`slots` 0: alone).
    pub(crate) fn set_fleet_interactive(&self, slots: usize, interactive: usize) {
        self.fleet_slots.store(slots, Ordering::Relaxed);
        self.others_interactive.store(interactive, Ordering::Relaxed);
    }

    /// The fleet's word on how much of its interactive peak this instance reserves for (0 to 1).
    pub(crate) fn set_reservation_scale(&self, scale: f64) {
        self.reservation_scale.store(scale.clamp(0.0, 1.0).to_bits(), Ordering::Relaxed);
    }

    pub(super) fn reservation_scale(&self) -> f64 {
        f64::from_bits(self.reservation_scale.load(Ordering::Relaxed))
    }

    /// This instance's demand on the pool, for the fleet's split of the
    /// replicas' slots: interactive (what its reservation follows: the recent
    /// peak and a quarter more, or what holds and waits now if that is more),
    /// batch (holding and waiting now), and how many of both wait.
    pub(crate) fn demand(&self) -> Demand {
        let waiting_i = self.waiting_interactive.load(Ordering::Relaxed);
        let waiting_b = self.waiting_batch.load(Ordering::Relaxed);
        let now = self.interactive_inflight.load(Ordering::Relaxed) + waiting_i;
        let peak = (self.interactive_demand.load(Ordering::Relaxed) as f64 * DEMAND_MARGIN).ceil() as usize;
        Demand {
            interactive: now.max(peak),
            interactive_now: now,
            batch: self.batch_inflight.load(Ordering::Relaxed) + waiting_b,
            waiting: waiting_i + waiting_b,
        }
    }

    /// How far above the slot count an interactive request may go now.
    ///
    /// Batch requests held above the batch limit (it shrank: interactive
    /// demand grew, or this instance's part of the fleet went to another)
    /// hold slots that are interactive's now: an interactive request may go
    /// that far above the slot count instead of waiting for them to end.
    /// With `upstream_priority` the replicas order their own queues by tier,
    /// so the whole reserved share is interactive's whatever batch holds:
    /// while interactive requests hold fewer than the share, one more goes
    /// to a replica at once, and a replica already full runs it next, ahead
    /// of every batch request it holds (from any instance of a fleet). In a
    /// fleet the share is the fleet's: of all the replicas' slots, less what
    /// the other instances' interactive requests hold or wait for.
    pub(super) fn interactive_over(&self, pool: &Pool) -> usize {
        let excess = self.batch_inflight.load(Ordering::SeqCst).saturating_sub(self.batch_limit());
        if !pool.config.upstream_priority {
            return excess;
        }
        let cap = pool.capacity();
        let fleet = self.fleet_slots.load(Ordering::Relaxed);
        let (slots, others) = if fleet > 0 { (fleet, self.others_interactive.load(Ordering::Relaxed)) } else { (cap, 0) };
        let share = self.tiers.load().interactive.reserved_share.clamp(0.0, 1.0);
        let most = slots - (slots as f64 * (1.0 - share)).floor() as usize;
        let room = most.saturating_sub(self.interactive_inflight.load(Ordering::SeqCst) + others);
        if room == 0 {
            // The share is taken: within the slots (and what batch holds above its limit) only.
            // Counting what is already above the slots here would let every
            // cut of one replica's limit raise what the others may hold, a
            // ratchet: in-flight climbing while the limits fall.
            return excess;
        }
        // Above the slots already (the room is counted from the slots).
        let above = pool.replicas.iter().filter(|r| r.is_healthy()).map(|r| r.inflight()).sum::<usize>().saturating_sub(cap);
        excess.max(room + above)
    }

    /// Interactive requests holding or waiting for a slot now; raises the tick's high mark.
    pub(super) fn note_interactive(&self) {
        let now = self.interactive_inflight.load(Ordering::Relaxed) + self.waiting_interactive.load(Ordering::Relaxed);
        self.interactive_high.fetch_max(now, Ordering::Relaxed);
    }
}
