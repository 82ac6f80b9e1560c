//! Preemption of batch streams for interactive requests, on engines that
//! serve their slots first come, first served: a batch stream that holds a
//! slot is enlisted as a [`Victim`]; an interactive request that must
//! queue asks the pool for one; the victim's body ends its replica request
//! (the engine frees the slot), gives the slot back, waits in the batch
//! queue, and continues its answer where it stopped. The rules are
//! docs/design/preemption.md's.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, Weak};

use futures_util::task::AtomicWaker;

/// The most times one stream is preempted (rule 4).
pub(crate) const MAX_PER_STREAM: u32 = 2;
/// A stream past this share of its `max_tokens` is near its end: it
/// finishes (rule 5).
const NEAR_END: f64 = 0.8;
/// An interactive stream with no first token at this share of its class's
/// TTFT target waits inside its engine: it asks for a slot there (rule 1).
pub(crate) const IN_ENGINE_AT: f64 = 0.4;
/// ... unless its replica predicted its first token later: it asks once
/// the prediction is overdue by this share of itself (rule 1) ...
const OVERDUE_BY: u32 = 4;
/// ... and at this share of the target at the latest (rule 1).
pub(crate) const IN_ENGINE_BY: f64 = 0.7;

/// When an interactive stream that took its slot at once, at `start`
/// with a first token `target`, asks a batch stream on its replica for a
/// slot if it has no first token yet: at 40 % of the target, or where the
/// replica predicted the first token at `due` (and its own prefill to take
/// `own`), once that is a quarter overdue, if later, but by 70 % of the
/// target; at once where the prediction is past the target (prefill work
/// ahead of it: a burst of prompts, which it waits behind for blocks or a
/// slot too); and not at all where a slot given then leaves less time than
/// its own prefill takes (rule 1). A long prompt's own prefill passes 40 %
/// of the target; asking then takes a slot the request did not need, and
/// asking too late for the slot to help costs a batch stream for nothing.
pub(crate) fn in_engine_ask_at(
    start: tokio::time::Instant,
    target: std::time::Duration,
    due: Option<(tokio::time::Instant, std::time::Duration)>,
) -> Option<tokio::time::Instant> {
    let early = start + target.mul_f64(IN_ENGINE_AT);
    let Some((due, own)) = due else { return Some(early) };
    if due > start + target {
        return (own <= target).then_some(start);
    }
    let latest = start + target.mul_f64(IN_ENGINE_BY);
    let at = early.max((due + due.saturating_duration_since(start) / OVERDUE_BY).min(latest));
    (at + own <= start + target).then_some(at)
}

/// One preemptible batch stream, as the pool sees it.
#[derive(Debug)]
pub(crate) struct Victim {
    asked: AtomicBool,
    /// Asked, it gave its slot back.
    gave_back: AtomicBool,
    waker: AtomicWaker,
    /// Tokens the client has.
    sent: AtomicU64,
    /// Its prompt's tokens (estimated): what a continuation prefills again
    /// besides what was sent.
    prompt: u64,
    /// Its `max_tokens`, when it said.
    max: Option<u64>,
    /// Times it was preempted before.
    before: u32,
    /// The replica its slot is on (see [`replica_key`]); 0 = not said.
    replica: AtomicUsize,
}

/// A replica as victims name it: the address of its shared state.
pub(crate) fn replica_key(r: &std::sync::Arc<crate::upstream::Replica>) -> usize {
    std::sync::Arc::as_ptr(r) as usize
}

impl Victim {
    pub(crate) fn new(prompt: u64, max: Option<u64>, before: u32) -> Victim {
        Victim {
            asked: AtomicBool::new(false),
            gave_back: AtomicBool::new(false),
            waker: AtomicWaker::new(),
            sent: AtomicU64::new(0),
            prompt,
            max,
            before,
            replica: AtomicUsize::new(0),
        }
    }

    /// Its slot is on replica `key` now.
    pub(crate) fn on(&self, key: usize) {
        self.replica.store(key, Ordering::Relaxed);
    }

    /// The client has `n` tokens.
    pub(crate) fn sent(&self, n: u64) {
        self.sent.store(n, Ordering::Relaxed);
    }

    /// Was it asked to give its slot up? (Registers `waker` to be woken when it is.)
    pub(crate) fn asked(&self, waker: &std::task::Waker) -> bool {
        self.waker.register(waker);
        self.asked.load(Ordering::Acquire)
    }

    /// It gave its slot back.
    pub(crate) fn gave_back(&self) {
        self.gave_back.store(true, Ordering::Release);
    }

    /// Asked, and its slot not back yet.
    fn owing(&self) -> bool {
        self.asked.load(Ordering::Acquire) && !self.gave_back.load(Ordering::Acquire)
    }

    /// The same stream as a victim again after this preemption (its
    /// prompt and `max_tokens` kept), unless it was preempted enough.
    pub(crate) fn again(&self) -> Option<Victim> {
        let times = self.before + u32::from(self.asked.load(Ordering::Relaxed));
        (times < MAX_PER_STREAM).then(|| Victim::new(self.prompt, self.max, times))
    }

    /// What a continuation prefills again (rule 6's cost).
    fn redo(&self) -> u64 {
        self.prompt + self.sent.load(Ordering::Relaxed)
    }

    fn eligible(&self) -> bool {
        let sent = self.sent.load(Ordering::Relaxed);
        let near_end = self.max.is_some_and(|m| sent as f64 >= m as f64 * NEAR_END);
        // A stream with nothing sent yet has nothing to splice from: it is
        // its replica's to start (rule 3).
        !self.asked.load(Ordering::Relaxed) && self.before < MAX_PER_STREAM && sent > 0 && !near_end
    }
}

/// A pool's preemptible streams.
#[derive(Debug, Default)]
pub(crate) struct Preemption {
    victims: Mutex<Vec<Weak<Victim>>>,
}

impl Preemption {
    /// `v` holds a slot of the pool and may give it up.
    pub(crate) fn enlist(&self, v: Weak<Victim>) {
        let mut vs = self.victims.lock().unwrap_or_else(|p| p.into_inner());
        vs.retain(|w| w.strong_count() > 0);
        vs.push(v);
    }

    /// An interactive request waits, `waiting` of them in all: ask the
    /// victim cheapest to redo to give its slot up, unless enough were
    /// asked already. True when one was.
    /// (Victims asked whose slot has not come back yet count against the
    /// waiters: each waiting interactive request asks for one at most.)
    pub(crate) fn ask_one(&self, waiting: usize) -> bool {
        self.ask(waiting, None)
    }

    /// Ask the stream on replica `key` cheapest to redo for its slot,
    /// unless `owed` asked there owe theirs already: for an interactive
    /// request there with no first token at its moment (it waits inside
    /// the engine for a slot; rule 1's second case, one owed), or for other
    /// instances of a fleet whose interactive requests wait for seats this
    /// one holds past its part there (docs/design/fleet.md, rule 9: as many
    /// as it holds past its part). True when one was asked.
    pub(crate) fn ask_on(&self, key: usize, owed: usize) -> bool {
        self.ask(owed, Some(key))
    }

    fn ask(&self, waiting: usize, on: Option<usize>) -> bool {
        let mut vs = self.victims.lock().unwrap_or_else(|p| p.into_inner());
        vs.retain(|w| w.strong_count() > 0);
        let here = |v: &&std::sync::Arc<Victim>| on.is_none_or(|k| v.replica.load(Ordering::Relaxed) == k);
        let alive: Vec<std::sync::Arc<Victim>> = vs.iter().filter_map(Weak::upgrade).collect();
        if alive.iter().filter(here).filter(|v| v.owing()).count() >= waiting {
            return false;
        }
        let Some(v) = alive.iter().filter(here).filter(|v| v.eligible()).min_by_key(|v| v.redo()) else { return false };
        v.asked.store(true, Ordering::Release);
        v.waker.wake();
        true
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;

    #[test]
    fn the_cheapest_eligible_stream_is_asked_and_one_per_waiter() {
        let p = Preemption::default();
        let long = Arc::new(Victim::new(2000, Some(500), 0));
        let short = Arc::new(Victim::new(100, Some(500), 0));
        let near_end = Arc::new(Victim::new(10, Some(100), 0));
        let again = Arc::new(Victim::new(10, None, MAX_PER_STREAM));
        let fresh = Arc::new(Victim::new(1, Some(500), 0));
        for (v, sent) in [(&long, 50), (&short, 50), (&near_end, 90), (&again, 5), (&fresh, 0)] {
            v.sent(sent);
            p.enlist(Arc::downgrade(v));
        }
        let waker = futures_util::task::noop_waker();
        assert!(p.ask_one(1));
        assert!(short.asked(&waker) && !long.asked(&waker), "the cheapest to redo");
        assert!(!p.ask_one(1), "one waiter, one victim asked");
        assert!(p.ask_one(2));
        assert!(long.asked(&waker));
        assert!(!p.ask_one(3), "near its end, preempted enough, or nothing sent yet: never");
        assert!(!near_end.asked(&waker) && !again.asked(&waker) && !fresh.asked(&waker));
        short.gave_back();
        long.gave_back();
        drop(short);
        assert!(!p.ask_one(1), "no one left to ask");
    }

    #[test]
    fn a_stream_asks_in_its_engine_at_forty_percent_once_its_prediction_is_overdue_or_at_once_when_predicted_late() {
        let start = tokio::time::Instant::now();
        let (target, ms) = (Duration::from_millis(300), Duration::from_millis);
        let at = |due: Option<(u64, u64)>| in_engine_ask_at(start, target, due.map(|(d, own)| (start + ms(d), ms(own)))).map(|a| a - start);
        assert_eq!(at(None), Some(ms(120)), "no prediction: 40 % of the target");
        assert_eq!(at(Some((60, 50))), Some(ms(120)), "a short prompt's first token due early: 40 %");
        assert_eq!(at(Some((160, 60))), Some(ms(200)), "due at 160 ms: asks a quarter after");
        assert_eq!(at(Some((250, 60))), Some(ms(210)), "due at 250 ms: a quarter after is past 70 %: by 70 %");
        assert_eq!(at(Some((400, 130))), Some(ms(0)), "due past the target (prefill ahead): at once");
        assert_eq!(at(Some((400, 310))), None, "... unless its own prefill alone passes the target");
        assert_eq!(at(Some((160, 130))), None, "its own prefill would not fit after a slot given then");
        assert_eq!(at(Some((60, 200))), None, "nor after one given at 40 %");
    }

    #[test]
    fn a_request_waiting_in_an_engine_asks_a_stream_on_its_replica_only() {
        let p = Preemption::default();
        let (here, there) = (Arc::new(Victim::new(500, None, 0)), Arc::new(Victim::new(10, None, 0)));
        for (v, key) in [(&here, 1), (&there, 2)] {
            v.sent(5);
            v.on(key);
            p.enlist(Arc::downgrade(v));
        }
        let waker = futures_util::task::noop_waker();
        assert!(p.ask_on(1, 1));
        assert!(here.asked(&waker) && !there.asked(&waker), "its own replica's, though dearer");
        assert!(!p.ask_on(1, 1), "one owed there already");
        assert!(!p.ask_on(3, 1), "none on that replica");
    }

    #[test]
    fn seats_past_a_fleet_part_are_asked_for_until_that_many_are_owed() {
        let p = Preemption::default();
        let vs: Vec<Arc<Victim>> = (0..3).map(|i| Arc::new(Victim::new(100 + i, None, 0))).collect();
        let other = Arc::new(Victim::new(1, None, 0));
        for (v, key) in vs.iter().map(|v| (v, 1)).chain([(&other, 2)]) {
            v.sent(5);
            v.on(key);
            p.enlist(Arc::downgrade(v));
        }
        let waker = futures_util::task::noop_waker();
        assert!(p.ask_on(1, 2) && p.ask_on(1, 2), "two seats past the part: two streams");
        assert!(!p.ask_on(1, 2), "two owed already: the next fleet tick asks no third");
        assert_eq!(vs.iter().map(|v| v.asked(&waker)).collect::<Vec<_>>(), [true, true, false], "the cheapest to redo first");
        assert!(!other.asked(&waker), "only on the replica held past the part");
        vs[0].gave_back();
        assert!(p.ask_on(1, 2), "one came back while two seats are still past the part");
    }
}
