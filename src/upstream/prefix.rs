//! Prefix-aware routing's memory: which replicas were recently sent which
//! prompt prefixes, so a request goes where the KV cache likely holds its
//! leading blocks. The rule that weighs this against load, and why, is in
//! docs/design/prefix-routing.md.
//!
//! A prompt is cut into blocks of a fixed number of bytes, each named by a
//! chained hash (its parent's hash and its own bytes): a block's name stands
//! for the whole prefix up to its end, as an engine's block hashes do. The
//! index maps a name to the set of replicas sent it, least recently used
//! names evicted first, so its memory is bounded by `index_blocks`. Where a
//! replica says how large its KV cache is, the index also forgets what that
//! replica must have evicted: each replica keeps its own recency order of
//! the names sent there, bounded by its cache, tail blocks before head.
//! In a fleet, each instance journals its own decisions and reads its
//! peers', so every index sees the whole fleet's traffic.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use lru::LruCache;
use xxhash_rust::xxh3::xxh3_64_with_seed;

use super::kv_events::held::token_keys;

/// One value per replica of a pool, on the stack up to 8 replicas: routing
/// builds a few of these for every request, and a pool rarely has more.
pub(crate) type PerReplica<T> = smallvec::SmallVec<[T; 8]>;

/// Replicas the index tells apart: bit `i` of a set is the pool's replica `i`.
pub(crate) const INDEXED_REPLICAS: usize = 64;

/// The chain's seed: the parent of a prompt's first block.
const CHAIN_SEED: u64 = 0x736c_6f67_6174_6531;
/// Session hints are hashed with their own seed, apart from blocks' names.
const SESSION_SEED: u64 = 0x736c_6f67_6174_6532;

/// What the router knows of a request's prompt.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct RouteKey {
    /// Names of the prompt's full blocks, first block first.
    pub(crate) blocks: Vec<u64>,
    /// The prompt's bytes (all of it, hashed or not): the prefill work where nothing is cached.
    pub(crate) bytes: u64,
    /// The client's own cache hint (`prompt_cache_key`, `x-session-id`), hashed.
    pub(crate) session: Option<u64>,
    /// Bytes per block.
    pub(crate) block: u64,
    /// Exact mode: the keys of the prompt's blocks of tokens (see
    /// [`token_keys`]); empty where the prompt was not tokenized.
    pub(crate) token_keys: Vec<u64>,
    /// The prompt's tokens, and tokens per block, where it was tokenized.
    pub(crate) tokens: u64,
    pub(crate) token_block: u64,
}

impl RouteKey {
    /// Keep this key apart from every other tenant's: its blocks and its
    /// session named under the tenant's `salt`, so equal prompts of two
    /// tenants never look alike to the prefix index (`cache_isolation`).
    pub(crate) fn salted(mut self, salt: &[u8]) -> RouteKey {
        let seed = xxh3_64_with_seed(salt, CHAIN_SEED);
        for b in &mut self.blocks {
            *b = xxh3_64_with_seed(&b.to_le_bytes(), seed);
        }
        for k in &mut self.token_keys {
            *k = xxh3_64_with_seed(&k.to_le_bytes(), seed);
        }
        self.session = self.session.map(|s| xxh3_64_with_seed(&s.to_le_bytes(), seed));
        self
    }

    /// The key of a prompt made of `parts` in order (a block may span two),
    /// cut into blocks of `block` bytes, at most `max_blocks` of them.
    pub(crate) fn of(parts: &[&[u8]], block: usize, max_blocks: usize, session: Option<&[u8]>) -> RouteKey {
        let block = block.max(1);
        let bytes: usize = parts.iter().map(|p| p.len()).sum();
        let mut blocks = Vec::with_capacity((bytes / block).min(max_blocks));
        let mut parent = CHAIN_SEED;
        let mut pending: Vec<u8> = Vec::new();
        'parts: for (i, part) in parts.iter().enumerate() {
            let mut p = *part;
            if !pending.is_empty() {
                let take = (block - pending.len()).min(p.len());
                pending.extend_from_slice(&p[..take]);
                p = &p[take..];
                if pending.len() < block {
                    continue;
                }
                parent = xxh3_64_with_seed(&pending, parent);
                blocks.push(parent);
                pending.clear();
            }
            while p.len() >= block {
                if blocks.len() >= max_blocks {
                    break 'parts;
                }
                parent = xxh3_64_with_seed(&p[..block], parent);
                blocks.push(parent);
                p = &p[block..];
            }
            // A tail short of a block is carried into the next part; after
            // the last one it is never a block (and copying it would be an
            // allocation per request for nothing).
            if blocks.len() >= max_blocks || i + 1 == parts.len() {
                break;
            }
            pending.extend_from_slice(p);
        }
        blocks.truncate(max_blocks);
        RouteKey {
            blocks,
            bytes: bytes as u64,
            session: session.map(|s| xxh3_64_with_seed(s, SESSION_SEED)),
            block: block as u64,
            ..RouteKey::default()
        }
    }

    /// The prompt as the engine tokenizes it (`ids`), cut into blocks of
    /// `block` tokens as the replicas' events name them, at most
    /// `max_blocks`.
    pub(crate) fn set_tokens(&mut self, ids: &[u32], block: usize, max_blocks: usize) {
        self.token_keys = token_keys(ids, block, max_blocks);
        self.tokens = ids.len() as u64;
        self.token_block = block as u64;
    }

    /// The prompt bytes that `blocks` leading blocks of tokens stand for
    /// (the cost is counted in bytes; tokens are spread evenly over them).
    pub(crate) fn bytes_of_token_blocks(&self, blocks: usize) -> u64 {
        let tokens = (blocks as u64 * self.token_block).min(self.tokens);
        (tokens as u128 * self.bytes as u128 / self.tokens.max(1) as u128) as u64
    }

    /// The value the fleet's instances agree on for this prompt: its
    /// session hint, else its first block's name; `None` for a prompt
    /// shorter than a block without a hint.
    pub(crate) fn anchor(&self) -> Option<u64> {
        self.session.or_else(|| self.blocks.first().copied())
    }
}

/// The replica the fleet's instances all pick for `anchor` when nothing
/// else tells them apart (rendezvous hashing over the replicas' URLs): the
/// same on every instance, and only the prompts anchored on a replica move
/// when it leaves. `None` when `candidates` is empty.
pub(crate) fn home(anchor: u64, candidates: impl Iterator<Item = (usize, u64)>) -> Option<usize> {
    candidates.max_by_key(|&(_, url)| xxh3_64_with_seed(&url.to_le_bytes(), anchor)).map(|(i, _)| i)
}

/// A pool's index of sent prefixes.
pub(crate) struct PrefixIndex {
    inner: Mutex<Inner>,
    capacity: usize,
    /// In a fleet: this instance's own routing decisions, newest last, for
    /// the other instances to read into their indexes (see [`Sent`]).
    journal: Mutex<VecDeque<Sent>>,
    journaling: AtomicBool,
}

/// The routing decisions a pool's journal keeps, newest last: what its
/// fleet peers have not read by then, they miss.
const JOURNAL: usize = 1024;

/// The journals' numbering, one for all pools of the process: a peer reads
/// what came after the last number it read.
static SEQ: AtomicU64 = AtomicU64::new(0);

/// One routing decision, as the fleet's other instances read it: a prompt
/// of these blocks (and session hint) went to the pool's replica `replica`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Sent {
    pub(crate) seq: u64,
    pub(crate) replica: usize,
    pub(crate) blocks: Arc<[u64]>,
    pub(crate) session: Option<u64>,
}

struct Inner {
    /// Name -> the set of replicas believed to hold it.
    names: LruCache<u64, u64>,
    /// Per replica, where its cache's size is known: the names sent there,
    /// least recently used first, at most as many as its cache holds.
    /// Pushing past the bound takes the replica's bit off the oldest name,
    /// as the engine evicts the least recently freed block.
    held: Vec<Option<LruCache<u64, ()>>>,
}

impl PrefixIndex {
    /// An index of at most `capacity` names (blocks and session hints).
    pub(crate) fn new(capacity: usize) -> PrefixIndex {
        PrefixIndex {
            // Bounded here, not by the crate: `LruCache::new` would size its
            // table for every name up front (2 MB at the default), used or not.
            inner: Mutex::new(Inner { names: LruCache::unbounded(), held: Vec::new() }),
            capacity: capacity.max(1),
            journal: Mutex::new(VecDeque::new()),
            journaling: AtomicBool::new(false),
        }
    }

    /// Keep this instance's decisions for its fleet peers (`on`), or stop
    /// and drop them (alone).
    pub(crate) fn set_journaling(&self, on: bool) {
        if self.journaling.swap(on, Ordering::Relaxed) != on && !on {
            self.journal.lock().unwrap_or_else(|p| p.into_inner()).clear();
        }
    }

    /// Whether this instance journals its decisions: it is one of a fleet.
    pub(crate) fn journaling(&self) -> bool {
        self.journaling.load(Ordering::Relaxed)
    }

    /// The last number any journal of this process gave a decision.
    pub(crate) fn last_seq() -> u64 {
        SEQ.load(Ordering::Relaxed)
    }

    /// The next number of the journals' one numbering (the response
    /// owners' journal numbers its entries from it too).
    pub(crate) fn next_seq() -> u64 {
        SEQ.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// This instance's decisions numbered after `since`, oldest first, at
    /// most `max` of them (the newest).
    pub(crate) fn sent_since(&self, since: u64, max: usize) -> Vec<Sent> {
        let journal = self.journal.lock().unwrap_or_else(|p| p.into_inner());
        let after = journal.partition_point(|s| s.seq <= since);
        let from = after.max(journal.len().saturating_sub(max));
        journal.range(from..).cloned().collect()
    }

    pub(crate) fn capacity(&self) -> usize {
        self.capacity
    }

    /// Names held now.
    pub(crate) fn len(&self) -> usize {
        self.lock().names.len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// For each of the pool's `n` replicas, how many of `key`'s leading
    /// blocks it was sent (the longest run from the first).
    pub(crate) fn matched(&self, key: &RouteKey, n: usize) -> PerReplica<u32> {
        let mut out: PerReplica<u32> = smallvec::smallvec![0u32; n];
        let n = n.min(INDEXED_REPLICAS);
        let inner = self.lock();
        let mut alive: u64 = if n == 64 { u64::MAX } else { (1u64 << n) - 1 };
        let mut depth = 0u32;
        for b in &key.blocks {
            if alive == 0 {
                break;
            }
            let holds = inner.names.peek(b).copied().unwrap_or(0) & alive;
            // Those alive that do not hold this block stop here.
            set(&mut out, alive & !holds, depth);
            alive = holds;
            depth += 1;
        }
        set(&mut out, alive, depth);
        out
    }

    /// The replica `key`'s session hint was last sent to, if the index still has it.
    pub(crate) fn session(&self, key: &RouteKey) -> Option<usize> {
        let m = self.lock().names.peek(&key.session?).copied().filter(|m| *m != 0)?;
        Some(m.trailing_zeros() as usize)
    }

    /// `key` was sent to replica `i`: its blocks are held there now (as
    /// recently used), and its session hint points there. `cache_blocks`:
    /// how many of the index's blocks replica `i`'s KV cache holds, where
    /// it says (see [`cache_blocks`]); the names it must have evicted to
    /// take these are no longer counted there. In a fleet, the decision is
    /// journaled for the other instances.
    pub(crate) fn record(&self, key: &RouteKey, i: usize, cache_blocks: Option<usize>) {
        self.apply(&key.blocks, key.session, i, cache_blocks);
        if i < INDEXED_REPLICAS && self.journaling() {
            let sent = Sent {
                seq: SEQ.fetch_add(1, Ordering::Relaxed) + 1,
                replica: i,
                blocks: key.blocks.as_slice().into(),
                session: key.session,
            };
            let mut journal = self.journal.lock().unwrap_or_else(|p| p.into_inner());
            if journal.len() >= JOURNAL {
                journal.pop_front();
            }
            journal.push_back(sent);
        }
    }

    /// A fleet peer sent a prompt of `blocks` (and `session` hint) to
    /// replica `i`: recorded as this instance's own decisions are, but not
    /// journaled again.
    pub(crate) fn record_heard(&self, blocks: &[u64], session: Option<u64>, i: usize, cache_blocks: Option<usize>) {
        self.apply(blocks, session, i, cache_blocks);
    }

    fn apply(&self, blocks: &[u64], session: Option<u64>, i: usize, cache_blocks: Option<usize>) {
        if i >= INDEXED_REPLICAS {
            return;
        }
        let bit = 1u64 << i;
        let mut inner = self.lock();
        let Inner { names, held } = &mut *inner;
        for b in blocks {
            match names.get_mut(b) {
                Some(m) => *m |= bit,
                None => {
                    names.push(*b, bit);
                }
            }
        }
        if let Some(s) = session {
            names.put(s, bit);
        }
        while names.len() > self.capacity {
            names.pop_lru();
        }
        let Some(cap) = cache_blocks.filter(|c| *c > 0) else {
            if let Some(h) = held.get_mut(i) {
                *h = None;
            }
            return;
        };
        // Names past the index's own bound are gone from it anyway.
        let cap = cap.min(self.capacity);
        if held.len() <= i {
            held.resize_with(i + 1, || None);
        }
        // Bounded here too: a replica's cache is as large as its scrape says
        // (a table sized for a cache of 160M tokens up front took 71 MB).
        let order = held[i].get_or_insert_with(LruCache::unbounded);
        // The tail first, so the head is the most recent: an engine frees a
        // sequence's blocks tail first and evicts the least recently freed,
        // so a prefix's head outlives its tail.
        for b in blocks.iter().rev() {
            order.push(*b, ());
        }
        while order.len() > cap {
            let Some((old, ())) = order.pop_lru() else { break };
            forget(names, old, bit);
        }
    }
}

/// Replica `bit` no longer holds `name`.
fn forget(names: &mut LruCache<u64, u64>, name: u64, bit: u64) {
    if let Some(m) = names.peek_mut(&name) {
        *m &= !bit;
        if *m == 0 {
            names.pop(&name);
        }
    }
}

/// How many blocks of `block` prompt bytes a KV cache of `tokens` tokens
/// holds, taking a token for `BYTES_PER_TOKEN` bytes of the prompt as the
/// client wrote it.
pub(crate) fn cache_blocks(tokens: u64, block: u64) -> Option<usize> {
    (tokens > 0).then(|| (tokens.saturating_mul(BYTES_PER_TOKEN) / block.max(1)).max(1) as usize)
}

/// Prompt bytes per token, for sizing a replica's cache in the index's
/// blocks: English text runs about four bytes a token in the tokenizers of
/// current open-weight models, and the JSON around messages adds about as
/// many bytes as the chat template adds tokens. A wrong guess only makes
/// the index forget early or late.
const BYTES_PER_TOKEN: u64 = 4;

/// `out[i] = v` for each bit `i` of `set`.
fn set(out: &mut [u32], mut set: u64, v: u32) {
    while set != 0 {
        let i = set.trailing_zeros() as usize;
        if let Some(o) = out.get_mut(i) {
            *o = v;
        }
        set &= set - 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(text: &str) -> RouteKey {
        RouteKey::of(&[text.as_bytes()], 4, 100, None)
    }

    #[test]
    fn a_block_is_named_by_its_whole_prefix_wherever_the_parts_split() {
        let whole = key("aaaabbbbccccdd");
        assert_eq!(whole.blocks.len(), 3);
        assert_eq!(whole.bytes, 14);
        let split = RouteKey::of(&[b"aaaab", b"bb", b"bccccdd"], 4, 100, None);
        assert_eq!(split.blocks, whole.blocks);
        // The same second block after another first block has another name.
        let other = key("xxxxbbbb");
        assert_eq!(other.blocks[1..2].len(), 1);
        assert_ne!(other.blocks[1], whole.blocks[1]);
        // At most max_blocks; the bytes still count the whole prompt.
        let capped = RouteKey::of(&[b"aaaabbbbcccc"], 4, 2, None);
        assert_eq!((capped.blocks.as_slice(), capped.bytes), (&whole.blocks[..2], 12));
    }

    #[test]
    fn a_fleets_journal_keeps_its_own_decisions_after_a_number_not_what_it_heard() {
        let idx = PrefixIndex::new(100);
        idx.record(&key("aaaabbbb"), 0, None);
        assert!(idx.sent_since(0, 10).is_empty(), "alone: nothing journaled");
        idx.set_journaling(true);
        idx.record(&key("aaaabbbb"), 1, None);
        idx.record(&key("ccccdddd"), 2, None);
        idx.record_heard(&key("eeee").blocks, None, 3, None);
        let sent = idx.sent_since(0, 10);
        assert_eq!(sent.iter().map(|s| s.replica).collect::<Vec<_>>(), [1, 2], "a peer's decision is not journaled again");
        assert_eq!(&sent[1].blocks[..], &key("ccccdddd").blocks[..]);
        assert!(sent[0].seq < sent[1].seq && sent[1].seq <= PrefixIndex::last_seq());
        assert_eq!(idx.sent_since(sent[0].seq, 10), sent[1..]);
        assert_eq!(idx.sent_since(0, 1), sent[1..], "at most `max`, the newest");
        // A peer's decision counts here as this instance's own do.
        assert_eq!(idx.matched(&key("eeee"), 4).as_slice(), [0, 0, 0, 1]);
        for _ in 0..JOURNAL + 10 {
            idx.record(&key("ffff"), 0, None);
        }
        assert_eq!(idx.sent_since(0, usize::MAX).len(), JOURNAL, "the journal is bounded");
        idx.set_journaling(false);
        assert!(idx.sent_since(0, 10).is_empty(), "alone again: dropped");
    }

    #[test]
    fn each_replica_matches_its_longest_run_of_leading_blocks() {
        let idx = PrefixIndex::new(100);
        idx.record(&key("aaaabbbbcccc"), 0, None);
        idx.record(&key("aaaabbbbxxxx"), 1, None);
        idx.record(&key("aaaa"), 2, None);
        assert_eq!(idx.matched(&key("aaaabbbbccccdddd"), 4).as_slice(), [3, 2, 1, 0]);
        assert_eq!(idx.matched(&key("zzzz"), 4).as_slice(), [0, 0, 0, 0]);
        // A session hint points where the conversation was last sent.
        let s = |t: &str| RouteKey::of(&[t.as_bytes()], 4, 100, Some(b"conv-1"));
        assert_eq!(idx.session(&s("qqqq")), None);
        idx.record(&s("qqqq"), 3, None);
        idx.record(&s("qqqqrrrr"), 1, None);
        assert_eq!(idx.session(&s("aaaabbbbcccc")), Some(1));
        assert_eq!(idx.session(&key("qqqq")), None);
    }

    #[test]
    fn the_least_recently_used_names_go_first_and_memory_is_bounded() {
        let idx = PrefixIndex::new(4);
        idx.record(&key("aaaabbbb"), 0, None); // 2 names
        idx.record(&key("ccccdddd"), 1, None); // 4
                                               // Used again: a's names are the most recent now.
        idx.record(&key("aaaabbbb"), 2, None);
        idx.record(&key("eeee"), 3, None); // 5 > 4: c's first name goes
        assert_eq!(idx.len(), 4);
        assert_eq!(idx.matched(&key("aaaabbbb"), 4).as_slice(), [2, 0, 2, 0]);
        assert_eq!(idx.matched(&key("ccccdddd"), 4).as_slice(), [0, 0, 0, 0], "its first block is gone, so is the run");
    }

    #[test]
    fn a_replica_with_a_known_cache_forgets_what_it_must_have_evicted_tail_first() {
        let idx = PrefixIndex::new(100);
        // Replica 0's cache holds 4 blocks; replica 1's size is unknown.
        idx.record(&key("aaaabbbb"), 0, Some(4));
        idx.record(&key("aaaabbbb"), 1, None);
        assert_eq!(idx.matched(&key("aaaabbbb"), 2).as_slice(), [2, 2]);
        // Three new blocks on replica 0: the oldest of its 4 go, b's before
        // a's (a prefix's head outlives its tail).
        idx.record(&key("ccccddddeeee"), 0, Some(4));
        assert_eq!(idx.matched(&key("aaaabbbb"), 2).as_slice(), [1, 2], "b is gone from 0, a is kept");
        idx.record(&key("ffff"), 0, Some(4));
        assert_eq!(idx.matched(&key("aaaabbbb"), 2).as_slice(), [0, 2]);
        assert_eq!(idx.matched(&key("ccccddddeeee"), 2).as_slice(), [3, 0]);
        // A name no replica holds any more leaves the index.
        idx.record(&key("gggghhhh"), 0, Some(4));
        idx.record(&key("iiii"), 0, Some(4));
        assert_eq!(idx.matched(&key("ccccddddeeee"), 2).as_slice(), [0, 0]);
        assert_eq!(idx.len(), 2 + 4, "a, b (replica 1) and replica 0's four");
        // Sent again, a known block moves up rather than taking more room.
        idx.record(&key("iiii"), 0, Some(4));
        assert_eq!(idx.matched(&key("gggghhhh"), 2).as_slice(), [2, 0]);
        // A cache that grows keeps what it held.
        idx.record(&key("jjjj"), 0, Some(8));
        assert_eq!(idx.matched(&key("gggghhhh"), 2).as_slice(), [2, 0]);
        assert_eq!(cache_blocks(1024, 256), Some(16));
        assert_eq!(cache_blocks(0, 256), None);
    }

    #[test]
    fn a_cache_said_huge_takes_no_room_up_front_and_one_that_shrinks_forgets_its_oldest() {
        // A scrape may say anything: a table sized for it at once would not fit in memory.
        let idx = PrefixIndex::new(100);
        idx.record(&key("aaaabbbbcccc"), 0, Some(usize::MAX / 2));
        assert_eq!(idx.matched(&key("aaaabbbbcccc"), 1).as_slice(), [3]);
        // Smaller now: the oldest go (the tail before the head), and off the index too.
        idx.record(&key("dddd"), 0, Some(2));
        assert_eq!(idx.matched(&key("aaaabbbbcccc"), 1).as_slice(), [1], "a is kept, b and c are gone");
        assert_eq!(idx.len(), 2, "a and d");
    }

    #[test]
    fn every_instance_picks_the_same_home_and_a_leaving_replica_moves_only_its_own() {
        let urls: Vec<u64> = (0..4u64).map(|i| xxh3_64_with_seed(format!("http://10.0.0.{i}:8000").as_bytes(), 0)).collect();
        let anchors: Vec<u64> = (0..400u64).map(|a| xxh3_64_with_seed(&a.to_le_bytes(), 7)).collect();
        let homes: Vec<usize> = anchors.iter().filter_map(|&a| home(a, urls.iter().copied().enumerate())).collect();
        // Spread over all four.
        for r in 0..4 {
            let n = homes.iter().filter(|&&h| h == r).count();
            assert!((50..=150).contains(&n), "replica {r} is home to {n} of 400");
        }
        // Without replica 2, only its anchors move.
        let without: Vec<usize> =
            anchors.iter().filter_map(|&a| home(a, urls.iter().copied().enumerate().filter(|(i, _)| *i != 2))).collect();
        for (h, w) in homes.iter().zip(&without) {
            assert!(h == w || *h == 2);
        }
    }
}
