//! vLLM's KV events, as the simulator publishes them (`--kv-events-port`):
//! a ZMQ PUB socket sending (topic, 8-byte big-endian sequence number,
//! msgpack `KVEventBatch`), and a ROUTER replay socket answering a
//! sequence number with the batches it still holds from there, then -1.
//! The batch is encoded as current vLLM's msgspec structs are: maps, each
//! event's kind in `type`.
//!
//! A block the engine names (its tokens all computed) is `BlockStored`,
//! consecutive blocks of one sequence in one event as vLLM sends them; a
//! named block evicted for memory is `BlockRemoved`. One batch per engine
//! step that changed the cache.

use std::collections::VecDeque;
use std::sync::Arc;

use bytes::Bytes;
use rmpv::Value;
use tokio::sync::mpsc;
use zeromq::{PubSocket, RouterSocket, Socket, SocketRecv, SocketSend, ZmqMessage};

/// Batches kept for replay (vLLM's `buffer_steps` default).
const REPLAY_BUFFER: usize = 10_000;

/// One event of a batch.
#[derive(Debug, Clone, PartialEq)]
pub enum SimEvent {
    Stored { hashes: Vec<u64>, parent: Option<u64>, tokens: Vec<u32> },
    Removed(Vec<u64>),
}

/// The engine's side: events of the current step, sent as one batch.
pub struct Collector {
    pending: Vec<SimEvent>,
    block_size: u32,
    tx: mpsc::UnboundedSender<Vec<SimEvent>>,
}

impl Collector {
    /// Block `i` of a prompt (`hashes`, its token ids `tokens`) was named.
    pub fn stored(&mut self, hashes: &[u64], tokens: &[u32], i: usize) {
        let bs = self.block_size as usize;
        let (Some(&h), Some(block)) = (hashes.get(i), tokens.get(i * bs..(i + 1) * bs)) else { return };
        let parent = i.checked_sub(1).and_then(|p| hashes.get(p)).copied();
        // The next block of the same sequence joins its event, as in vLLM.
        if let Some(SimEvent::Stored { hashes: hs, tokens: ts, .. }) = self.pending.last_mut() {
            if parent.is_some() && hs.last().copied() == parent {
                hs.push(h);
                ts.extend_from_slice(block);
                return;
            }
        }
        self.pending.push(SimEvent::Stored { hashes: vec![h], parent, tokens: block.to_vec() });
    }

    /// Named blocks were evicted.
    pub fn removed(&mut self, hashes: impl Iterator<Item = u64>) {
        let hashes: Vec<u64> = hashes.collect();
        if !hashes.is_empty() {
            self.pending.push(SimEvent::Removed(hashes));
        }
    }

    /// The step ended: send what it did, if anything.
    pub fn flush(&mut self) {
        if !self.pending.is_empty() {
            let _ = self.tx.send(std::mem::take(&mut self.pending));
        }
    }
}

/// The batch as vLLM encodes it.
pub fn encode(events: &[SimEvent], block_size: u32, ts: f64) -> Vec<u8> {
    let s = |x: &str| Value::from(x);
    let ints = |xs: &[u64]| Value::Array(xs.iter().map(|x| Value::from(*x)).collect());
    let events = events
        .iter()
        .map(|e| match e {
            SimEvent::Stored { hashes, parent, tokens } => Value::Map(vec![
                (s("type"), s("BlockStored")),
                (s("block_hashes"), ints(hashes)),
                (s("parent_block_hash"), parent.map_or(Value::Nil, Value::from)),
                (s("token_ids"), Value::Array(tokens.iter().map(|t| Value::from(*t)).collect())),
                (s("block_size"), Value::from(block_size)),
                (s("lora_id"), Value::Nil),
                (s("medium"), s("GPU")),
                (s("lora_name"), Value::Nil),
            ]),
            SimEvent::Removed(hashes) => {
                Value::Map(vec![(s("type"), s("BlockRemoved")), (s("block_hashes"), ints(hashes)), (s("medium"), s("GPU"))])
            }
        })
        .collect();
    let batch = Value::Map(vec![(s("ts"), Value::F64(ts)), (s("events"), Value::Array(events)), (s("data_parallel_rank"), Value::from(0))]);
    let mut out = Vec::new();
    let _ = rmpv::encode::write_value(&mut out, &batch);
    out
}

/// Where a replica publishes, as bound (port 0 resolved).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bound {
    pub events: String,
    pub replay: Option<String>,
}

/// Bind the publisher (`tcp://host:port`) and, if given, the replay
/// socket; the engine's collector sends batches to them.
pub async fn start(events: &str, replay: Option<&str>, block_size: u32) -> std::io::Result<(Collector, Bound)> {
    let io = |e: zeromq::ZmqError| std::io::Error::other(e.to_string());
    let mut publisher = PubSocket::new();
    let events = publisher.bind(events).await.map_err(io)?.to_string();
    let (mut router, replay) = match replay {
        Some(r) => {
            let mut s = RouterSocket::new();
            let at = s.bind(r).await.map_err(io)?.to_string();
            (Some(s), Some(at))
        }
        None => (None, None),
    };
    let (tx, mut rx) = mpsc::unbounded_channel::<Vec<SimEvent>>();
    tokio::spawn(async move {
        let mut seq: u64 = 0;
        let mut kept: VecDeque<(u64, Bytes)> = VecDeque::new();
        loop {
            let asked = async {
                match router.as_mut() {
                    Some(r) => r.recv().await.ok(),
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                batch = rx.recv() => {
                    let Some(batch) = batch else { return };
                    let ts = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0);
                    let payload = Bytes::from(encode(&batch, block_size, ts));
                    let mut m = ZmqMessage::from(Bytes::new());
                    m.push_back(Bytes::copy_from_slice(&seq.to_be_bytes()));
                    m.push_back(payload.clone());
                    let _ = publisher.send(m).await;
                    kept.push_back((seq, payload));
                    if kept.len() > REPLAY_BUFFER {
                        kept.pop_front();
                    }
                    seq += 1;
                }
                Some(ask) = asked => {
                    if let Some(r) = router.as_mut() {
                        replay_to(r, ask, &kept).await;
                    }
                }
            }
        }
    });
    Ok((Collector { pending: Vec::new(), block_size, tx }, Bound { events, replay }))
}

/// Answer one replay request: (identity, empty, first number) gets each
/// kept batch from there, then number -1.
async fn replay_to(router: &mut RouterSocket, ask: ZmqMessage, kept: &VecDeque<(u64, Bytes)>) {
    let frames = ask.into_vec();
    let (Some(id), Some(from)) = (frames.first(), frames.get(2)) else { return };
    let Ok(from) = <[u8; 8]>::try_from(from.as_ref()).map(u64::from_be_bytes) else { return };
    let reply = |seq: &[u8], payload: Bytes| {
        let mut m = ZmqMessage::from(id.clone());
        m.push_back(Bytes::new());
        m.push_back(Bytes::copy_from_slice(seq));
        m.push_back(payload);
        m
    };
    for (seq, payload) in kept.iter().filter(|(s, _)| *s >= from) {
        if router.send(reply(&seq.to_be_bytes(), payload.clone())).await.is_err() {
            return;
        }
    }
    let _ = router.send(reply(&(-1i64).to_be_bytes(), Bytes::new())).await;
}

/// Shared with each request's handler: the model's tokenizer, so the
/// simulator names blocks by the token ids vLLM would compute.
pub type Tokens = Option<Arc<prompt::PromptTokens>>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn consecutive_blocks_of_a_sequence_join_one_event_and_the_batch_is_vllms_map() {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let mut c = Collector { pending: Vec::new(), block_size: 2, tx };
        let hashes = [11, 12, 13];
        let tokens = [1, 2, 3, 4, 5, 6];
        c.stored(&hashes, &tokens, 0);
        c.stored(&hashes, &tokens, 1);
        c.removed([7u64, 8].into_iter());
        c.stored(&hashes, &tokens, 2);
        c.stored(&hashes, &tokens, 3); // past the prompt: nothing
        c.flush();
        let batch = rx.try_recv().expect("one batch");
        assert_eq!(
            batch,
            vec![
                SimEvent::Stored { hashes: vec![11, 12], parent: None, tokens: vec![1, 2, 3, 4] },
                SimEvent::Removed(vec![7, 8]),
                SimEvent::Stored { hashes: vec![13], parent: Some(12), tokens: vec![5, 6] },
            ]
        );
        c.flush();
        assert!(rx.try_recv().is_err(), "an empty step sends nothing");
        let v = rmpv::decode::read_value(&mut &encode(&batch, 2, 1.5)[..]).expect("msgpack");
        let events = v.as_map().and_then(|m| m.iter().find(|(k, _)| k.as_str() == Some("events"))).map(|(_, e)| e.clone());
        let first = events.as_ref().and_then(|e| e.as_array()).and_then(|a| a.first()).and_then(|e| e.as_map()).cloned().expect("an event");
        assert!(first.iter().any(|(k, v)| k.as_str() == Some("type") && v.as_str() == Some("BlockStored")));
    }
}
