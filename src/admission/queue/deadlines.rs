//! How long a queued request waits, and what it is told when it stops:
//! the moments it is looked at again (its class's TTFT target, the
//! caller's deadline, the queue timeout) and the refusal each one gives.
//! The rules are docs/design/seats.md's (15 to 18) and
//! docs/design/fair-share.md's (18 to 21).

use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;

use super::PoolAdmission;
use crate::admission::fair::Standing;
use crate::admission::lease::{Claim, Lease, OverWhy, Refusal};
use crate::admission::rates;
use crate::admission::waiting::Queues;
use crate::config::Tier;

/// The share of the time an interactive request can wait and still make
/// its TTFT target after which, still waiting, it asks a batch stream for
/// its slot: the rest covers the victim's engine noticing the request went
/// away (docs/design/preemption.md, rule 1).
const PREEMPT_AT: f64 = 0.75;

/// A queued request's moments of truth.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Deadlines {
    start: Instant,
    /// The queue timeout.
    timeout: Instant,
    /// Interactive: the last moment it can still make its class's TTFT
    /// target, with the replicas' recent time to a first token (that time,
    /// as it is told when refused).
    late: Option<(Instant, Duration)>,
    /// `tiers.interactive.shed_late`: refuse everyone past `late`, not only
    /// tenants over their parts.
    shed_late: bool,
    /// Where the pool preempts: the moment a request still waiting asks a
    /// batch stream for its slot (docs/design/preemption.md, rule 1).
    pub(super) preempt: Option<Instant>,
    /// The caller's own deadline.
    caller: Option<Instant>,
}

/// What a moment checks.
#[derive(Debug, Clone, Copy)]
enum Check {
    Late(Duration),
    Preempt,
    Caller,
    Timeout,
}

impl Deadlines {
    /// The moments in order, none after the queue timeout (the last).
    fn checks(&self) -> Vec<(Instant, Check)> {
        let mut at = vec![(self.timeout, Check::Timeout)];
        if let Some((t, expected)) = self.late {
            at.push((t, Check::Late(expected)));
        }
        if let Some(t) = self.caller {
            at.push((t, Check::Caller));
        }
        if let Some(t) = self.preempt {
            at.push((t, Check::Preempt));
        }
        at.retain(|(t, _)| *t <= self.timeout);
        at.sort_by_key(|(t, _)| *t);
        at
    }

    /// The moment it stops waiting whoever its tenant is: the earliest of
    /// the queue timeout, the caller's deadline, and with `shed_late` its
    /// class's TTFT target.
    pub(super) fn last(&self) -> Instant {
        let late = self.late.filter(|_| self.shed_late).map(|(t, _)| t);
        [Some(self.timeout), self.caller, late].into_iter().flatten().min().unwrap_or(self.timeout)
    }
}

impl PoolAdmission {
    /// The moments a request of `claim` in `tier`, arrived at `start`, is
    /// looked at while it waits.
    pub(super) fn deadlines(&self, tier: Tier, claim: Claim, start: Instant) -> Deadlines {
        let pool = self.pool.load();
        let (late, at_risk) = match (tier, claim.ttft) {
            (Tier::Interactive, Some(target)) => {
                // A short request's answer takes milliseconds once it has a
                // seat: the streams' time to a first token is not its.
                let expected = |share: f64| if claim.short { Duration::ZERO } else { target.mul_f64(share.min(1.0)) };
                // A slot for it is at risk once the replicas' 90th percentile
                // time to a first token would not make its target. It can no
                // longer make it at that moment too where other interactive
                // requests wait (a slot spent on it would make them late);
                // with nobody waiting, once even their median would not: it
                // would take no one's slot (seats.md rule 16).
                let tail = expected(pool.first_token_p90());
                let alone = self.waiting.ahead_of(Tier::Interactive) == 0;
                let judged = if alone { expected(pool.first_token_p50()).min(tail) } else { tail };
                (Some((start + target.saturating_sub(judged), judged)), Some(start + target.saturating_sub(tail)))
            }
            _ => (None, None),
        };
        // A preempted stream's client holds part of its answer: it waits as
        // long as the stream may be idle, not as long as a new request would
        // (docs/design/preemption.md, rule 9).
        let timeout = match claim.resumed {
            true => self.timeout(tier).max(pool.config.timeouts.idle.get()),
            false => self.timeout(tier),
        };
        let preempt = at_risk.filter(|_| pool.config.preempts() && !claim.short).map(|t| start + (t - start).mul_f64(PREEMPT_AT));
        Deadlines {
            start,
            timeout: start + timeout,
            late,
            preempt,
            shed_late: tier == Tier::Interactive && self.tiers.load().interactive.shed_late,
            caller: claim.deadline,
        }
    }

    /// Under the queue lock, as the request joins it at `now`: a moment
    /// already past, or a caller's deadline the queue cannot make at its
    /// present rate, refuses it at once.
    pub(super) fn refused_now(&self, q: &Queues, tier: Tier, claim: Claim, d: &Deadlines, now: Instant) -> Option<Refusal> {
        for (at, check) in d.checks() {
            if at <= now {
                if let Some(r) = self.judge(q, tier, claim, d, check) {
                    return Some(r);
                }
            }
        }
        let caller = d.caller?;
        let rate = self.rate(tier)?;
        // Tenants take turns: one within its part waits behind its own requests only.
        let ahead = match self.standing(q, tier, claim) {
            Standing::Under => q.interactive.waiting_of(claim.share.tenant),
            _ => self.waiting.ahead_of(tier),
        };
        (now + rates::queue_wait(ahead, Some(rate)) > caller).then(|| self.judge(q, tier, claim, d, Check::Caller)).flatten()
    }

    /// Under the queue lock, as an interactive request joins it: when the
    /// pace the pool's slots free at says it will still be waiting at its
    /// preemption moment, a batch stream is asked for its slot now rather
    /// than then (docs/design/preemption.md, rule 1). Without a pace
    /// measured yet, it asks at its moment.
    pub(super) fn preempt_if_late(&self, q: &Queues, d: &Deadlines) {
        let Some(at) = d.preempt else { return };
        let rate: f64 = [Tier::Interactive, Tier::Batch].into_iter().filter_map(|t| self.rate(t)).sum();
        if rate <= 0.0 {
            return;
        }
        let ahead = q.interactive.len().saturating_sub(1);
        if Instant::now() + rates::queue_wait(ahead, Some(rate)) >= at {
            self.preemption.ask_one(q.interactive.len());
        }
    }

    /// Wait on `rx` for a slot, looking at the request again at each of
    /// `d`'s moments.
    pub(super) async fn wait(
        &self,
        mut rx: oneshot::Receiver<Result<Lease, Refusal>>,
        d: &Deadlines,
        tier: Tier,
        claim: Claim,
    ) -> Result<Lease, Refusal> {
        for (at, check) in d.checks() {
            match tokio::time::timeout_at(at, &mut rx).await {
                Ok(Ok(result)) => return result,
                // The queue went away (its pool was replaced); nothing will come.
                Ok(Err(_)) => return Err(Refusal::NoHealthy),
                Err(_) => {
                    let Some(q) = self.waiting.lock() else { return Err(Refusal::NoHealthy) };
                    if let Check::Preempt = check {
                        self.preemption.ask_one(q.interactive.len());
                        continue;
                    }
                    if let Some(refusal) = self.judge(&q, tier, claim, d, check) {
                        return Err(refusal);
                    }
                }
            }
        }
        Err(Refusal::Timeout { retry_after: self.retry_after(tier, self.depth(tier)) })
    }

    /// A waiting request of `claim` reached `check`: its refusal, or `None`
    /// to go on waiting. A tenant over its part is refused at its class's
    /// TTFT target whatever `shed_late` says: its wait is its own doing.
    fn judge(&self, q: &Queues, tier: Tier, claim: Claim, d: &Deadlines, check: Check) -> Option<Refusal> {
        let standing = self.standing(q, tier, claim);
        let retry_after = self.retry_after(tier, self.depth(tier));
        match (check, standing) {
            (Check::Preempt, _) => None,
            (Check::Late(_), Standing::Over(over)) => Some(self.over_share(over, OverWhy::Late)),
            (Check::Late(expected), _) => d.shed_late.then_some(Refusal::Late { retry_after, expected }),
            (Check::Caller, _) => Some(Refusal::Deadline { retry_after, deadline: d.caller.map_or(Duration::ZERO, |c| c - d.start) }),
            (Check::Timeout, Standing::Over(over)) => Some(self.over_share(over, OverWhy::Timeout)),
            (Check::Timeout, _) => Some(Refusal::Timeout { retry_after }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn deadlines(late_ms: Option<u64>, caller_ms: Option<u64>, shed_late: bool) -> Deadlines {
        let start = Instant::now();
        let ms = Duration::from_millis;
        Deadlines {
            start,
            timeout: start + ms(2000),
            late: late_ms.map(|l| (start + ms(l), ms(100))),
            shed_late,
            preempt: None,
            caller: caller_ms.map(|c| start + ms(c)),
        }
    }

    #[test]
    fn the_moments_come_in_order_and_none_after_the_queue_timeout() {
        let d = deadlines(Some(200), Some(900), false);
        let order: Vec<_> = d.checks().iter().map(|(t, c)| ((*t - d.start).as_millis(), format!("{c:?}"))).collect();
        assert_eq!(order, [(200, "Late(100ms)".to_string()), (900, "Caller".into()), (2000, "Timeout".into())]);
        let d = deadlines(None, Some(5000), false);
        assert_eq!(d.checks().len(), 1, "a caller's deadline after the queue timeout changes nothing");
    }

    #[test]
    fn a_request_stops_waiting_for_everyone_at_the_earliest_binding_moment() {
        let ms = Duration::from_millis;
        let d = deadlines(Some(200), None, false);
        assert_eq!(d.last() - d.start, ms(2000), "without shed_late the target binds over-share tenants only");
        let d = deadlines(Some(200), None, true);
        assert_eq!(d.last() - d.start, ms(200));
        let d = deadlines(Some(200), Some(150), false);
        assert_eq!(d.last() - d.start, ms(150));
    }
}
