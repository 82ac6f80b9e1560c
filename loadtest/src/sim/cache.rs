//! vLLM's automatic prefix cache, as the simulator models it.
//!
//! The KV cache is `kv_blocks` blocks of `block_size` tokens. A block whose
//! tokens are all computed is named by a chained hash (its parent block's
//! hash and its own tokens), so a name stands for the whole prefix up to
//! it. A new sequence takes references on the leading blocks of its prompt
//! already named, in use by another sequence or cached free, and skips
//! their prefill. When a sequence ends, its named blocks stay cached until
//! memory is needed; then the least recently freed go first, as vLLM's
//! free block queue gives them out.

use std::collections::{BTreeMap, HashMap};
use std::hash::{Hash, Hasher};

/// The chained hashes of a prompt's full blocks: `block_bytes` bytes of
/// its text each (the simulator's tokens are four characters), at most
/// `max_blocks` of them.
pub fn block_hashes(text: &[u8], block_bytes: usize, max_blocks: usize) -> Vec<u64> {
    chained(text, block_bytes, max_blocks)
}

/// The chained hashes of the full blocks of `ids` (a prompt's token ids),
/// `block_size` tokens each, at most `max_blocks`.
pub fn token_block_hashes(ids: &[u32], block_size: usize, max_blocks: usize) -> Vec<u64> {
    chained(ids, block_size, max_blocks)
}

/// Each full block of `items` named by a hash of its parent's name and its own items.
fn chained<T: Hash>(items: &[T], block: usize, max_blocks: usize) -> Vec<u64> {
    let mut out = Vec::with_capacity((items.len() / block.max(1)).min(max_blocks));
    let mut parent = 0u64;
    for chunk in items.chunks_exact(block.max(1)).take(max_blocks) {
        let mut h = std::hash::DefaultHasher::new();
        parent.hash(&mut h);
        chunk.hash(&mut h);
        parent = h.finish();
        out.push(parent);
    }
    out
}

#[derive(Debug, Clone, Copy)]
struct Named {
    /// Sequences holding it.
    refs: u32,
    /// When it was last freed (its place in the eviction order while `refs` is 0).
    freed_at: u64,
}

/// The block pool: plain free blocks, and named ones (held or cached free).
#[derive(Debug)]
pub struct PrefixCache {
    total: u32,
    /// Free blocks holding nothing reusable.
    plain_free: u32,
    named: HashMap<u64, Named>,
    /// Named blocks no sequence holds, least recently freed first.
    evictable: BTreeMap<u64, u64>,
    clock: u64,
    /// Named blocks evicted so far.
    pub evicted: u64,
    /// Names evicted since the engine last took them (for its KV events).
    pub evicted_names: Vec<u64>,
}

impl PrefixCache {
    pub fn new(total: u32) -> PrefixCache {
        PrefixCache {
            total,
            plain_free: total,
            named: HashMap::new(),
            evictable: BTreeMap::new(),
            clock: 0,
            evicted: 0,
            evicted_names: Vec::new(),
        }
    }

    /// Blocks a new allocation may take (free, or cached and free).
    pub fn allocatable(&self) -> u32 {
        self.plain_free + self.evictable.len() as u32
    }

    /// Blocks held by sequences.
    pub fn used(&self) -> u32 {
        self.total - self.allocatable()
    }

    /// Named blocks cached free (reusable, evicted first when memory is needed).
    pub fn cached_free(&self) -> usize {
        self.evictable.len()
    }

    /// How many of `hashes`' leading blocks the cache holds.
    pub fn hits(&self, hashes: &[u64]) -> usize {
        hashes.iter().take_while(|h| self.named.contains_key(h)).count()
    }

    /// Could a sequence reusing `hashes` (all hits) take `more` new blocks?
    pub fn fits(&self, hashes: &[u64], more: u32) -> bool {
        let reused_free = hashes.iter().filter(|h| self.named.get(h).is_some_and(|n| n.refs == 0)).count() as u32;
        self.allocatable() - reused_free >= more
    }

    /// Take a reference on each of `hashes` (hits: [`PrefixCache::hits`]).
    pub fn acquire(&mut self, hashes: &[u64]) {
        for h in hashes {
            if let Some(n) = self.named.get_mut(h) {
                if n.refs == 0 {
                    self.evictable.remove(&n.freed_at);
                }
                n.refs += 1;
            }
        }
    }

    /// Take `n` new blocks, evicting the least recently freed cached ones
    /// when no plain block is left; `false` (nothing taken) if they do not fit.
    pub fn allocate(&mut self, n: u32) -> bool {
        if n > self.allocatable() {
            return false;
        }
        let plain = n.min(self.plain_free);
        self.plain_free -= plain;
        for _ in plain..n {
            if let Some((_, h)) = self.evictable.pop_first() {
                self.named.remove(&h);
                self.evicted += 1;
                self.evicted_names.push(h);
            }
        }
        true
    }

    /// A block a sequence holds now has all its tokens computed: name it
    /// `hash`. `false` when that name is taken (another sequence computed
    /// the same prefix at the same time): the block stays the sequence's own.
    pub fn name(&mut self, hash: u64) -> bool {
        if self.named.contains_key(&hash) {
            return false;
        }
        self.named.insert(hash, Named { refs: 1, freed_at: 0 });
        true
    }

    /// A sequence ended or was preempted: its own blocks are free, its named
    /// ones cached, freed last to first (as vLLM does), so a prompt's tail
    /// is evicted before its head, which more prompts share.
    pub fn release(&mut self, own: u32, named: &[u64]) {
        self.plain_free += own;
        for h in named.iter().rev() {
            if let Some(n) = self.named.get_mut(h) {
                n.refs = n.refs.saturating_sub(1);
                if n.refs == 0 {
                    self.clock += 1;
                    n.freed_at = self.clock;
                    self.evictable.insert(self.clock, *h);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prefix_is_reused_while_held_and_after_release_until_memory_is_needed() {
        let mut c = PrefixCache::new(10);
        let a = block_hashes(&[b'a'; 64 * 4], 64, 100);
        assert_eq!(a.len(), 4);
        assert!(c.allocate(4));
        for h in &a {
            assert!(c.name(*h));
        }
        assert_eq!(c.hits(&a), 4);
        // Same first two blocks, then different: a hit of 2.
        let mut text = vec![b'a'; 128];
        text.extend([b'b'; 128]);
        assert_eq!(c.hits(&block_hashes(&text, 64, 100)), 2);
        c.release(0, &a);
        assert_eq!((c.used(), c.cached_free()), (0, 4));
        assert_eq!(c.hits(&a), 4, "cached after release");
        // A sequence reusing 2 of them takes 7 more: the 6 plain blocks, then the
        // least recently freed cached block: the tail, a[3].
        assert!(c.fits(&a[..2], 7));
        assert!(!c.fits(&a[..2], 9));
        c.acquire(&a[..2]);
        assert!(c.allocate(7));
        assert_eq!(c.evicted, 1);
        assert_eq!(c.hits(&a), 3);
        assert!(!c.allocate(2));
    }
}
