//! What one replica's KV cache holds, as its events tell it.
//!
//! The engine names a block by its own hash, seeded at random at each
//! start, so the gateway cannot compute the engine's names for a prompt.
//! It names blocks its own way instead: a chained hash over each block's
//! token ids ([`token_keys`]). A `BlockStored` event carries the tokens of
//! the blocks it stores and the engine's name of their parent, so each
//! stored block gets the gateway's key (its parent's key, its tokens) and
//! the engine's name is kept beside it, for the `BlockRemoved` that will
//! name only that. A prompt, tokenized as the engine does, then has keys
//! the index can look up: the longest run of leading keys held is what the
//! replica will not prefill.

use std::collections::HashMap;

use xxhash_rust::xxh3::xxh3_64_with_seed;

use super::wire::{EngineHash, KvEvent, Place};

/// The chain's seed: the parent of a prompt's first block.
const TOKEN_CHAIN_SEED: u64 = 0x736c_6f67_6174_6533;

/// The gateway's keys of the full blocks of `tokens`, `block_size` tokens
/// each, at most `max_blocks`: each a hash of its tokens seeded with its
/// parent's key, so a key stands for the whole prefix up to its block.
pub(crate) fn token_keys(tokens: &[u32], block_size: usize, max_blocks: usize) -> Vec<u64> {
    let mut keys = Vec::with_capacity((tokens.len() / block_size.max(1)).min(max_blocks));
    let mut parent = TOKEN_CHAIN_SEED;
    let mut bytes = Vec::with_capacity(block_size * 4);
    for block in tokens.chunks_exact(block_size.max(1)).take(max_blocks) {
        parent = key_of(parent, block, &mut bytes);
        keys.push(parent);
    }
    keys
}

fn key_of(parent: u64, block: &[u32], bytes: &mut Vec<u8>) -> u64 {
    bytes.clear();
    for t in block {
        bytes.extend_from_slice(&t.to_le_bytes());
    }
    xxh3_64_with_seed(bytes, parent)
}

/// What the index could not use, counted since it started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Skipped {
    /// Stored blocks whose parent the index does not know (an event it
    /// missed, or a parent keyed beyond tokens): their keys cannot be made.
    pub(crate) unchained: u64,
    /// Stored blocks keyed by more than tokens (LoRA, multimodal, salt).
    pub(crate) beyond_tokens: u64,
    /// Times the index was full and started again (see [`Held::new`]).
    pub(crate) restarts: u64,
}

/// One replica's cached blocks.
#[derive(Debug)]
pub(crate) struct Held {
    /// The engine's name of each block where it is → the gateway's key.
    by_engine: HashMap<(EngineHash, Place), u64>,
    /// The gateway's keys held, and in how many places.
    keys: HashMap<u64, u32>,
    /// Tokens per block, from the events (0 until the first store).
    block_size: usize,
    bound: usize,
    pub(crate) skipped: Skipped,
}

impl Held {
    /// An index of at most `bound` blocks. A replica holds no more blocks
    /// than its KV cache has, so an index past its bound has missed
    /// removals: it starts again from empty rather than keep names the
    /// replica dropped.
    pub(crate) fn new(bound: usize) -> Held {
        Held { by_engine: HashMap::new(), keys: HashMap::new(), block_size: 0, bound: bound.max(1), skipped: Skipped::default() }
    }

    /// Tokens per block (0 until the replica has stored one).
    pub(crate) fn block_size(&self) -> usize {
        self.block_size
    }

    /// Blocks held (counted once per place).
    pub(crate) fn len(&self) -> usize {
        self.by_engine.len()
    }

    /// How many of `keys`' leading blocks the replica holds.
    pub(crate) fn run(&self, keys: &[u64]) -> usize {
        keys.iter().take_while(|k| self.keys.contains_key(k)).count()
    }

    /// Drop everything (the replica cleared its cache, or the events were
    /// lost and what is held is no longer known).
    pub(crate) fn clear(&mut self) {
        self.by_engine.clear();
        self.keys.clear();
    }

    pub(crate) fn apply(&mut self, e: &KvEvent) {
        match e {
            KvEvent::Stored { hashes, parent, tokens, block_size, keyed_beyond_tokens, place } => {
                if *keyed_beyond_tokens {
                    self.skipped.beyond_tokens += hashes.len() as u64;
                    return;
                }
                self.store(hashes, *parent, tokens, *block_size, *place);
            }
            KvEvent::Removed { hashes, place } => {
                for h in hashes {
                    if let Some(k) = self.by_engine.remove(&(*h, *place)) {
                        self.unref(k);
                    }
                }
            }
            KvEvent::Cleared => self.clear(),
        }
    }

    fn store(&mut self, hashes: &[EngineHash], parent: Option<EngineHash>, tokens: &[u32], block_size: usize, place: Place) {
        let mut key = match parent {
            None => TOKEN_CHAIN_SEED,
            Some(p) => match self.by_engine.get(&(p, place)) {
                Some(k) => *k,
                None => {
                    self.skipped.unchained += hashes.len() as u64;
                    return;
                }
            },
        };
        if block_size != self.block_size {
            // A new block size names every block anew (a restarted engine).
            self.clear();
            self.block_size = block_size;
        }
        if self.by_engine.len() + hashes.len() > self.bound {
            self.clear();
            self.skipped.restarts += 1;
        }
        let mut bytes = Vec::with_capacity(block_size * 4);
        for (h, block) in hashes.iter().zip(tokens.chunks_exact(block_size)) {
            key = key_of(key, block, &mut bytes);
            if let Some(old) = self.by_engine.insert((*h, place), key) {
                self.unref(old);
            }
            *self.keys.entry(key).or_insert(0) += 1;
        }
        // Hashes past the tokens given (a malformed event) are not kept.
        self.skipped.unchained += hashes.len().saturating_sub(tokens.len() / block_size) as u64;
    }

    fn unref(&mut self, k: u64) {
        if let Some(n) = self.keys.get_mut(&k) {
            *n -= 1;
            if *n == 0 {
                self.keys.remove(&k);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stored(hashes: &[u64], parent: Option<u64>, tokens: &[u32]) -> KvEvent {
        KvEvent::Stored {
            hashes: hashes.to_vec(),
            parent,
            tokens: tokens.to_vec(),
            block_size: 2,
            keyed_beyond_tokens: false,
            place: Place::default(),
        }
    }

    #[test]
    fn stored_blocks_are_found_by_the_prompts_tokens_whatever_the_engine_calls_them() {
        let mut h = Held::new(100);
        // The engine stores a prompt's first two blocks, then a third in a later event.
        h.apply(&stored(&[901, 902], None, &[1, 2, 3, 4]));
        h.apply(&stored(&[903], Some(902), &[5, 6]));
        assert_eq!((h.block_size(), h.len()), (2, 3));
        let prompt = token_keys(&[1, 2, 3, 4, 5, 6, 7, 8, 9], 2, 100);
        assert_eq!(prompt.len(), 4, "full blocks only");
        assert_eq!(h.run(&prompt), 3);
        // The same tokens after another first block are another prefix.
        assert_eq!(h.run(&token_keys(&[9, 9, 3, 4], 2, 100)), 0);
        // A removed block ends the run there.
        h.apply(&KvEvent::Removed { hashes: vec![902], place: Place::default() });
        assert_eq!(h.run(&prompt), 1);
        h.apply(&KvEvent::Cleared);
        assert_eq!((h.run(&prompt), h.len()), (0, 0));
    }

    #[test]
    fn blocks_it_cannot_name_are_counted_not_guessed() {
        let mut h = Held::new(100);
        // A parent it never saw (a missed event).
        h.apply(&stored(&[903], Some(902), &[5, 6]));
        // A LoRA block.
        let lora = KvEvent::Stored {
            hashes: vec![1],
            parent: None,
            tokens: vec![1, 2],
            block_size: 2,
            keyed_beyond_tokens: true,
            place: Place::default(),
        };
        h.apply(&lora);
        assert_eq!(h.len(), 0);
        assert_eq!(h.skipped, Skipped { unchained: 1, beyond_tokens: 1, restarts: 0 });
    }

    #[test]
    fn a_block_held_in_two_places_stays_until_both_drop_it() {
        let mut h = Held::new(100);
        let cpu = Place { medium: 7, group: 0 };
        h.apply(&stored(&[901], None, &[1, 2]));
        h.apply(&KvEvent::Stored {
            hashes: vec![901],
            parent: None,
            tokens: vec![1, 2],
            block_size: 2,
            keyed_beyond_tokens: false,
            place: cpu,
        });
        let prompt = token_keys(&[1, 2], 2, 10);
        h.apply(&KvEvent::Removed { hashes: vec![901], place: Place::default() });
        assert_eq!(h.run(&prompt), 1, "still offloaded");
        h.apply(&KvEvent::Removed { hashes: vec![901], place: cpu });
        assert_eq!(h.run(&prompt), 0);
    }

    #[test]
    fn past_its_bound_the_index_starts_again() {
        let mut h = Held::new(3);
        h.apply(&stored(&[1, 2], None, &[1, 1, 2, 2]));
        h.apply(&stored(&[3, 4], None, &[3, 3, 4, 4]));
        assert_eq!((h.len(), h.skipped.restarts), (2, 1));
        assert_eq!(h.run(&token_keys(&[3, 3, 4, 4], 2, 10)), 2);
        assert_eq!(h.run(&token_keys(&[1, 1], 2, 10)), 0);
    }
}
