//! Prefix-aware routing's memory: which replicas were recently sent which
//! prompt prefixes, so a request goes where the KV cache likely holds its
//! leading blocks. The rule that weighs this against load, and why, is in
//! docs/design/prefix-routing.md.
//!
//! A prompt is cut into blocks of a fixed number of bytes, each named by a
//! chained hash (its parent's hash and its own bytes): a block's name stands
//! for the whole prefix up to its end, as an engine's block hashes do. The
//! index maps a name to the set of replicas sent it, least recently used
//! names evicted first, so its memory is bounded by `index_blocks`.

use std::num::NonZeroUsize;
use std::sync::Mutex;

use lru::LruCache;
use xxhash_rust::xxh3::xxh3_64_with_seed;

use super::kv_events::held::token_keys;

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
    /// The key of a prompt made of `parts` in order (a block may span two),
    /// cut into blocks of `block` bytes, at most `max_blocks` of them.
    pub(crate) fn of(parts: &[&[u8]], block: usize, max_blocks: usize, session: Option<&[u8]>) -> RouteKey {
        let block = block.max(1);
        let bytes: usize = parts.iter().map(|p| p.len()).sum();
        let mut blocks = Vec::with_capacity((bytes / block).min(max_blocks));
        let mut parent = CHAIN_SEED;
        let mut pending: Vec<u8> = Vec::new();
        'parts: for part in parts {
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
            if blocks.len() >= max_blocks {
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
    names: Mutex<LruCache<u64, u64>>,
    capacity: usize,
}

impl PrefixIndex {
    /// An index of at most `capacity` names (blocks and session hints).
    pub(crate) fn new(capacity: usize) -> PrefixIndex {
        let cap = NonZeroUsize::new(capacity.max(1)).unwrap_or(NonZeroUsize::MIN);
        PrefixIndex { names: Mutex::new(LruCache::new(cap)), capacity: cap.get() }
    }

    pub(crate) fn capacity(&self) -> usize {
        self.capacity
    }

    /// Names held now.
    pub(crate) fn len(&self) -> usize {
        self.lock().len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, LruCache<u64, u64>> {
        self.names.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// For each of the pool's `n` replicas, how many of `key`'s leading
    /// blocks it was sent (the longest run from the first).
    pub(crate) fn matched(&self, key: &RouteKey, n: usize) -> Vec<u32> {
        let mut out = vec![0u32; n];
        let n = n.min(INDEXED_REPLICAS);
        let names = self.lock();
        let mut alive: u64 = if n == 64 { u64::MAX } else { (1u64 << n) - 1 };
        let mut depth = 0u32;
        for b in &key.blocks {
            if alive == 0 {
                break;
            }
            let holds = names.peek(b).copied().unwrap_or(0) & alive;
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
        let m = self.lock().peek(&key.session?).copied().filter(|m| *m != 0)?;
        Some(m.trailing_zeros() as usize)
    }

    /// `key` was sent to replica `i`: its blocks are held there now (as
    /// recently used), and its session hint points there.
    pub(crate) fn record(&self, key: &RouteKey, i: usize) {
        if i >= INDEXED_REPLICAS {
            return;
        }
        let bit = 1u64 << i;
        let mut names = self.lock();
        for b in &key.blocks {
            match names.get_mut(b) {
                Some(m) => *m |= bit,
                None => {
                    names.push(*b, bit);
                }
            }
        }
        if let Some(s) = key.session {
            names.put(s, bit);
        }
    }
}

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
    fn each_replica_matches_its_longest_run_of_leading_blocks() {
        let idx = PrefixIndex::new(100);
        idx.record(&key("aaaabbbbcccc"), 0);
        idx.record(&key("aaaabbbbxxxx"), 1);
        idx.record(&key("aaaa"), 2);
        assert_eq!(idx.matched(&key("aaaabbbbccccdddd"), 4), vec![3, 2, 1, 0]);
        assert_eq!(idx.matched(&key("zzzz"), 4), vec![0, 0, 0, 0]);
        // A session hint points where the conversation was last sent.
        let s = |t: &str| RouteKey::of(&[t.as_bytes()], 4, 100, Some(b"conv-1"));
        assert_eq!(idx.session(&s("qqqq")), None);
        idx.record(&s("qqqq"), 3);
        idx.record(&s("qqqqrrrr"), 1);
        assert_eq!(idx.session(&s("aaaabbbbcccc")), Some(1));
        assert_eq!(idx.session(&key("qqqq")), None);
    }

    #[test]
    fn the_least_recently_used_names_go_first_and_memory_is_bounded() {
        let idx = PrefixIndex::new(4);
        idx.record(&key("aaaabbbb"), 0); // 2 names
        idx.record(&key("ccccdddd"), 1); // 4
                                         // Used again: a's names are the most recent now.
        idx.record(&key("aaaabbbb"), 2);
        idx.record(&key("eeee"), 3); // 5 > 4: c's first name goes
        assert_eq!(idx.len(), 4);
        assert_eq!(idx.matched(&key("aaaabbbb"), 4), vec![2, 0, 2, 0]);
        assert_eq!(idx.matched(&key("ccccdddd"), 4), vec![0, 0, 0, 0], "its first block is gone, so is the run");
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
