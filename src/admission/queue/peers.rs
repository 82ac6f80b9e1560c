//! What a fleet's other instances read of a pool's queue, and what it does
//! for them: interactive requests waiting here, and seats held past this
//! instance's part given back while theirs wait (docs/design/fleet.md, rule 9).

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

    /// The fleet's other instances have interactive requests waiting while
    /// this one holds `over` seats of replica `r` past its part, on a
    /// replica full as last heard: batch streams there are asked for their
    /// slots until `over` owe them. True when one was asked.
    pub(crate) fn preempt_for_peers(&self, r: &Arc<Replica>, over: usize) -> bool {
        over > 0 && self.pool().config.preempts() && self.preemption.ask_on(replica_key(r), over)
    }
}
