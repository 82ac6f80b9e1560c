//! The payloads are msgspec's own encoding of vLLM's event shapes, written
//! by `scripts/kv_events_fixtures.py` (current vLLM: maps; earlier: arrays).

use super::*;

fn fixture(name: &str) -> Vec<u8> {
    let line = include_str!("fixtures.txt").lines().find_map(|l| l.strip_prefix(name).map(str::trim));
    let hex = line.unwrap_or_else(|| panic!("no fixture {name}"));
    (0..hex.len()).step_by(2).map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("hex")).collect()
}

fn digest(b: u8) -> u64 {
    xxh3_64(&[b; 32])
}

const GPU: Place = Place { medium: 0, group: 0 };

#[test]
fn current_vllm_batches_decode_stored_removed_and_cleared() {
    let batch = decode(&fixture("current")).expect("decodes");
    assert_eq!(batch.ts, 1764000000.25);
    assert_eq!(batch.rank, Some(0));
    assert_eq!(batch.unknown, 1, "the event kind it does not know is skipped");
    let cpu = Place { medium: xxh3_64(b"CPU") | 1, group: 1 };
    let expected = vec![
        KvEvent::Stored {
            hashes: vec![digest(1), digest(2)],
            parent: None,
            tokens: vec![1, 2, 3, 4],
            block_size: 2,
            keyed_beyond_tokens: false,
            place: GPU,
        },
        KvEvent::Stored {
            hashes: vec![digest(3)],
            parent: Some(digest(2)),
            tokens: vec![5, 6],
            block_size: 2,
            keyed_beyond_tokens: false,
            place: Place { medium: 0, group: 1 },
        },
        // A LoRA adapter's block, and one keyed by a multimodal input.
        KvEvent::Stored { hashes: vec![digest(9)], parent: None, tokens: vec![7, 8], block_size: 2, keyed_beyond_tokens: true, place: GPU },
        KvEvent::Stored {
            hashes: vec![digest(10)],
            parent: None,
            tokens: vec![7, 8],
            block_size: 2,
            keyed_beyond_tokens: true,
            place: GPU,
        },
        KvEvent::Removed { hashes: vec![digest(1)], place: GPU },
        KvEvent::Removed { hashes: vec![digest(3)], place: cpu },
        KvEvent::Cleared,
    ];
    assert_eq!(batch.events, expected);
}

#[test]
fn earlier_vllm_batches_as_arrays_with_integer_hashes_decode_too() {
    let batch = decode(&fixture("earlier")).expect("decodes");
    assert_eq!((batch.ts, batch.rank, batch.unknown), (1750000000.5, None, 0));
    let expected = vec![
        KvEvent::Stored {
            hashes: vec![11, -12i64 as u64],
            parent: None,
            tokens: vec![1, 2, 3, 4],
            block_size: 2,
            keyed_beyond_tokens: false,
            place: GPU,
        },
        KvEvent::Stored {
            hashes: vec![13],
            parent: Some(-12i64 as u64),
            tokens: vec![5, 6],
            block_size: 2,
            keyed_beyond_tokens: true,
            place: GPU,
        },
        KvEvent::Removed { hashes: vec![11], place: GPU },
        KvEvent::Cleared,
    ];
    assert_eq!(batch.events, expected);
}

#[test]
fn a_payload_that_is_not_a_batch_is_an_error_not_a_panic() {
    let whole = fixture("current");
    for cut in [0, 1, whole.len() / 2, whole.len() - 1] {
        assert!(decode(&whole[..cut]).is_err(), "cut at {cut}");
    }
    // Well-formed msgpack of the wrong shape: a string, a batch whose
    // events are not a list, an event with no kind, a store with no tokens.
    let enc = |v: Value| {
        let mut out = Vec::new();
        rmpv::encode::write_value(&mut out, &v).expect("encodes");
        out
    };
    let map = |kv: Vec<(&str, Value)>| Value::Map(kv.into_iter().map(|(k, v)| (Value::from(k), v)).collect());
    let batch = |events: Value| map(vec![("ts", Value::F64(1.0)), ("events", events)]);
    let bad = [
        Value::from("hello"),
        batch(Value::from(3)),
        batch(Value::Array(vec![map(vec![("block_hashes", Value::Array(vec![]))])])),
        batch(Value::Array(vec![map(vec![("type", Value::from("BlockStored")), ("block_hashes", Value::Array(vec![Value::from(1)]))])])),
        batch(Value::Array(vec![Value::from(7)])),
    ];
    for v in bad {
        assert!(decode(&enc(v.clone())).is_err(), "{v:?}");
    }
    // The smallest good batch.
    assert_eq!(decode(&enc(batch(Value::Array(vec![])))), Ok(Batch { ts: 1.0, ..Batch::default() }));
}
