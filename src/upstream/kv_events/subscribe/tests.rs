//! A publisher and a replay socket as vLLM opens them (PUB, ROUTER), in
//! the test, sending msgpack batches of vLLM's shape.

use std::time::Duration;

use rmpv::Value;
use zeromq::{PubSocket, RouterSocket};

use super::super::held::token_keys;
use super::*;

/// A batch storing `blocks` (engine hash, parent, tokens) of 2 tokens, as
/// current vLLM encodes it (a map, the kind in `type`).
fn stored(blocks: &[(u64, Option<u64>, [u32; 2])]) -> Vec<u8> {
    let events = blocks
        .iter()
        .map(|(h, parent, tokens)| {
            Value::Map(vec![
                ("type".into(), "BlockStored".into()),
                ("block_hashes".into(), Value::Array(vec![Value::from(*h)])),
                ("parent_block_hash".into(), parent.map_or(Value::Nil, Value::from)),
                ("token_ids".into(), Value::Array(tokens.iter().map(|t| Value::from(*t)).collect())),
                ("block_size".into(), Value::from(2)),
                ("lora_id".into(), Value::Nil),
                ("medium".into(), "GPU".into()),
                ("lora_name".into(), Value::Nil),
            ])
        })
        .collect();
    let batch = Value::Map(vec![("ts".into(), Value::F64(1.0)), ("events".into(), Value::Array(events))]);
    let mut out = Vec::new();
    rmpv::encode::write_value(&mut out, &batch).expect("encodes");
    out
}

fn message(seq: u64, payload: &[u8]) -> ZmqMessage {
    let mut m = ZmqMessage::from(Bytes::new());
    m.push_back(Bytes::copy_from_slice(&seq.to_be_bytes()));
    m.push_back(Bytes::copy_from_slice(payload));
    m
}

/// Wait (up to a generous bound) until `ok` holds.
async fn until(what: &str, mut ok: impl FnMut() -> bool) {
    for _ in 0..1000 {
        if ok() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("timed out waiting for: {what}");
}

#[tokio::test]
async fn batches_are_applied_in_order_and_missed_ones_replayed() {
    let mut publisher = PubSocket::new();
    let events = publisher.bind("tcp://127.0.0.1:0").await.expect("binds").to_string();
    let mut router = RouterSocket::new();
    let replay = router.bind("tcp://127.0.0.1:0").await.expect("binds").to_string();
    let feed = Arc::new(Feed::new(1000));
    let (stop_tx, stop) = watch::channel(false);
    let at = Endpoints { events, replay: Some(replay), topic: String::new() };
    let task = tokio::spawn(follow(at, feed.clone(), stop));

    // A subscriber joins some time after it connects: batch 0 (nothing
    // in it) is sent until it arrives.
    let empty = stored(&[]);
    for _ in 0..1000 {
        publisher.send(message(0, &empty)).await.expect("sends");
        if feed.counts.batches.load(Ordering::Relaxed) > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(feed.alive(), "batch 0 arrived");
    publisher.send(message(1, &stored(&[(101, None, [1, 2])]))).await.expect("sends");
    until("batch 1", || feed.next_seq.load(Ordering::Relaxed) == 2).await;

    // Batches 2 and 3 are missed; 4 arrives, and 2 and 3 are asked of the replay socket.
    let replayer = tokio::spawn(async move {
        let ask = router.recv().await.expect("a replay request").into_vec();
        assert_eq!(ask.len(), 3, "identity, empty, first number wanted");
        assert_eq!(ask[2].as_ref(), 2u64.to_be_bytes());
        for (seq, payload) in [(2u64, stored(&[(102, Some(101), [3, 4])])), (3, stored(&[(103, Some(102), [5, 6])]))] {
            let mut m = ZmqMessage::from(ask[0].clone());
            m.push_back(Bytes::new());
            m.push_back(Bytes::copy_from_slice(&seq.to_be_bytes()));
            m.push_back(Bytes::from(payload));
            router.send(m).await.expect("replays");
        }
        let mut end = ZmqMessage::from(ask[0].clone());
        end.push_back(Bytes::new());
        end.push_back(Bytes::copy_from_slice(&(-1i64).to_be_bytes()));
        end.push_back(Bytes::new());
        router.send(end).await.expect("ends");
    });
    publisher.send(message(4, &stored(&[(104, Some(103), [7, 8])]))).await.expect("sends");
    until("batch 4", || feed.next_seq.load(Ordering::Relaxed) == 5).await;
    replayer.await.expect("replayer");
    assert_eq!(feed.counts.replayed.load(Ordering::Relaxed), 2);
    assert_eq!(feed.counts.lost.load(Ordering::Relaxed), 0);
    // All four blocks chain: the replayed ones came before batch 4.
    assert_eq!(feed.held().run(&token_keys(&[1, 2, 3, 4, 5, 6, 7, 8], 2, 10)), 4);

    // The engine restarts: its numbering begins again, and its cache is empty.
    publisher.send(message(0, &stored(&[(201, None, [9, 9])]))).await.expect("sends");
    until("the restart", || feed.next_seq.load(Ordering::Relaxed) == 1).await;
    assert_eq!(feed.held().run(&token_keys(&[1, 2], 2, 10)), 0);
    assert_eq!(feed.held().run(&token_keys(&[9, 9], 2, 10)), 1);

    stop_tx.send(true).expect("stops");
    tokio::time::timeout(Duration::from_secs(10), task).await.expect("the task ends when told").expect("no panic");
}

#[tokio::test]
async fn without_a_replay_socket_missed_batches_are_counted_lost_and_the_stream_goes_on() {
    let mut publisher = PubSocket::new();
    let events = publisher.bind("tcp://127.0.0.1:0").await.expect("binds").to_string();
    let feed = Arc::new(Feed::new(1000));
    let (_stop_tx, stop) = watch::channel(false);
    let task = tokio::spawn(follow(Endpoints { events, replay: None, topic: String::new() }, feed.clone(), stop));
    let first = stored(&[(101, None, [1, 2])]);
    for _ in 0..1000 {
        publisher.send(message(0, &first)).await.expect("sends");
        if feed.counts.batches.load(Ordering::Relaxed) > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    publisher.send(message(1, b"not msgpack \xc1")).await.expect("sends");
    publisher.send(message(5, &stored(&[(105, None, [3, 4])]))).await.expect("sends");
    until("batch 5", || feed.next_seq.load(Ordering::Relaxed) == 6).await;
    assert_eq!(feed.counts.lost.load(Ordering::Relaxed), 3);
    assert_eq!(feed.counts.malformed.load(Ordering::Relaxed), 1);
    assert_eq!(feed.held().run(&token_keys(&[3, 4], 2, 10)), 1);
    assert_eq!(feed.held().run(&token_keys(&[1, 2], 2, 10)), 1, "kept across the loss");
    task.abort();
}
