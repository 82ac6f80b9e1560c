//! One request of a run: its body and headers, the answer's head, and the
//! answer read as a client reads it (TTFT at the first token event, every
//! gap, usage, the outcome), recorded into what the run shares.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use serde::Deserialize;
use tokio::time::Instant;

use super::body::{self, request_body};
use super::record::{Detail, Gaps, Record, Shared};
use super::scenario::{Prompt, StreamSpec, Targets, TtftDefinition};

pub(super) type HttpClient = Client<HttpConnector, Full<Bytes>>;

/// `"name":<digits>` in a JSON payload, without parsing the rest.
fn stamp(data: &[u8], name: &[u8]) -> Option<u64> {
    let at = memchr::memmem::find(data, name)? + name.len();
    let digits = data[at..].iter().take_while(|b| b.is_ascii_digit()).count();
    std::str::from_utf8(&data[at..at + digits]).ok()?.parse().ok()
}

#[derive(Clone)]
pub(super) struct Ctx {
    pub(super) client: HttpClient,
    /// Target base URLs, used in turn.
    pub(super) bases: Arc<Vec<String>>,
    /// The stream's next target, in turn (its own: not shared with other
    /// streams or with other runs in the same process).
    pub(super) turn: Arc<AtomicU64>,
    pub(super) spec: Arc<StreamSpec>,
    pub(super) target: Option<Targets>,
    pub(super) shared: Arc<Shared>,
    pub(super) t0: Instant,
    pub(super) timeout: Duration,
    pub(super) ttft: TtftDefinition,
    /// `transcriptions`: the stream's form, made once and sent by every request.
    pub(super) form: Option<Bytes>,
}

/// An event with a non-empty `choices` list (`vllm bench serve`'s first token).
fn has_choices(data: &[u8]) -> bool {
    #[derive(Deserialize)]
    struct Event {
        #[serde(default)]
        choices: Vec<serde::de::IgnoredAny>,
    }
    serde_json::from_slice::<Event>(data).is_ok_and(|e| !e.choices.is_empty())
}

/// Prompts of this many tokens (about 256 KiB) and more are written on a blocking thread.
const LARGE_PROMPT: u32 = 65_536;

impl Ctx {
    fn class(&self) -> String {
        self.spec.class.clone().unwrap_or_else(|| "default".into())
    }

    pub(super) fn record_overload(&self) {
        self.push(Record { outcome: "client_overload".into(), ..self.blank(self.t0.elapsed().as_secs_f64(), 0) }, &Gaps::default(), None);
    }

    fn blank(&self, start_s: f64, prompt_tokens: u32) -> Record {
        Record {
            stream: self.spec.name.clone(),
            class: self.class(),
            start_s,
            status: 0,
            outcome: String::new(),
            ttft_ms: None,
            e2e_ms: 0.0,
            tokens: 0,
            prompt_tokens,
            gaps: 0,
            itl_over: 0,
            itl_max_ms: None,
            retry_after: None,
            queue_ms: None,
            context_reduced: None,
            engine_ttft_ms: None,
            engine_itl_over: None,
            path_in_ms: None,
            target: None,
            error_code: None,
            retry_after_ms: None,
            replica: None,
        }
    }

    fn push(&self, r: Record, gaps: &Gaps, usage_tokens: Option<u32>) {
        if !r.completed() {
            self.shared.errors.fetch_add(1, Ordering::Relaxed);
        }
        if let Some(t) = r.ttft_ms {
            let _ = self.shared.ttft_recent.lock().unwrap_or_else(|e| e.into_inner()).record((t * 1000.0) as u64);
        }
        if !gaps.client.is_empty() {
            let mut itl = self.shared.itl.lock().unwrap_or_else(|e| e.into_inner());
            itl.by_class.record(&r.class, gaps);
            if let Some(t) = r.target {
                itl.by_target.record(&t.to_string(), gaps);
            }
        }
        self.shared.done.fetch_add(1, Ordering::Relaxed);
        // Both pushed under the records lock: their orders agree.
        let mut records = self.shared.records.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(d) = &self.shared.details {
            let itl_s = gaps.client.iter().map(|g| *g as f64 / 1e6).collect();
            d.lock().unwrap_or_else(|e| e.into_inner()).push(Detail { itl_s, output_tokens: usage_tokens.unwrap_or(r.tokens) });
        }
        records.push(r);
    }

    pub(super) async fn one(self, p: Prompt) {
        let start = Instant::now();
        let mut rec = self.blank((start - self.t0).as_secs_f64(), p.prompt_tokens);
        let mut gaps = Gaps::default();
        let mut usage = None;
        let outcome = tokio::time::timeout(self.timeout, self.exchange(p, start, &mut rec, &mut gaps, &mut usage)).await;
        rec.outcome = match outcome {
            Ok(o) => o,
            Err(_) => "timeout".into(),
        };
        rec.e2e_ms = start.elapsed().as_secs_f64() * 1000.0;
        self.push(rec, &gaps, usage);
    }

    async fn exchange(&self, p: Prompt, start: Instant, rec: &mut Record, gaps: &mut Gaps, usage: &mut Option<u32>) -> String {
        let Some(req) = self.request(p, rec).await else { return "client_error".into() };
        let sent_unix_ns = crate::unix_nanos();
        let resp = match self.client.request(req).await {
            Ok(r) => r,
            Err(_) => return "connect_error".into(),
        };
        rec.status = resp.status().as_u16();
        read_head(resp.headers(), rec);
        let status = resp.status();
        let body = resp.into_body();
        if !status.is_success() {
            if let Ok(b) = body.collect().await {
                let v: serde_json::Value = serde_json::from_slice(&b.to_bytes()).unwrap_or_default();
                rec.error_code = v.pointer("/error/code").and_then(|c| c.as_str()).map(str::to_string);
            }
            return if status.as_u16() == 429 { "rejected".into() } else { format!("http_{}", status.as_u16()) };
        }
        if !self.spec.stream || self.spec.endpoint.whole_answer() {
            return whole(body, rec, usage).await;
        }
        let mut clock =
            Clock { start, sent_unix_ns, last: None, last_sent_ns: None, itl_target_us: self.target.map(|t| (t.itl_ms * 1000.0) as u64) };
        self.stream(body, &mut clock, rec, gaps, usage).await
    }

    /// The request for prompt `p`, to the stream's next target (noted in
    /// `rec` when it has several). A body of megabytes is written on a
    /// blocking thread: it takes milliseconds, and not on the threads that
    /// read the other streams' tokens (their gaps would grow).
    async fn request(&self, p: Prompt, rec: &mut Record) -> Option<http::Request<Full<Bytes>>> {
        let spec = &self.spec;
        let (body, content_type) = if let Some(form) = &self.form {
            (form.clone(), body::FORM_CONTENT_TYPE)
        } else if p.prompt_tokens >= LARGE_PROMPT {
            let spec = spec.clone();
            (Bytes::from(tokio::task::spawn_blocking(move || request_body(&spec, &p)).await.ok()?), "application/json")
        } else {
            (Bytes::from(request_body(spec, &p)), "application/json")
        };
        let path = body::path(spec.endpoint);
        let i = self.turn.fetch_add(1, Ordering::Relaxed) as usize % self.bases.len().max(1);
        if self.bases.len() > 1 {
            rec.target = Some(i);
        }
        let mut req = http::Request::post(format!("{}{path}", self.bases[i])).header("content-type", content_type);
        if let Some(c) = &spec.class {
            req = req.header("x-slo-class", c);
        }
        if let Some(k) = &spec.api_key {
            req = req.header("authorization", format!("Bearer {k}"));
        }
        req.body(Full::new(body)).ok()
    }

    /// A streamed answer read event by event: tokens, TTFT and gaps timed
    /// on `clock`, usage, and the outcome the stream ended with.
    async fn stream(
        &self,
        mut body: hyper::body::Incoming,
        clock: &mut Clock,
        rec: &mut Record,
        gaps: &mut Gaps,
        usage: &mut Option<u32>,
    ) -> String {
        let mut parser = sse::SseParser::new();
        let mut memo = sse::Memo::new();
        let (mut done, mut error, mut finish) = (false, false, None::<String>);
        loop {
            let frame = match body.frame().await {
                None => break,
                Some(Err(_)) => return "cut".into(),
                Some(Ok(f)) => f,
            };
            let Ok(data) = frame.into_data() else { continue };
            let now = Instant::now();
            parser.feed(&data, |d, _| {
                let Some(d) = d else { return };
                let info = memo.analyze(d);
                if let Some(u) = &info.usage {
                    *usage = Some(u.completion_tokens as u32);
                }
                if info.content {
                    rec.tokens += 1;
                }
                let token_event = match self.ttft {
                    TtftDefinition::FirstContent => info.content,
                    TtftDefinition::FirstChoices => has_choices(d),
                };
                if token_event {
                    clock.token(d, now, rec, gaps);
                }
                error |= info.error;
                done |= info.done;
                if info.finish_reason.is_some() {
                    finish = info.finish_reason;
                }
            });
        }
        if error || finish.as_deref() == Some("error") {
            "stream_error".into()
        } else if !done {
            "cut".into()
        } else if finish.as_deref() == Some("length") {
            "length".into()
        } else {
            "ok".into()
        }
    }
}

/// What the answer's head says for the record: Retry-After (seconds and
/// milliseconds), slogate's queue time, context reduction and replica.
fn read_head(h: &http::HeaderMap, rec: &mut Record) {
    rec.retry_after = h.get("retry-after").and_then(|v| v.to_str().ok()?.parse().ok());
    rec.retry_after_ms = h.get("retry-after-ms").and_then(|v| v.to_str().ok()?.parse().ok());
    rec.queue_ms = h.get("x-slogate-queue-ms").and_then(|v| v.to_str().ok()?.parse().ok());
    rec.context_reduced = h.get("x-slogate-context-reduced").and_then(|v| v.to_str().ok()).map(str::to_string);
    rec.replica = h.get("x-slogate-replica").and_then(|v| v.to_str().ok()).map(str::to_string);
}

/// A whole (non-streamed) answer: its tokens from its usage, and whether it
/// stopped at its length.
async fn whole(body: hyper::body::Incoming, rec: &mut Record, usage: &mut Option<u32>) -> String {
    let Ok(bytes) = body.collect().await.map(|c| c.to_bytes()) else { return "cut".into() };
    let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap_or_default();
    rec.tokens = v.pointer("/usage/completion_tokens").and_then(|t| t.as_u64()).unwrap_or(0) as u32;
    *usage = Some(rec.tokens);
    let length = v.pointer("/choices/0/finish_reason").and_then(|f| f.as_str()) == Some("length");
    if length { "length" } else { "ok" }.into()
}

/// A stream's clock: when it was sent, its last token event (as the client
/// saw it, and as a stamping simulator says it left the replica), and the
/// class's gap target.
struct Clock {
    start: Instant,
    sent_unix_ns: u64,
    last: Option<Instant>,
    last_sent_ns: Option<u64>,
    itl_target_us: Option<u64>,
}

impl Clock {
    /// A token event `d` read at `now`: the first is TTFT (and, stamped,
    /// the engine's and the inbound path's shares of it); each after is a
    /// gap (and, stamped, the engine's gap and what the path added).
    fn token(&mut self, d: &[u8], now: Instant, rec: &mut Record, gaps: &mut Gaps) {
        let sent_ns = stamp(d, b"\"sim_t_ns\":");
        match self.last {
            None => {
                rec.ttft_ms = Some((now - self.start).as_secs_f64() * 1000.0);
                if let (Some(t), Some(rx)) = (sent_ns, stamp(d, b"\"sim_rx_ns\":")) {
                    rec.engine_ttft_ms = Some(t.saturating_sub(rx) as f64 / 1e6);
                    rec.path_in_ms = Some(rx.saturating_sub(self.sent_unix_ns) as f64 / 1e6);
                }
            }
            Some(prev) => {
                let g = (now - prev).as_micros() as u64;
                gaps.client.push(g);
                if let (Some(t), Some(p)) = (sent_ns, self.last_sent_ns) {
                    let eg = t.saturating_sub(p) / 1000;
                    gaps.engine.push(eg);
                    let over = rec.engine_itl_over.get_or_insert(0);
                    if self.itl_target_us.is_some_and(|t| eg > t) {
                        *over += 1;
                    }
                    gaps.path.push(g.saturating_sub(eg));
                }
                rec.gaps += 1;
                if self.itl_target_us.is_some_and(|t| g > t) {
                    rec.itl_over += 1;
                }
                let ms = g as f64 / 1000.0;
                rec.itl_max_ms = Some(rec.itl_max_ms.map_or(ms, |m: f64| m.max(ms)));
            }
        }
        self.last = Some(now);
        self.last_sent_ns = sent_ns;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What slogate's answer head says lands in the record: the wait in its
    /// queue, the replica that answered, Retry-After in both forms.
    #[test]
    fn the_answer_head_fills_the_record() {
        let mut h = http::HeaderMap::new();
        for (k, v) in [("retry-after", "2"), ("retry-after-ms", "1500"), ("x-slogate-queue-ms", "12.5"), ("x-slogate-replica", "replica-1")]
        {
            h.insert(k, http::HeaderValue::from_static(v));
        }
        let mut rec: Record = serde_json::from_value(serde_json::json!({
            "stream": "chat", "class": "chat", "start_s": 0.0, "status": 200, "outcome": "ok", "ttft_ms": null,
            "e2e_ms": 0.0, "tokens": 0, "prompt_tokens": 0, "gaps": 0, "itl_over": 0, "itl_max_ms": null,
            "retry_after": null, "queue_ms": null, "context_reduced": null
        }))
        .expect("a record");
        read_head(&h, &mut rec);
        assert_eq!((rec.retry_after, rec.retry_after_ms, rec.queue_ms), (Some(2), Some(1500), Some(12.5)));
        assert_eq!(rec.replica.as_deref(), Some("replica-1"));
        assert_eq!(rec.context_reduced, None);
        // Straight to a replica: nothing of slogate's.
        read_head(&http::HeaderMap::new(), &mut rec);
        assert_eq!((rec.queue_ms, rec.replica), (None, None));
    }
}
