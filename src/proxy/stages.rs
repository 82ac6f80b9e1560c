//! The request path after classification, as a list of stages: route
//! (within the key's limits), the follow-up's owner, admit, prepare the
//! body, send, observe. Each stage's failure is the client's answer
//! ([`fail`]); docs/architecture.md names them.

use std::future::Future;
use std::sync::Arc;

use http::{Request, Response};

use super::body::{self, RequestBody};
use super::keepalive;
use super::observe::StreamTimeouts;
use super::respond::{fail, observe, resumable, Preempting, Settings};
use super::route::{self, generates, Routed, Target};
use super::sending::{lost, send, upload_failed, Attempt};
use super::tracker::Tracker;
use crate::admission::{self, Admitted, Lease};
use crate::classify::Caller;
use crate::config::Endpoint;
use crate::error::{GatewayError, ProxyBody};
use crate::limits;
use crate::reduce::Limits;
use crate::server::bodies::BodyHold;
use crate::server::ClientAddr;
use crate::state::{Route, Snapshot};
use crate::sync::Watchlist;
use crate::telemetry::metrics::ClassLabels;
use crate::upstream::{self, ClientBody, SendBody};

/// A stage's result, or the answer to the client when it failed.
macro_rules! stage {
    ($tracker:ident, $result:expr) => {
        match $result {
            Ok(v) => v,
            Err(e) => return fail($tracker, e),
        }
    };
}

/// What the request path after classification is given.
pub(super) struct Forwarding {
    pub(super) req: Request<ClientBody>,
    /// The connection's peer, for the forwarding headers.
    pub(super) client: Arc<ClientAddr>,
    pub(super) snap: Arc<Snapshot>,
    pub(super) target: Target,
    pub(super) caller: Caller,
    pub(super) tracker: Box<Tracker>,
    /// Where a queued stream's keep-alive is marked (`server.queued_keepalive`).
    pub(super) streams: Option<keepalive::Streams>,
    /// Where the response body is watched.
    pub(super) watchlist: Arc<Watchlist>,
}

/// What every stage reads: the connection, the config, the target, the caller.
struct Ctx<'a> {
    client: &'a Arc<ClientAddr>,
    snap: &'a Snapshot,
    target: &'a Target,
    caller: &'a Caller,
}

/// The request path after classification: route, the key's limits, admit,
/// reduce, send, observe (the response body on the watchlist). Held to 50
/// lines by tests/it/rooms.rs: a new stage is a function here.
///
/// Written as a function returning its future, not an `async fn`: an
/// `async fn` keeps its arguments twice in its state (as given, and as
/// moved into its body), the request's head (224 bytes) among them, copied
/// on the first poll and with every move of the future.
pub(super) fn forward(f: Forwarding) -> impl Future<Output = Response<ProxyBody>> {
    let Forwarding { req, client, snap, target, caller, tracker: mut t, streams, watchlist } = f;
    let (parts, body) = req.into_parts();
    async move {
        let c = Ctx { client: &client, snap: &snap, target: &target, caller: &caller };
        let endpoint = target.endpoint();
        let routed = stage!(t, routed(&mut t, body, &parts, &c, streams).await);
        // Estimated once, when routing's output went to the tracker.
        let prompt = t.prompt_estimate();
        let owner = stage!(t, follow_up(&mut t, &routed, endpoint, &caller).await);
        let admitted = stage!(t, admitted(&mut t, &parts, &routed, &c, prompt, owner.as_ref()).await);
        let Routed { request, route, stream, strip_usage, upload, stored, .. } = routed;
        let (reduced, max_output, body) = stage!(t, prepared(request, route, &c, &admitted.lease, &t, strip_usage));
        let timeouts = StreamTimeouts::of(&route.pool.config, &snap.config.server);
        let mut lease = admitted.lease;
        let payload = upload.as_ref().map_or_else(|| SendBody::from(body.clone()), |u| SendBody::from(u.clone()));
        let on = Attempt { lease: &mut lease, pinned: owner.is_some() };
        // Boxed: the sending stage's state is the largest of this path, and
        // inline it would be held by every request waiting in a queue above.
        let sent = Box::pin(send(&parts, &client, payload, route, on, &t, &snap, stream, &timeouts)).await;
        let resp = stage!(t, sent.map_err(|e| lost(upload_failed(e, upload.as_ref(), &snap), owner.as_ref())));
        let preempt =
            Preempting::of(route, &caller.class, stream, admitted.waited, (prompt, max_output), t.start(), lease.first_token_due());
        let preempts = matches!(preempt, Preempting::Victim(..));
        let resume = stream.then(|| resumable(parts, &client, body, route, endpoint, &snap, &t, preempts)).flatten();
        let passthrough = stored.is_some();
        let settings = Settings { timeouts, strip_usage, waited: admitted.waited, reduced, resume, passthrough, preempt };
        observe(resp, t, lease, endpoint, settings, &watchlist)
    }
}

/// Route the request, its body read against the byte budgets, within its
/// key's concurrency (while the body is read) and then its key's rates and
/// quota; the tracker takes what routing found.
async fn routed<'s>(
    t: &mut Tracker,
    body: ClientBody,
    parts: &http::request::Parts,
    c: &Ctx<'s>,
    streams: Option<keepalive::Streams>,
) -> Result<Routed<'s>, GatewayError> {
    let reading = c.caller.tenant.start_reading().map_err(|(max, state)| {
        t.set_rate(state);
        limits::concurrent_error(max)
    })?;
    let mut hold = body_hold(c.client, &c.snap.config.server);
    let routed = route::route(body, &parts.headers, parts.uri.path(), c.snap, c.target, &c.caller.grant, &mut hold).await?;
    t.routed(&routed, hold);
    if let (true, Some(s)) = (routed.stream, streams) {
        s.mark();
    }
    key_limits(t, c.caller, &routed, c.target.endpoint(), c.snap).await?;
    drop(reading);
    Ok(routed)
}

/// Admit the request: its claim (tenant, class, the prompt its tenant's
/// share is charged at once, its deadline) waits for a slot; a follow-up's
/// slot moves to the replica that holds its state.
async fn admitted(
    t: &mut Tracker,
    parts: &http::request::Parts,
    routed: &Routed<'_>,
    c: &Ctx<'_>,
    prompt: u64,
    owner: Option<&(Arc<upstream::Replica>, String)>,
) -> Result<Admitted, GatewayError> {
    let (caller, snap) = (c.caller, c.snap);
    let short = c.target.endpoint().is_short();
    let mut claim = admission::Claim::of(&caller.tenant, &caller.class.control, prompt, snap.classifier.has_keys(), short);
    claim.deadline = super::headers::deadline(&parts.headers)?.map(|d| t.start() + d);
    let (bytes, key, pool) = (routed.request.len() as u64, routed.key.clone(), &routed.route.admission);
    let mut admitted = admission::admit(&caller.class.control, pool, &caller.tenant.name, routed.stream, bytes, claim, key).await?;
    if let Some((owner, id)) = owner {
        if !admitted.lease.move_to(owner) {
            return Err(GatewayError::StateLost(id.clone()));
        }
    }
    t.admitted(&mut admitted);
    Ok(admitted)
}

/// The body that goes to the replica, reduced to fit under pressure, with
/// the gateway's priority (where the pool asks) and the key's cache salt
/// where the engine reads them (a caller's own priority never goes on);
/// what reduction changed, and the output limit.
fn prepared(
    mut request: RequestBody,
    route: &Route,
    c: &Ctx<'_>,
    lease: &Lease,
    t: &Tracker,
    strip_usage: bool,
) -> Result<(Option<String>, Option<u64>, bytes::Bytes), GatewayError> {
    let endpoint = c.target.endpoint();
    let engine_reads = generates(endpoint) || endpoint == Endpoint::Responses;
    let priority = (route.pool.config.upstream_priority && engine_reads).then(|| lease.upstream_priority(c.caller.class.tier));
    let salt = c.caller.grant.cache_salt.as_deref().filter(|_| engine_reads);
    route::cpu_bound(request.len(), || {
        let reduced = reduce(&mut request, endpoint, c.snap, t)?;
        let served = route.pool.config.served_model.as_deref();
        let max_output = request.head().max_output;
        Ok((reduced, max_output, request.into_bytes(strip_usage, priority, salt, served)?))
    })
}

/// The hold of a request's body bytes against its listener's budget
/// (`max_buffered_body_bytes`) and its connection's (`max_upload_body` +
/// `max_request_body`): docs/access.md, rule 18.
fn body_hold(client: &ClientAddr, server: &crate::config::ServerConfig) -> BodyHold {
    let per_connection = server.max_upload_body.0.saturating_add(server.max_request_body.0);
    BodyHold::new(client.bodies.clone(), client.held.clone(), server.max_buffered_body_bytes.0, per_connection)
}

/// A follow-up to a stored response (the Responses API's
/// `previous_response_id`) must go where its state is: the replica that
/// made it, when the gateway saw it made, with the id (docs/design/responses.md).
/// Another tenant's response is as unknown as one never made (404); one
/// whose replica is gone is lost (410, `state_lost`). A Responses request
/// teaches the gateway the owner of the response it makes.
async fn follow_up(
    t: &mut Tracker,
    routed: &Routed<'_>,
    endpoint: Endpoint,
    caller: &Caller,
) -> Result<Option<(Arc<upstream::Replica>, String)>, GatewayError> {
    if endpoint != Endpoint::Responses {
        return Ok(None);
    }
    if let Some(stored) = &routed.stored {
        return Ok(Some(stored.clone()));
    }
    let owners = &routed.route.pool.owners;
    t.learn_responses(owners.clone(), caller.tenant.name.clone());
    let Some(id) = routed.request.head().previous_response_id.as_deref() else { return Ok(None) };
    match owners.get_soon(id).await {
        // Unknown to the gateway (made before it started, or elsewhere): the replicas decide.
        None => Ok(None),
        Some(o) if *o.tenant != *caller.tenant.name => Err(GatewayError::ResponseNotFound(id.to_string())),
        Some(o) => Ok(Some((o.replica, id.to_string()))),
    }
}

/// The key's own limits (`auth.keys[].limits`): the request's worst case
/// ([`reservation`]) reserved against them, or the 429. The key's quotas
/// go to the response's headers either way.
async fn key_limits(
    t: &mut Tracker,
    caller: &Caller,
    routed: &Routed<'_>,
    endpoint: Endpoint,
    snap: &Snapshot,
) -> Result<(), GatewayError> {
    // A stored response's own routes make nothing: its key's limits count its making.
    if !caller.tenant.has_limits() || routed.stored.is_some() {
        return Ok(());
    }
    let context = routed.model.as_deref().and_then(|m| routed.route.pool.max_model_len(m));
    let tokens = reservation(&routed.request, endpoint, context, snap.config.auth.default_max_tokens);
    match limits::limit(&caller.tenant, tokens).await {
        Ok((permit, state)) => {
            t.set_permit(permit, state);
            Ok(())
        }
        Err(refused) => {
            let (e, state) = *refused;
            t.set_rate(state);
            Err(e)
        }
    }
}

/// The most a request can take from its key's tokens (docs/access.md,
/// rule 9): its prompt (estimated at four bytes a token) and, for an
/// endpoint that generates, its output limit (`max_completion_tokens`,
/// `max_tokens`, or the Responses API's `max_output_tokens`; none, or more
/// than the model's context: the context its replicas state, else
/// `default_max_tokens`) for each answer it asks for (`n`, `best_of`, each
/// prompt of a list). Saturating, and at most 2^53 (exact wherever it is counted).
fn reservation(request: &body::RequestBody, endpoint: Endpoint, context: Option<u64>, default_max_tokens: u64) -> u64 {
    let head = request.head();
    let limit = match endpoint {
        Endpoint::Chat | Endpoint::Completions | Endpoint::Messages => head.max_output,
        Endpoint::Responses => head.max_output_tokens,
        Endpoint::Transcription => None,
        _ => return request.prompt_estimate().min(MAX_RESERVE),
    };
    let each = match (limit, context) {
        (Some(l), Some(c)) => l.min(c),
        (Some(l), None) => l,
        (None, Some(c)) => c,
        (None, None) => default_max_tokens,
    };
    request.prompt_estimate().saturating_add(each.saturating_mul(head.answers)).min(MAX_RESERVE)
}

/// The largest reservation: 2^53, exact as a float (the limit store counts in Lua's numbers).
const MAX_RESERVE: u64 = 1 << 53;

/// Under TTFT pressure (the class's reduction trigger is on), rewrite a
/// generating request to cost less; the header value saying how, if it changed.
fn reduce(request: &mut RequestBody, endpoint: Endpoint, snap: &Snapshot, t: &Tracker) -> Result<Option<String>, GatewayError> {
    let class = t.class();
    if !class.control.reduction.active() || !generates(endpoint) {
        return Ok(None);
    }
    let limits = Limits::from_config(&snap.config.context_reduction);
    let changes = crate::reduce::reduce(request.object()?, endpoint == Endpoint::Chat, &limits);
    if changes.is_empty() {
        return Ok(None);
    }
    t.metrics().context_reduced.get_or_create(&ClassLabels { class: class.name.to_string() }).inc();
    request.mark_changed();
    Ok(Some(changes.header()))
}
