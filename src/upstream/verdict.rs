//! A replica's health as the gateway judges it, apart from whether it is
//! routed to: its active checks and its traffic say whether it passes; it is
//! routed to while it passes, or while its pool is in panic (too few of its
//! replicas pass: all of them that ever passed are used rather than none). The rules are
//! docs/operations.md's "Health checks".

use std::sync::atomic::{AtomicU32, AtomicU8, Ordering};
use std::sync::Arc;

use arc_swap::ArcSwap;

/// Not checked yet.
const UNKNOWN: u8 = 0;
const FAILING: u8 = 1;
const PASSING: u8 = 2;

/// Connection failures in a row that take a replica out without waiting
/// for its active checks (a refused connect takes it out at once).
pub(crate) const PASSIVE_FAILURES: u32 = 2;

/// The verdict on one replica.
#[derive(Default)]
pub(crate) struct Verdict {
    state: AtomicU8,
    /// It passed a check once: under panic it is routed to (one that never
    /// did, misconfigured or not started, would fail every request).
    served: std::sync::atomic::AtomicBool,
    /// Requests in a row whose connection failed before their response head.
    failures: AtomicU32,
    /// When and why it was last taken out or brought back.
    last_change: ArcSwap<Option<String>>,
}

impl Verdict {
    pub(crate) fn passing(&self) -> bool {
        self.state.load(Ordering::Relaxed) == PASSING
    }

    /// It had a verdict (its first check came, or its traffic failed).
    pub(crate) fn known(&self) -> bool {
        self.state.load(Ordering::Relaxed) != UNKNOWN
    }

    /// It passed a check once.
    pub(crate) fn ever_passed(&self) -> bool {
        self.served.load(Ordering::Relaxed)
    }

    /// Set the verdict; true when it changed.
    pub(crate) fn set(&self, passing: bool) -> bool {
        let to = if passing { PASSING } else { FAILING };
        if passing {
            self.failures.store(0, Ordering::Relaxed);
            self.served.store(true, Ordering::Relaxed);
        }
        self.state.swap(to, Ordering::Relaxed) != to
    }

    /// A request's connection to it failed before its response head; true
    /// when that takes it out (`at_once`: nothing listens there).
    pub(crate) fn failed(&self, at_once: bool) -> bool {
        let n = self.failures.fetch_add(1, Ordering::Relaxed) + 1;
        (at_once || n >= PASSIVE_FAILURES) && self.passing()
    }

    /// A request got its response head: the failures in a row end.
    pub(crate) fn answered(&self) {
        if self.failures.load(Ordering::Relaxed) != 0 {
            self.failures.store(0, Ordering::Relaxed);
        }
    }

    /// Record that it was taken out or brought back, and why.
    pub(crate) fn changed(&self, what: &str, why: &str) {
        let at = humantime::format_rfc3339_seconds(std::time::SystemTime::now());
        let line = if why.is_empty() { format!("{what} at {at}") } else { format!("{what} at {at}: {why}") };
        self.last_change.store(Arc::new(Some(line)));
    }

    /// When and why it was last taken out or brought back.
    pub(crate) fn last_change(&self) -> Option<String> {
        (**self.last_change.load()).clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connection_failures_take_a_passing_replica_out_and_an_answer_resets_them() {
        let v = Verdict::default();
        assert!(!v.known() && !v.failed(true), "an unchecked replica is not taken out by its traffic");
        assert!(v.set(true) && v.passing() && !v.set(true));
        assert!(!v.failed(false), "one reset is not enough");
        v.answered();
        assert!(!v.failed(false), "the count started again after an answer");
        assert!(v.failed(false), "two in a row are");
        assert!(v.failed(true), "a refused connect takes it out at once");
        assert!(v.set(false) && !v.failed(true), "out already");
    }
}
