//! What a fleet's other instances read of a pool's queue, and what it does
//! for them: interactive requests waiting here, seats held past this
//! instance's part given back while theirs wait (docs/design/fleet.md,
//! rule 9), and the news they hear at once (rule 15).

use std::sync::Arc;

use super::PoolAdmission;
use crate::admission::preempt::replica_key;
use crate::config::Tier;
use crate::upstream::Replica;

impl PoolAdmission {
    /// Interactive requests waiting in this instance's queue.
    pub(crate) fn interactive_waiting(&self) -> usize {
        self.waiting.depth(Tier::Interactive)
    }

    /// Resolves at the next news for the other instances: interactive
    /// requests start waiting here or none waits any more, or, while
    /// theirs wait ([`PoolAdmission::set_others_wait`]), a slot is freed.
    pub(crate) fn news(&self) -> tokio::sync::watch::Receiver<u64> {
        self.waiting.news.watch()
    }

    /// The news told so far (wrapping): a reader that saw another count
    /// has news waiting.
    pub(crate) fn news_count(&self) -> u64 {
        self.waiting.news.count()
    }

    /// Whether the other instances have interactive requests waiting for
    /// this pool, as last heard: a slot freed here is then news for them.
    pub(crate) fn set_others_wait(&self, wait: bool) {
        self.waiting.set_others_wait(wait);
    }

    /// The fleet's other instances have interactive requests waiting while
    /// this one holds `over` seats of replica `r` past its part, on a
    /// replica full as last heard: batch streams there are asked for their
    /// slots until `over` owe them. True when one was asked.
    pub(crate) fn preempt_for_peers(&self, r: &Arc<Replica>, over: usize) -> bool {
        over > 0 && self.pool().config.preempts() && self.preemption.ask_on(replica_key(r), over)
    }
}
