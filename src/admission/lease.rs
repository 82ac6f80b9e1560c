//! A request's hold on a replica slot ([`Lease`]), what it claims of its
//! tenant's share ([`Claim`]), and why a request got none ([`Refusal`]).
//!
//! A lease gives its slot back through [`Seating`], which the pool's
//! admission implements: the lease knows what it holds, the admission
//! knows who waits for it.

use std::sync::Arc;
use std::time::Duration;

use super::fair::{OverShare, Share, Standing};
use crate::config::Tier;
use crate::telemetry::accounting::Finished;
use crate::upstream::{Replica, ReplicaSlot};

/// Where a lease's slot goes back to: its pool's admission.
pub(crate) trait Seating: Send + Sync {
    /// `lease` ended (its slot is already freed): count it out, settle its
    /// tenant's service and hand the slot to the next waiter.
    fn released(self: Arc<Self>, lease: &Lease);
    /// Another healthy replica's slot for a request of `tier` now on
    /// `from`'s, if there is one.
    fn another(&self, from: &Arc<Replica>, tier: Tier) -> Option<ReplicaSlot>;
    /// A slot on `to` itself for a request of `tier`, if it is healthy and
    /// still one of the pool's (see [`crate::upstream::Pool::slot_on`]).
    fn onto(&self, to: &Arc<Replica>, tier: Tier) -> Option<ReplicaSlot>;
    /// A slot was freed while its lease goes on (it moved): hand it on.
    fn freed(self: Arc<Self>);
    /// A request's first token came: prefill work is no longer ahead on its
    /// replica, so a batch request held for it may take a slot now.
    fn prefilled(self: Arc<Self>);
    /// `victim`, a batch stream holding a slot, may give it up for an
    /// interactive request (where the pool preempts; see [`super::preempt`]).
    fn enlist(&self, victim: std::sync::Weak<super::preempt::Victim>);
    /// Ask a batch stream on `replica` for its slot, where the replica
    /// likely keeps an interactive request waiting for one
    /// ([`Replica::waits_for_a_slot`]; see [`super::preempt::Preemption::ask_on`]).
    fn ask_on(&self, replica: &Arc<Replica>) -> bool;
    /// A preempted stream gave its slot back (its lease is dropped): wait
    /// in `tier`'s queue as `claim` for another.
    fn requeue(self: Arc<Self>, tier: Tier, claim: Claim) -> Requeued;
}

/// A preempted stream's wait for a slot again.
pub(crate) type Requeued = std::pin::Pin<Box<dyn std::future::Future<Output = Result<Lease, Refusal>> + Send>>;

/// A request's hold on one replica slot, counted against its tier's share.
/// It travels inside the response body and is released exactly once, by
/// `Drop`, when the stream ends or the client goes away (never when the
/// response headers arrive); the freed slot goes to the next waiter.
pub(crate) struct Lease {
    pub(super) slot: ReplicaSlot,
    pub(super) tier: Tier,
    seating: Arc<dyn Seating>,
    /// Whose service it is, and the tokens charged to it when it was granted.
    pub(super) share: Share,
    pub(super) charged: u64,
    /// Its tenant's service is accounted for (see [`Claim::fair`]).
    pub(super) fair: bool,
    /// The tokens it used, once the replica said (settled against `charged` at the end).
    pub(super) used: Option<u64>,
    /// Where its tenant stood against its fair part of the tier when it was granted.
    pub(super) standing: Standing,
    /// A short request's own seat (see `PoolAdmission::seat_above`).
    pub(super) short: bool,
}

impl Lease {
    /// A lease on `slot` for a request of `tier`, given back to `seating`.
    pub(super) fn new(slot: ReplicaSlot, tier: Tier, seating: Arc<dyn Seating>) -> Lease {
        Lease { slot, tier, seating, share: Share::default(), charged: 0, fair: false, used: None, standing: Standing::Alone, short: false }
    }

    pub(crate) fn replica(&self) -> &Arc<Replica> {
        self.slot.replica()
    }

    /// The request's first token arrived: the replica no longer counts it
    /// among the prefills a new request would wait behind, and a batch
    /// prompt held for it may go now (docs/design/preemption.md, rule 14).
    pub(crate) fn first_token(&mut self) {
        self.slot.prefilled();
        Arc::clone(&self.seating).prefilled();
    }

    /// The interactive request holding it has a first-token `target`: what
    /// batch leaves room for on its replica (preemption.md rule 14).
    pub(crate) fn interactive_target(&self, target: Duration) {
        self.slot.interactive_target(target);
    }

    /// Granted for `claim`: whose service it is and what it was charged;
    /// `standing`: where its tenant stood against its fair part of the tier.
    pub(super) fn claimed(&mut self, claim: Claim, standing: Standing) {
        (self.share, self.charged, self.fair, self.standing) = (claim.share, claim.tokens, claim.fair, standing);
    }

    /// Its tenant held its fair part of the tier or more when it was granted,
    /// while other tenants ran or waited: its wait for the slot was its
    /// tenant's doing, not the class's (docs/design/fair-share.md, rule 19).
    pub(crate) fn over_share(&self) -> bool {
        matches!(self.standing, Standing::Over(_))
    }

    /// The sample its class's breaker window takes of a first token after
    /// `ttft`, `queued` of it in the gateway's queue: the whole of it, but
    /// for a tenant over its share only the time after its wait.
    pub(crate) fn breaker_sample(&self, ttft: Duration, queued: Duration) -> Duration {
        if self.over_share() {
            ttft.saturating_sub(queued)
        } else {
            ttft
        }
    }

    /// Its `priority` for vLLM's scheduler, which serves lower values first:
    /// interactive before batch, and among interactive requests a tenant
    /// under its fair part before the others (its prefill does not wait
    /// behind a heavy tenant's in the replica).
    pub(crate) fn upstream_priority(&self, tier: Tier) -> i64 {
        match tier {
            Tier::Interactive if self.standing == Standing::Under => -1,
            Tier::Interactive => 0,
            Tier::Batch => 1,
        }
    }

    /// The replica said the request used `tokens` (prompt plus completion):
    /// its tenant's service is settled to that when the lease goes.
    pub(crate) fn settle(&mut self, tokens: u64) {
        self.used = Some(tokens);
    }

    /// The request is over: its tenant's service is settled to the tokens
    /// it used, when the replica said (the charge stands otherwise), and
    /// the replica counts the prompt tokens its cache held.
    pub(crate) fn finished(&mut self, f: &Finished) {
        if let Some(n) = f.used_tokens() {
            self.settle(n);
        }
        // What the replica's engine said of its prefix cache (not slogate's estimate).
        if let (Some(u), false) = (f.usage, f.usage_estimated) {
            self.slot.replica().served_prompt(u.prompt_tokens, u.cached_tokens);
        }
    }

    /// Move to a slot on `replica` (where the request's state is), keeping
    /// the tier's count; the slot left behind goes to the next waiter.
    /// False: that replica cannot take it (unhealthy, or gone).
    pub(crate) fn move_to(&mut self, replica: &Arc<Replica>) -> bool {
        if Arc::ptr_eq(self.slot.replica(), replica) {
            return true;
        }
        match self.seating.onto(replica, self.tier) {
            Some(slot) => {
                drop(std::mem::replace(&mut self.slot, slot));
                Arc::clone(&self.seating).freed();
                true
            }
            None => false,
        }
    }

    /// When its first token is due by its replica's prediction, and its own
    /// prefill's time there, if one was made.
    pub(crate) fn first_token_due(&self) -> Option<(tokio::time::Instant, std::time::Duration)> {
        self.slot.first_token_due()
    }

    /// Enlist the stream holding this lease as a preemption victim.
    pub(crate) fn enlist(&self, victim: std::sync::Weak<super::preempt::Victim>) {
        if let Some(v) = victim.upgrade() {
            v.on(super::preempt::replica_key(self.slot.replica()));
        }
        self.seating.enlist(victim);
    }

    /// This request has no first token at its moment: where its replica
    /// likely keeps it waiting for a slot (rather than prefilling it), ask a
    /// batch stream on that replica for its slot (docs/design/preemption.md, rule 1).
    pub(crate) fn ask_for_slot(&self) -> bool {
        self.seating.ask_on(self.slot.replica())
    }

    /// Give the slot back now (the waiter next in line takes it) and wait
    /// in the tier's queue for another, behind no one's back: the stream
    /// was served, so it is not shed for interactive work waiting.
    pub(crate) fn requeue(self) -> Requeued {
        let seating = self.seating.clone();
        let claim = Claim { share: self.share, tokens: 0, fair: self.fair, resumed: true, ..Claim::default() };
        let tier = self.tier;
        drop(self);
        seating.requeue(tier, claim)
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
        match self.seating.another(self.slot.replica(), self.tier) {
            Some(other) => {
                drop(std::mem::replace(&mut self.slot, other));
                // The slot left behind goes to the next waiter.
                Arc::clone(&self.seating).freed();
                true
            }
            None => false,
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        // The slot first, so the waiter handed it below can take it.
        self.slot.release();
        Arc::clone(&self.seating).released(self);
    }
}

impl std::fmt::Debug for Lease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lease").field("replica", &self.slot.replica().url).field("tier", &self.tier).finish()
    }
}

/// Why a request got no slot. `retry_after`: when a slot is likely free
/// again for it (bounded and spread when said, see `crate::error::retry_after`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Refusal {
    /// No replica of the pool is healthy (503).
    NoHealthy,
    /// The tier's queue is at `queue_capacity` (429).
    QueueFull { retry_after: Duration },
    /// Waiting, the request's body would take the tier's queue past
    /// `queue_max_bytes` (429).
    QueueBytesFull { retry_after: Duration },
    /// A batch request arrived while interactive requests wait (429).
    Shed { retry_after: Duration },
    /// Waited `queue_timeout` (429).
    Timeout { retry_after: Duration },
    /// Batch: cannot be served before its deadline at the current rate (429).
    Hopeless { retry_after: Duration },
    /// Interactive with `shed_late`: can no longer make its class's TTFT
    /// target (its wait plus the replicas' recent dispatch-to-first-token
    /// time, `expected`), so it does not wait for a slot it could not use (429).
    Late { retry_after: Duration, expected: Duration },
    /// The caller's own deadline (`x-slogate-deadline-ms`, or the OpenAI
    /// SDK's read timeout) passes before a slot is free (429).
    Deadline { retry_after: Duration, deadline: Duration },
    /// Interactive, several tenants: its tenant holds its fair part of the
    /// tier or more, and the request could not be seated (`why`) before
    /// those within their parts (429 `tenant_over_share`).
    OverShare { retry_after: Duration, over: OverShare, why: OverWhy },
}

/// What an over-share tenant's request ran into.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OverWhy {
    /// The queue was full.
    Full,
    /// It gave its place in a full queue to a tenant within its part.
    Displaced,
    /// It could no longer make its class's TTFT target.
    Late,
    /// It waited the queue timeout.
    Timeout,
}

impl Refusal {
    /// When a slot is likely free again (none for an unhealthy pool).
    pub(crate) fn retry_after(&self) -> Option<Duration> {
        use Refusal::*;
        match *self {
            NoHealthy => None,
            QueueFull { retry_after }
            | QueueBytesFull { retry_after }
            | Shed { retry_after }
            | Timeout { retry_after }
            | Hopeless { retry_after }
            | Late { retry_after, .. }
            | Deadline { retry_after, .. }
            | OverShare { retry_after, .. } => Some(retry_after),
        }
    }
}

/// A slot, and how long the request waited for it.
#[derive(Debug)]
pub(crate) struct Granted {
    pub(crate) lease: Lease,
    pub(crate) waited: Duration,
}

/// Who a request is for (its tenant's share of the tier) and the tokens it
/// is charged when it gets a slot (its estimate; settled at its end).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct Claim {
    pub(crate) share: Share,
    pub(crate) tokens: u64,
    /// Several tenants share the tier (keys are configured): account for
    /// service. With one tenant the order is first come, first served
    /// whatever the counters say, and a grant takes no lock.
    pub(crate) fair: bool,
    /// Its class's TTFT target (interactive classes; see `shed_late`).
    pub(crate) ttft: Option<Duration>,
    /// It holds a slot for milliseconds (embeddings, rerank, tokenize): it
    /// does not wait behind streams for one.
    pub(crate) short: bool,
    /// The caller's deadline: a request that cannot get a slot before it
    /// is refused (see [`Refusal::Deadline`]).
    pub(crate) deadline: Option<tokio::time::Instant>,
    /// A preempted stream waiting to go on: never shed or judged hopeless.
    pub(crate) resumed: bool,
}
