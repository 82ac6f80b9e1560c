//! Requests whose replica another proxy reaches: slogate as the endpoint
//! picker behind Envoy (docs/endpoint-picker.md). The request path is the
//! proxy's own (classify, admit, reduce, route, observe); where it would
//! send the request, it hands the pick over ([`Relay::hand_over`]) and
//! takes the replica's answer as Envoy relays it: the response head, then
//! its body's chunks.

use std::sync::{Arc, Mutex};

use bytes::Bytes;
use tokio::sync::{mpsc, oneshot};

use super::conn::UpstreamBody;
use super::Replica;

/// The pick: the replica, and the body to send it (as the request path
/// made it: reduced, with what slogate adds; `None`: as the client sent it).
pub(crate) struct Picked {
    pub(crate) replica: Arc<Replica>,
    pub(crate) body: Option<Bytes>,
}

/// The replica's answer as the other proxy relays it: its head, and its
/// body's chunks (the sender dropped at the body's end).
pub(crate) struct Answer {
    pub(crate) head: http::response::Parts,
    pub(crate) chunks: mpsc::UnboundedReceiver<Bytes>,
}

/// Carried in a relayed request's extensions: where the sending stage
/// hands the pick over and waits for the answer.
#[derive(Clone)]
pub(crate) struct Relay(Arc<Mutex<Ends>>);

struct Ends {
    pick: Option<oneshot::Sender<Picked>>,
    answer: Option<oneshot::Receiver<Answer>>,
    /// The endpoints (`ip:port`) the proxy in front allows, if it names any.
    only: Option<Vec<String>>,
}

/// The other proxy's side of a [`Relay`]: the pick to tell it, and where
/// its answer goes.
pub(crate) struct RelayEnds {
    pub(crate) pick: oneshot::Receiver<Picked>,
    pub(crate) answer: oneshot::Sender<Answer>,
}

impl Relay {
    /// A relay whose pick must be one of `only` (`ip:port`), when given.
    pub(crate) fn new(only: Option<Vec<String>>) -> (Relay, RelayEnds) {
        let (pick_tx, pick) = oneshot::channel();
        let (answer, answer_rx) = oneshot::channel();
        let ends = Ends { pick: Some(pick_tx), answer: Some(answer_rx), only };
        (Relay(Arc::new(Mutex::new(ends))), RelayEnds { pick, answer })
    }

    /// Where the pick must be instead of `picked`, when the proxy in front
    /// allows only some endpoints and `picked` is not among them: the
    /// healthy allowed replica of `replicas` with the fewest requests.
    /// `Err`: none of them is allowed and healthy.
    pub(crate) fn instead_of(&self, picked: &Arc<Replica>, replicas: &[Arc<Replica>]) -> Result<Option<Arc<Replica>>, ()> {
        let ends = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let Some(only) = &ends.only else { return Ok(None) };
        let allowed = |r: &Replica| only.iter().any(|o| *o == endpoint(r));
        if allowed(picked) {
            return Ok(None);
        }
        let best = replicas.iter().filter(|r| r.is_healthy() && allowed(r)).min_by_key(|r| r.inflight());
        best.cloned().map(Some).ok_or(())
    }

    /// Hand the pick over, and wait for the answer's head: the response
    /// whose body is the answer's chunks. An error when the other proxy
    /// went away, or the pick was handed over already (a relayed request
    /// is sent once: the other proxy retries, not slogate).
    pub(crate) async fn hand_over(&self, replica: &Arc<Replica>, body: Option<Bytes>) -> Result<http::Response<UpstreamBody>, String> {
        let (pick, answer) = {
            let mut ends = self.0.lock().unwrap_or_else(|p| p.into_inner());
            (ends.pick.take(), ends.answer.take())
        };
        let (Some(pick), Some(answer)) = (pick, answer) else { return Err("the request was handed over already".into()) };
        pick.send(Picked { replica: replica.clone(), body }).map_err(|_| "the proxy in front went away".to_string())?;
        let Answer { head, chunks } = answer.await.map_err(|_| "the proxy in front sent no response".to_string())?;
        Ok(http::Response::from_parts(head, UpstreamBody::relayed(chunks)))
    }
}

/// A replica's endpoint as the proxy in front names it: `host:port` of its
/// URL (the scheme's port when it gives none).
pub(crate) fn endpoint(replica: &Replica) -> String {
    let uri: Option<http::Uri> = replica.url.parse().ok();
    let Some(authority) = uri.as_ref().and_then(http::Uri::authority) else { return replica.url.clone() };
    let port = authority.port_u16().unwrap_or(if uri.as_ref().and_then(http::Uri::scheme_str) == Some("https") { 443 } else { 80 });
    format!("{}:{port}", authority.host().trim_start_matches('[').trim_end_matches(']'))
}
