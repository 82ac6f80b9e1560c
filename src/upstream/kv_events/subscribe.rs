//! Following one replica's KV events: a ZMQ SUB socket on its publisher,
//! the batches applied to its [`Feed`] in sequence order, and missed
//! batches asked again of its replay socket where it has one.
//!
//! vLLM numbers its batches from 0 at each start. A number past the next
//! expected means batches were missed (or, for the first batch a gateway
//! sees, published before it came): they are asked of the replay socket
//! (a ROUTER: send the first number wanted, 8 bytes big-endian; it answers
//! each batch it still holds as (number, payload), then number -1). What
//! cannot be replayed is counted lost and the index kept: a lost removal
//! shows later as a miss (the replica was thought to hold a block it had
//! dropped), a lost store as blocks that cannot be chained. A number below
//! the next expected means the engine restarted: its cache is empty, and
//! so is the index.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::watch;
use zeromq::{DealerSocket, Socket, SocketRecv, SocketSend, SubSocket, ZmqMessage};

use super::wire::decode;
use super::Feed;

/// Where one replica publishes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Endpoints {
    /// Its PUB socket, `tcp://host:port`.
    pub(crate) events: String,
    /// Its replay ROUTER socket, if it has one.
    pub(crate) replay: Option<String>,
    pub(crate) topic: String,
}

/// How long a replay may take before what it did not bring is counted lost.
const REPLAY_TIMEOUT: Duration = Duration::from_secs(2);
/// Between attempts to reach a publisher that refused or went away.
const RECONNECT: Duration = Duration::from_secs(1);

/// Follow `at` into `feed` until `stop` changes. Never returns an error: a
/// publisher that cannot be reached is tried again, and the replica is
/// routed by estimate meanwhile (its feed is not alive).
pub(crate) async fn follow(at: Endpoints, feed: Arc<Feed>, mut stop: watch::Receiver<bool>) {
    loop {
        tokio::select! {
            e = session(&at, &feed) => {
                tracing::debug!(events = %at.events, error = %e, "KV events: publisher not reachable; trying again");
            }
            _ = stop.changed() => return,
        }
        tokio::select! {
            _ = tokio::time::sleep(RECONNECT) => {}
            _ = stop.changed() => return,
        }
    }
}

/// Subscribe and take messages until the connection fails; why it did.
async fn session(at: &Endpoints, feed: &Feed) -> String {
    let mut sub = SubSocket::new();
    if let Err(e) = sub.connect(&at.events).await {
        return e.to_string();
    }
    if let Err(e) = sub.subscribe(&at.topic).await {
        return e.to_string();
    }
    loop {
        match sub.recv().await {
            Ok(msg) => take(at, feed, msg).await,
            Err(e) => return e.to_string(),
        }
    }
}

/// One message: (topic, sequence number, payload).
async fn take(at: &Endpoints, feed: &Feed, msg: ZmqMessage) {
    let frames = msg.into_vec();
    let (Some(seq), Some(payload)) = (frames.get(1).and_then(seq_of), frames.get(2)) else {
        feed.counts.malformed.fetch_add(1, Ordering::Relaxed);
        return;
    };
    let next = feed.next_seq.load(Ordering::Relaxed);
    if seq < next {
        // Numbering started again: a restarted engine, its cache empty.
        feed.held().clear();
    } else if seq > next {
        // Missed, or (the first batch this gateway sees) published before
        // it came: what the replay socket still holds is asked for.
        let got = match &at.replay {
            Some(replay) => replay_into(replay, next, seq, feed).await,
            None => 0,
        };
        feed.counts.replayed.fetch_add(got, Ordering::Relaxed);
        if next > 0 {
            feed.counts.lost.fetch_add((seq - next).saturating_sub(got), Ordering::Relaxed);
        }
    }
    apply(feed, payload);
    feed.next_seq.store(seq + 1, Ordering::Relaxed);
}

fn apply(feed: &Feed, payload: &[u8]) {
    match decode(payload) {
        Ok(batch) => feed.apply(&batch),
        Err(e) => {
            feed.counts.malformed.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(error = %e, "KV events: a batch could not be read");
        }
    }
}

fn seq_of(b: &Bytes) -> Option<u64> {
    let a: [u8; 8] = b.as_ref().try_into().ok()?;
    Some(u64::from_be_bytes(a))
}

/// Ask `replay` for batches `from..until` and apply them in order; how
/// many came.
async fn replay_into(replay: &str, from: u64, until: u64, feed: &Feed) -> u64 {
    let ask = async {
        let mut dealer = DealerSocket::new();
        dealer.connect(replay).await.map_err(|e| e.to_string())?;
        // A DEALER speaks to a ROUTER as a REQ would: an empty frame first.
        let mut m = ZmqMessage::from(Bytes::new());
        m.push_back(Bytes::copy_from_slice(&from.to_be_bytes()));
        dealer.send(m).await.map_err(|e| e.to_string())?;
        let mut got = 0;
        loop {
            let frames = dealer.recv().await.map_err(|e| e.to_string())?.into_vec();
            // (empty, number, payload); the end is number -1.
            let (Some(seq), Some(payload)) = (frames.get(1).and_then(seq_of), frames.get(2)) else {
                return Err("a replay frame of the wrong shape".to_string());
            };
            if seq == u64::MAX || seq >= until {
                if seq == u64::MAX {
                    return Ok(got);
                }
                continue;
            }
            if seq >= from {
                apply(feed, payload);
                got += 1;
            }
        }
    };
    match tokio::time::timeout(REPLAY_TIMEOUT, ask).await {
        Ok(Ok(got)) => got,
        Ok(Err(e)) => {
            tracing::debug!(%replay, error = %e, "KV events: replay failed");
            0
        }
        Err(_) => 0,
    }
}

#[cfg(test)]
mod tests;
