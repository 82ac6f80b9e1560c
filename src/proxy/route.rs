//! Routing: which paths the data plane serves, and which pool a request
//! goes to.
//!
//! Only the inference endpoints reach a replica (chat, completions,
//! responses, embeddings, audio, rerank and score, pooling, classify,
//! tokenize): a path is looked up in [`Endpoint::of_path`], routed by the
//! body's `model`. Everything else, an engine's management and debug
//! endpoints included (vLLM's LoRA loading, sleep, cache reset, profiling,
//! `collective_rpc`), is a 404 from slogate that the replica never sees,
//! unless an operator opened that path on a pool for named keys
//! (`pools[].extra_paths`).

use bytes::Bytes;
use http::{header, HeaderMap, HeaderName, HeaderValue, Response};
use http_body_util::BodyExt;

use super::body::{Model, RequestBody};
use crate::classify::Grant;
use crate::config::{Balance, Endpoint, PoolConfig};
use crate::error::{full, GatewayError, ProxyBody};
use crate::server::bodies::BodyHold;
use crate::state::{Route, Snapshot};
use crate::upstream::kv_events::Exact;
use crate::upstream::prefix::RouteKey;
use crate::upstream::ClientBody;
use crate::upstream::Upload;
use std::sync::Arc;

/// What a data-plane request asks for.
#[derive(Clone)]
pub(super) enum Target {
    /// An inference endpoint, routed by the body's `model`.
    Inference(Endpoint),
    /// A path opened on these pools (positions in the snapshot) for some keys.
    Opened(Vec<usize>),
    /// A stored response's own route (retrieve, delete, cancel, its input
    /// items): to the replica that holds it, once its owner is found.
    Stored(String),
    /// The same, its owner found: the pool (a position) and the replica.
    Owned { pool: usize, owner: Arc<crate::upstream::Replica>, id: String },
}

impl Target {
    /// The target of a POST to `path`; `None`: slogate serves no such path.
    pub(super) fn of(snap: &Snapshot, path: &str) -> Option<Target> {
        if let Some(e) = Endpoint::of_path(path) {
            return Some(Target::Inference(e));
        }
        let pools: Vec<usize> = snap
            .pools
            .iter()
            .enumerate()
            .filter(|(_, r)| r.pool.config.extra_paths.iter().any(|x| x.path == path))
            .map(|(i, _)| i)
            .collect();
        (!pools.is_empty()).then_some(Target::Opened(pools))
    }

    /// The target of `method` on `path` under `/v1/responses/`: a stored
    /// response's id routes (`GET` and `DELETE` `{id}`, `POST {id}/cancel`,
    /// `GET {id}/input_items`); `None`: no such route.
    pub(super) fn stored(method: &http::Method, path: &str) -> Option<Target> {
        let rest = path.strip_prefix("/v1/responses/")?;
        let (id, what) = rest.split_once('/').unwrap_or((rest, ""));
        let ok = matches!(
            (method, what),
            (&http::Method::GET | &http::Method::DELETE, "") | (&http::Method::POST, "cancel") | (&http::Method::GET, "input_items")
        );
        (ok && !id.is_empty()).then(|| Target::Stored(id.to_string()))
    }

    pub(super) fn endpoint(&self) -> Endpoint {
        match self {
            Target::Inference(e) => *e,
            Target::Opened(_) => Endpoint::Other,
            Target::Stored(_) | Target::Owned { .. } => Endpoint::Responses,
        }
    }

    /// The caller may call this: its key's endpoint kinds, and for an opened
    /// path its key among those named there (on at least one pool, which
    /// narrows the target to those pools).
    pub(super) fn permit(self, snap: &Snapshot, path: &str, grant: &Grant) -> Result<Target, GatewayError> {
        grant.endpoint(self.endpoint())?;
        if let Target::Stored(id) = self {
            // Its owner, for the tenant that made it; to any other, unknown.
            let found = snap.pools.iter().enumerate().find_map(|(i, r)| r.pool.owners.get(&id).map(|o| (i, o)));
            return match found {
                Some((pool, o)) if *o.tenant == *grant.key => Ok(Target::Owned { pool, owner: o.replica, id }),
                _ => Err(GatewayError::ResponseNotFound(id)),
            };
        }
        let Target::Opened(pools) = self else { return Ok(self) };
        let mine: Vec<usize> = pools
            .into_iter()
            .filter(|&i| snap.pools[i].pool.config.extra_paths.iter().any(|x| x.path == path && x.keys.iter().any(|k| **k == *grant.key)))
            .collect();
        if mine.is_empty() {
            return Err(GatewayError::PathNotAllowed(path.to_string()));
        }
        Ok(Target::Opened(mine))
    }
}

/// Does `endpoint` generate text token by token (may stream, may be
/// reduced, takes a priority)?
pub(super) fn generates(endpoint: Endpoint) -> bool {
    matches!(endpoint, Endpoint::Chat | Endpoint::Completions)
}

/// May `endpoint` answer with a stream of events when asked (`stream:
/// true`)? Chat and completions, and the Responses API and transcription,
/// whose streams carry their own usage (slogate asks nothing more of them).
pub(super) fn may_stream(endpoint: Endpoint) -> bool {
    generates(endpoint) || matches!(endpoint, Endpoint::Responses | Endpoint::Messages | Endpoint::Transcription)
}

/// What routing found: the parsed body, its model and the pool serving it.
pub(super) struct Routed<'a> {
    pub(super) request: RequestBody,
    /// The model, when the body names one (an opened path may not).
    pub(super) model: Option<String>,
    pub(super) route: &'a Route,
    pub(super) stream: bool,
    /// The client streams without asking for usage: slogate asks the
    /// replica for it and cuts it back out.
    pub(super) strip_usage: bool,
    /// Its prompt, for prefix-aware routing.
    pub(super) key: Option<Arc<RouteKey>>,
    /// A multipart form, sent on as it arrives or kept in the frames it came
    /// in (`request` then holds none of it).
    pub(super) upload: Option<Upload>,
    /// A stored response's own route: the replica that holds it, and its id.
    pub(super) stored: Option<(Arc<crate::upstream::Replica>, String)>,
}

impl Routed<'_> {
    /// The request body's size: an upload's declared length.
    pub(super) fn bytes_in(&self) -> u64 {
        self.upload.as_ref().map_or(self.request.len() as u64, Upload::len)
    }
}

/// The prompt's key for prefix-aware routing, on a pool that routes so:
/// for the endpoints whose prompts an engine caches (chat, completions,
/// the Responses API).
fn prefix_key(request: &RequestBody, headers: &HeaderMap, endpoint: Endpoint, pool: &PoolConfig) -> Option<RouteKey> {
    if pool.balance != Balance::PrefixAware || !(generates(endpoint) || matches!(endpoint, Endpoint::Responses | Endpoint::Messages)) {
        return None;
    }
    let user_id = (endpoint == Endpoint::Messages && !headers.contains_key(X_SESSION_ID)).then(|| request.metadata_user_id()).flatten();
    let session = headers.get(X_SESSION_ID).map(HeaderValue::as_bytes).or(user_id.as_deref());
    request.route_key(pool.prefix.block.0 as usize, pool.prefix.max_blocks as usize, session)
}

/// Exact mode: the prompt's tokens as the engine will compute them (chat
/// messages through the model's template, a completion's prompt as it is),
/// named in the replicas' block size. Tokenizing a long prompt takes a
/// millisecond or more, so it runs on the blocking pool, never on a worker
/// carrying streams. A prompt that cannot be tokenized (no template, a
/// prompt of several texts, no replica has said its block size yet, no
/// replica's events alive) keeps its estimated key only.
async fn with_tokens(mut key: RouteKey, request: &RequestBody, endpoint: Endpoint, exact: &Exact, pool: &PoolConfig) -> RouteKey {
    let block = exact.block_size();
    if !exact.feeds.iter().any(|f| f.alive()) {
        return key;
    }
    let member = match endpoint {
        Endpoint::Chat => "messages",
        Endpoint::Completions => "prompt",
        _ => return key,
    };
    let Some(prompt) = request.prompt_member(member).filter(|_| block > 0) else { return key };
    let tokens = exact.tokens.clone();
    let chat = endpoint == Endpoint::Chat;
    let ids = tokio::task::spawn_blocking(move || if chat { tokens.of_messages(&prompt) } else { tokens.of_prompt(&prompt) }).await;
    if let Ok(Some(ids)) = ids {
        key.set_tokens(&ids, block, pool.prefix.max_blocks as usize);
    }
    key
}

/// A client's session id: its requests go where its conversation's cache is.
/// (A name, not a `&str`: looked up with a string, it is parsed again at
/// every request.)
const X_SESSION_ID: HeaderName = HeaderName::from_static("x-session-id");

/// Run `f`, CPU work on a request body of `len` bytes that borrows the
/// request (hashing its prompt, rewriting it). A large body takes
/// milliseconds; a worker busy with it would hold up every stream whose
/// next token waits on that worker, so for those the worker's other tasks
/// move to another thread first ([`tokio::task::block_in_place`]). Small
/// bodies, and a current-thread runtime (tests), run inline. Reading the
/// body the first time, the largest of this work, runs aside
/// ([`super::aside`]).
pub(super) fn cpu_bound<R>(len: usize, f: impl FnOnce() -> R) -> R {
    // The size first: most bodies are small and need no runtime lookup.
    if len >= super::aside::LARGE_BODY && super::aside::multi_thread() {
        tokio::task::block_in_place(f)
    } else {
        f()
    }
}

/// In a fleet, wait (a while) for a peer to tell of stored response `id`'s
/// owner, when no pool knows it yet (docs/design/responses.md, rule 3).
pub(super) async fn heard_of(snap: &Snapshot, id: &str) {
    if snap.pools.iter().any(|r| r.pool.owners.get(id).is_some()) {
        return;
    }
    let waits = snap.pools.iter().map(|r| Box::pin(r.pool.owners.get_soon(id)));
    let mut waits: Vec<_> = waits.collect();
    while !waits.is_empty() {
        let (found, _, rest) = futures_util::future::select_all(waits).await;
        if found.is_some() {
            return;
        }
        waits = rest;
    }
}

/// Read the body (only as far as routing needs), check the caller may use
/// its model, and find the pool.
#[allow(clippy::too_many_arguments)]
pub(super) async fn route<'a>(
    body: ClientBody,
    headers: &HeaderMap,
    path: &str,
    snap: &'a Snapshot,
    target: &Target,
    grant: &Grant,
    hold: &mut BodyHold,
) -> Result<Routed<'a>, GatewayError> {
    if let Target::Owned { pool, owner, id } = target {
        // Its body (a cancel's) is empty: nothing to read or route by.
        let (request, route) = (RequestBody::empty(), &snap.pools[*pool]);
        let stored = Some((owner.clone(), id.clone()));
        return Ok(Routed { request, model: None, route, stream: false, strip_usage: false, key: None, upload: None, stored });
    }
    let server = &snap.config.server;
    let form = super::form::boundary(content_type(headers)?).transpose()?;
    let deadline = tokio::time::Instant::now() + server.body_read_timeout.get();
    let timed_out = |_| GatewayError::BodyTimeout(server.body_read_timeout);
    let (request, upload) = match form {
        Some(boundary) => {
            let read = read_form(body, headers, &boundary, server.max_upload_body.0, server.body_read_timeout.get(), hold);
            // Boxed: a form's reading is the largest state of this path, and
            // inline every request would carry (and move) its room.
            Box::pin(tokio::time::timeout_at(deadline, read)).await.map_err(timed_out)??
        }
        None => {
            let read = read_body(body, headers, server.max_request_body.0, hold);
            let bytes = tokio::time::timeout_at(deadline, read).await.map_err(timed_out)??;
            match target {
                Target::Opened(_) if bytes.iter().all(u8::is_ascii_whitespace) => (RequestBody::empty(), None),
                _ => (super::aside::run(bytes.len(), move || RequestBody::parse(bytes)).await??, None),
            }
        }
    };
    let head = request.head();
    let model = match &head.model {
        Model::Name(m) => Some(m.clone()),
        Model::NotString => return Err(GatewayError::InvalidRequest { message: "`model` must be a string".into(), param: Some("model") }),
        Model::Missing => None,
    };
    if let Some(m) = &model {
        grant.model(m)?;
    }
    let route = pool_of(snap, target, model.as_deref(), path)?;
    let stream = may_stream(target.endpoint()) && head.stream;
    let strip_usage = stream && generates(target.endpoint()) && !head.include_usage;
    let key = cpu_bound(request.len(), || prefix_key(&request, headers, target.endpoint(), &route.pool.config));
    let key = match (key, &route.pool.exact) {
        (Some(k), Some(exact)) => Some(Box::pin(with_tokens(k, &request, target.endpoint(), exact, &route.pool.config)).await),
        (k, _) => k,
    };
    // An isolated key's prompts are its own in the prefix index too.
    let key = match &grant.cache_salt {
        Some(salt) => key.map(|k| Arc::new(k.salted(salt.as_bytes()))),
        None => key.map(Arc::new),
    };
    Ok(Routed { request, model, route, stream, strip_usage, key, upload, stored: None })
}

/// The pool a request goes to: its model's (an inference endpoint), or
/// the one that opened its path (an opened path without a model).
fn pool_of<'a>(snap: &'a Snapshot, target: &Target, model: Option<&str>, path: &str) -> Result<&'a Route, GatewayError> {
    Ok(match (target, model) {
        (Target::Inference(_), Some(m)) => snap.pool_for(m).ok_or_else(|| GatewayError::ModelNotFound(m.to_string()))?,
        (Target::Inference(_), None) => {
            return Err(GatewayError::InvalidRequest { message: "`model` is required".into(), param: Some("model") })
        }
        (Target::Opened(pools), Some(m)) => {
            let r = snap.pool_for(m).ok_or_else(|| GatewayError::ModelNotFound(m.to_string()))?;
            if !pools.iter().any(|&i| std::ptr::eq(&snap.pools[i], r)) {
                return Err(GatewayError::PathNotAllowed(format!("{path} on the pool of model `{m}`")));
            }
            r
        }
        (Target::Stored(_) | Target::Owned { .. }, _) => {
            return Err(GatewayError::Internal("a stored response's route without its owner".into()))
        }
        (Target::Opened(pools), None) => match pools.as_slice() {
            [one] => &snap.pools[*one],
            _ => {
                return Err(GatewayError::InvalidRequest {
                    message: format!("`model` is required: {path} is open on more than one pool"),
                    param: Some("model"),
                })
            }
        },
    })
}

/// The method a data-plane path takes, for a request that used another
/// (405, as vLLM answers, rather than 404).
pub(super) fn route_method(path: &str) -> Option<&'static str> {
    match path {
        "/v1/models" | "/health" => Some("GET"),
        p if Endpoint::of_path(p).is_some() => Some("POST"),
        _ => None,
    }
}

/// `GET /health` on the data port (load balancers and load generators such
/// as guidellm probe it, as they would vLLM): 200 while every pool has a
/// healthy replica, 503 with Retry-After otherwise. No key is needed.
pub(super) fn health(snap: &Snapshot) -> Response<ProxyBody> {
    if snap.ready() {
        let mut resp = Response::new(full(Vec::new()));
        resp.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        return resp;
    }
    let down: Vec<&str> = snap.pools.iter().filter(|r| r.pool.healthy_count() == 0).map(|r| r.pool.config.name.as_str()).collect();
    let mut resp = crate::error::error_response(
        http::StatusCode::SERVICE_UNAVAILABLE,
        &format!("no healthy replica in pool(s) {}", down.join(", ")),
        "service_unavailable",
        None,
        "no_healthy_replica",
    );
    resp.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    resp
}

/// `GET /v1/models`: the models of every pool that the caller's key may use.
pub(super) fn models(snap: &Snapshot, grant: &Grant) -> Response<ProxyBody> {
    let mut data = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for r in &snap.pools {
        for m in r.pool.model_objects() {
            if let Some(id) = m.get("id").and_then(|v| v.as_str()) {
                if grant.allows_model(id) && seen.insert(id.to_string()) {
                    data.push(m);
                }
            }
        }
    }
    let body = serde_json::json!({"object": "list", "data": data});
    let mut resp = Response::new(full(serde_json::to_vec(&body).unwrap_or_default()));
    resp.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    resp
}

/// A multipart form (its `boundary`), read as far as routing needs: with
/// its length declared, the rest is sent on as it arrives, read on by the
/// same reader (its last bytes wait for the reader's verdict), due
/// `within` of the replica's first read of it; without, or when its
/// `model` comes only after its file, it is read whole (within `limit`),
/// read to its end, and kept in the frames it came in
/// (docs/design/reduction.md, rule 9; docs/access.md, rule 1).
async fn read_form(
    body: ClientBody,
    headers: &HeaderMap,
    boundary: &[u8],
    limit: u64,
    within: std::time::Duration,
    hold: &mut BodyHold,
) -> Result<(RequestBody, Option<Upload>), GatewayError> {
    let declared = declared_length(headers);
    if declared.is_some_and(|len| len > limit) {
        return Err(GatewayError::PayloadTooLarge { limit });
    }
    let ahead = super::form::PARSE_AHEAD;
    let form = super::form::read_head(body, boundary, limit, ahead, hold).await?;
    let head = form.head();
    let super::form::FormRead { reader, read, rest } = form;
    let got: u64 = read.iter().map(|b| b.len() as u64).sum();
    match (head, rest, declared) {
        (Some(head), Some(rest), Some(len)) if len > got => {
            let check: Box<dyn crate::upstream::UploadCheck> = Box::new(reader);
            Ok((RequestBody::form(Bytes::new(), head), Some(Upload::new(read, rest, len, within, Some(check)))))
        }
        (Some(head), rest, _) if rest.is_none() || reader.ended() => {
            // Whole already (the closing boundary read; what follows it is ignored, as the replica does).
            let read = match rest {
                Some(rest) => frames(rest, read, limit, hold).await?,
                None => read,
            };
            reader.finish().map_err(|why| super::form::malformed(&why))?;
            Ok((RequestBody::form(Bytes::new(), head), Some(Upload::in_memory(read))))
        }
        (_, Some(rest), _) => {
            let n = read.len();
            let read = frames(rest, read, limit, hold).await?;
            // Read to its end aside when large; kept in the frames it came in, never joined.
            let len = read.iter().map(Bytes::len).sum();
            let (head, read) =
                super::aside::run(len, move || super::form::read_rest(reader, &read[n..]).map(|head| (head, read))).await??;
            Ok((RequestBody::form(Bytes::new(), head), Some(Upload::in_memory(read))))
        }
        (_, None, _) => {
            let head = super::form::read_rest(reader, &[])?;
            Ok((RequestBody::form(Bytes::new(), head), Some(Upload::in_memory(read))))
        }
    }
}

/// The rest of `body` after the parts already read, frame by frame, at
/// most `limit` bytes in all (past it, 413). Joining them is a copy of the
/// whole body, left to the caller to do aside: done on a worker as the
/// frames arrive, the copies and the page faults of a fresh buffer took the
/// streams' threads (docs/design/reduction.md, rule 9).
async fn frames<B>(mut body: B, mut parts: Vec<Bytes>, limit: u64, hold: &mut BodyHold) -> Result<Vec<Bytes>, GatewayError>
where
    B: http_body::Body<Data = Bytes> + Unpin,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let mut got: u64 = parts.iter().map(|b| b.len() as u64).sum();
    while let Some(frame) = body.frame().await {
        let Ok(data) = frame.map_err(|e| GatewayError::BodyRead(e.into()))?.into_data() else { continue };
        got += data.len() as u64;
        if got > limit {
            return Err(GatewayError::PayloadTooLarge { limit });
        }
        hold.take(data.len())?;
        parts.push(data);
    }
    Ok(parts)
}

/// `parts` joined into one buffer.
fn join(mut parts: Vec<Bytes>) -> Bytes {
    if parts.len() == 1 {
        return parts.pop().unwrap_or_default();
    }
    let mut b = bytes::BytesMut::with_capacity(parts.iter().map(Bytes::len).sum());
    for p in parts {
        b.extend_from_slice(&p);
    }
    b.freeze()
}

/// The request's Content-Type, as bytes (the replica reads it as Latin-1);
/// two of them are a 400: the replica could read either.
fn content_type(headers: &HeaderMap) -> Result<Option<&[u8]>, GatewayError> {
    let mut all = headers.get_all(header::CONTENT_TYPE).iter();
    let first = all.next();
    if all.next().is_some() {
        return Err(GatewayError::InvalidRequest { message: "the request has two Content-Type headers".into(), param: None });
    }
    Ok(first.map(HeaderValue::as_bytes))
}

fn declared_length(headers: &HeaderMap) -> Option<u64> {
    headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok())
}

async fn read_body(body: ClientBody, headers: &HeaderMap, limit: u64, hold: &mut BodyHold) -> Result<Bytes, GatewayError> {
    let declared = declared_length(headers);
    if declared.is_some_and(|len| len > limit) {
        return Err(GatewayError::PayloadTooLarge { limit });
    }
    let read = frames(body, Vec::new(), limit, hold).await?;
    super::aside::run(read.iter().map(Bytes::len).sum(), move || join(read)).await
}
