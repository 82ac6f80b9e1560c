//! Prefix-aware routing across a fleet: each instance journals where it
//! sent its prompts, and reads its peers' journals into its own index, so
//! every instance's index sees the whole fleet's traffic, not the part a
//! load balancer happened to give it. The rule is
//! docs/design/prefix-routing.md's (rule 6).

use std::sync::Arc;

use super::wire::{OwnedResponse, PoolState, SentPrompt, State};
use crate::admission::PoolAdmission;
use crate::config::Balance;
use crate::upstream::prefix::PrefixIndex;
use crate::upstream::Pool;

/// The most decisions an instance tells a peer per exchange (the newest):
/// a peer that fell further behind misses the older ones.
const SENT_AT_MOST: usize = 256;

/// Journal the prefix-aware pools' decisions and the owners learned (`on`:
/// in a fleet, whose exchange runs every `period`), or stop.
pub(super) fn journal(pools: &[Arc<PoolAdmission>], on: bool, period: std::time::Duration) {
    for a in pools {
        let pool = a.pool();
        pool.prefix.set_journaling(on && pool.config.balance == Balance::PrefixAware);
        // A follow-up may wait for a peer's word of its owner: the next
        // exchanges (a peer reads every period), within reason.
        pool.owners.set_journaling(on, (period * 3).min(std::time::Duration::from_secs(1)));
    }
}

/// `pool`'s stored responses' owners learned here after `since` (none
/// unless asked): peers send those ids' follow-ups to the same replicas
/// (docs/design/responses.md, rule 3).
pub(super) fn owned(pool: &Pool, since: Option<u64>) -> Vec<OwnedResponse> {
    let Some(since) = since else { return Vec::new() };
    let learned = pool.owners.learned_since(since, SENT_AT_MOST * 4);
    learned
        .into_iter()
        .filter_map(|l| {
            let replica = pool.replicas.iter().position(|r| Arc::ptr_eq(r, &l.replica))?;
            Some(OwnedResponse { seq: l.seq, replica, id: l.id.to_string(), tenant: l.tenant.to_string() })
        })
        .collect()
}

/// `pool`'s block size and its decisions numbered after `since` (none
/// unless asked, or where the pool does not route by prefix).
pub(super) fn sent(pool: &Pool, since: Option<u64>) -> (u64, Vec<SentPrompt>) {
    let block = pool.config.prefix.block.0;
    let Some(since) = since.filter(|_| pool.config.balance == Balance::PrefixAware) else { return (block, Vec::new()) };
    let sent = pool.prefix.sent_since(since, SENT_AT_MOST);
    let sent = sent.into_iter().map(|s| SentPrompt { seq: s.seq, replica: s.replica, blocks: s.blocks.to_vec(), session: s.session });
    (block, sent.collect())
}

/// The last number this process gave a decision.
pub(super) fn last_seq() -> u64 {
    PrefixIndex::last_seq()
}

/// Read a peer's decisions (its `state`) into the same pools' indexes,
/// those numbered after `read`, and move `read` past them. A peer whose
/// numbering went back (it restarted) is read again from its start.
pub(super) fn take_in(pools: &[Arc<PoolAdmission>], state: &State, read: &mut u64) {
    if state.sent_seq < *read {
        *read = 0;
        return;
    }
    // Past everything it said, read here or not (another pool, another
    // block size): asked again, it would say the same.
    let last = state.pools.iter().flat_map(|p| p.sent.iter().map(|s| s.seq).chain(p.owned.iter().map(|o| o.seq))).fold(*read, u64::max);
    for theirs in &state.pools {
        let Some(pool) = pools.iter().map(|a| a.pool()).find(|p| p.config.name == theirs.name) else { continue };
        for o in theirs.owned.iter().filter(|o| o.seq > *read) {
            if let Some(r) = theirs.replicas.get(o.replica) {
                pool.heard_owner(&r.url, &o.id, &o.tenant);
            }
        }
        if !reads(&pool, theirs) {
            continue;
        }
        for s in theirs.sent.iter().filter(|s| s.seq > *read) {
            if let Some(r) = theirs.replicas.get(s.replica) {
                pool.heard_sent(&r.url, &s.blocks, s.session);
            }
        }
    }
    *read = last;
}

/// This pool takes `theirs`' decisions: both route by prefix, with blocks of one size.
fn reads(pool: &Pool, theirs: &PoolState) -> bool {
    pool.config.balance == Balance::PrefixAware && theirs.block == pool.config.prefix.block.0
}
