//! A request's hold on one of a replica's slots: taken when the request
//! is routed, given back exactly once, when dropped or released.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::take::Seat;
use super::Replica;
use crate::config::Tier;

/// A held slot on one replica: taken by [`Pool::pick`], given back exactly
/// once, when dropped or [released](ReplicaSlot::release) (whichever comes
/// first).
pub(crate) struct ReplicaSlot {
    replica: Arc<Replica>,
    held: bool,
    tier: Tier,
    /// Counted in the replica's `prefilling` of its tier until the first
    /// token arrives or the slot is given back.
    prefilling: bool,
    /// Counted in the replica's `prefill_bytes` of its tier as long.
    prefill_bytes: u64,
    /// Where its prompt is known: when it was dispatched, the prefill work
    /// ahead of it there and its own, and the time to first token predicted.
    dispatch: Option<(tokio::time::Instant, u64, Option<std::time::Duration>)>,
    /// A seat lent of the fleet's other instances' reserved parts: counted
    /// in the replica's lent seats until the slot goes back.
    lent: bool,
}

impl ReplicaSlot {
    pub(crate) fn replica(&self) -> &Arc<Replica> {
        &self.replica
    }

    /// When its first token is due by the replica's prediction at dispatch,
    /// and the time its own prefill takes there, were nothing ahead of it
    /// (`None` where no prediction was made: the prompt unknown, the model
    /// unlearned).
    pub(crate) fn first_token_due(&self) -> Option<(tokio::time::Instant, std::time::Duration)> {
        let (at, _, predicted) = self.dispatch?;
        Some((at + predicted?, self.replica.predict_first_token(self.prefill_bytes)?))
    }

    pub(super) fn new(replica: &Arc<Replica>, tier: Tier) -> ReplicaSlot {
        replica.seats.prefilling[tier as usize].fetch_add(1, Ordering::Relaxed);
        if tier == Tier::Batch {
            replica.seats.batch_held.fetch_add(1, Ordering::Relaxed);
        }
        ReplicaSlot { replica: replica.clone(), held: true, tier, prefilling: true, prefill_bytes: 0, dispatch: None, lent: false }
    }

    /// Its seat was lent (`Seat::Lent`): counted in the replica's lent
    /// seats (the pool's are their sum) until the slot goes back.
    pub(super) fn count_lent(&mut self, seat: Seat) {
        if seat == Seat::Lent && !self.lent {
            self.replica.seats.lent.fetch_add(1, Ordering::Relaxed);
            self.lent = true;
        }
    }

    /// Its request's prompt has `bytes` not expected in the replica's cache:
    /// prefill work ahead of the next request there until its first token.
    /// Its time to first token is predicted from the work ahead (as routing
    /// counts it: both tiers', or with `upstream_priority` an interactive
    /// request's only the interactive prompts', which the engine runs
    /// before the batch ones it has not started; where that errs, the
    /// prediction says so) and its own.
    pub(super) fn prefill(&mut self, bytes: u64, upstream_priority: bool) {
        if self.prefilling {
            let seats = &self.replica.seats;
            let ahead = seats.prefill_bytes_ahead(self.tier, upstream_priority);
            if self.dispatch.is_none() {
                let work = ahead + bytes;
                self.dispatch = Some((tokio::time::Instant::now(), work, self.replica.predict_first_token(work)));
            }
            seats.prefill_bytes[self.tier as usize].fetch_add(bytes, Ordering::Relaxed);
            self.prefill_bytes += bytes;
        }
    }

    /// The interactive request holding it has a first-token `target`: the
    /// replica's outlook, which batch leaves room for (preemption.md rule 14).
    pub(crate) fn interactive_target(&self, target: std::time::Duration) {
        self.replica.interactive_sent(target, self.prefill_bytes);
    }

    /// The request's first token arrived: its prefill is done, and its
    /// prediction judged (a no-op after the first call).
    pub(crate) fn prefilled(&mut self) {
        if let (true, Some((at, work, predicted))) = (self.prefilling, self.dispatch.take()) {
            self.replica.first_token_came(work, predicted, at.elapsed());
        }
        self.prefill_done();
    }

    /// No more prefill ahead of others here: the first token came, or the slot goes back.
    fn prefill_done(&mut self) {
        if std::mem::take(&mut self.prefilling) {
            self.replica.delivered();
            self.replica.seats.prefilling[self.tier as usize].fetch_sub(1, Ordering::Relaxed);
            self.replica.seats.prefill_bytes[self.tier as usize].fetch_sub(std::mem::take(&mut self.prefill_bytes), Ordering::Relaxed);
        }
    }

    /// Give the slot back now (a no-op the second time).
    pub(crate) fn release(&mut self) {
        self.prefill_done();
        if std::mem::take(&mut self.held) {
            self.replica.seats.inflight.fetch_sub(1, Ordering::SeqCst);
            if let Some(g) = self.replica.gauges.get() {
                g.inflight.dec();
            }
            if self.tier == Tier::Batch {
                self.replica.seats.batch_held.fetch_sub(1, Ordering::Relaxed);
            }
            if std::mem::take(&mut self.lent) {
                self.replica.seats.lent.fetch_sub(1, Ordering::Relaxed);
            }
        }
    }
}

impl Drop for ReplicaSlot {
    fn drop(&mut self) {
        self.release();
    }
}

impl std::fmt::Debug for ReplicaSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReplicaSlot").field("replica", &self.replica.url).field("held", &self.held).finish()
    }
}
