//! The request's tracker: everything measured about one request, and the
//! guards it holds (the lease on its slot, its breaker probe, its key's
//! permit, its span). When it is dropped or closed it builds one finished
//! record, hands it to each guard to judge by its own rules, and records
//! exactly one outcome to the metrics, the class's windows and budget and
//! the access log. The rules are docs/design/measurement.md's.

use std::sync::Arc;

use http::HeaderValue;
use tokio::time::Instant;

use crate::admission::{Lease, Probe};
use crate::classify::Class;
use crate::config::Endpoint;
use crate::limits::{Permit, RateState, Tenant};
use crate::telemetry::access_log::{AccessLog, AccessRecord};
use crate::telemetry::accounting::{self, Finished, Sinks};
use crate::telemetry::labels::FinishReason;
use crate::telemetry::metrics::Metrics;
use crate::telemetry::otel::span_finished;
use crate::telemetry::series::RequestSeries;
use crate::telemetry::Outcome;
use sse::Usage;

/// A stream's gaps between tokens are reported to its replica every this many.
pub(super) const GAPS_REPORTED_EVERY: u64 = 16;

/// Everything measured about one request; records itself once, on drop.
/// It also carries the request's guards (the lease on its slot, its breaker
/// probe, its span), which end with it.
pub(crate) struct Tracker {
    metrics: Arc<Metrics>,
    /// The series it writes (its model's; `unknown` until the model is known).
    series: Option<Arc<RequestSeries>>,
    class: Arc<Class>,
    pub(super) start: Instant,
    pub(super) first_token: Option<Instant>,
    pub(super) last_token: Option<Instant>,
    pub(super) gaps: u64,
    gaps_over: u64,
    /// The token and gap count up to which this stream's gaps were last
    /// reported to its replica (see [`Replica::record_itl`]).
    gaps_reported: Option<(Instant, u64)>,
    pub(super) usage: Option<Usage>,
    /// When the replica reports no usage (llama.cpp's server, among
    /// others): the prompt's tokens estimated from the request body, and
    /// the answer's from a non-streaming body's text.
    prompt_estimate: u64,
    pub(super) answer_estimate: Option<u64>,
    pub(super) streaming: bool,
    outcome: Option<Outcome>,
    /// The stream ended before `[DONE]` (an incomplete response).
    pub(super) cut: bool,
    pub(super) lease: Option<Lease>,
    /// Time it waited in the gateway's queue.
    queued: std::time::Duration,
    /// Admitted by a half-open breaker as a probe: report how it went.
    probe: Option<Probe>,
    pub(super) finish_reason: Option<String>,
    /// The request's trace span (disabled unless OTLP export is on); it
    /// ends when the tracker is dropped, with the stream.
    span: tracing::Span,
    /// Accounted for already (see [`Tracker::close`]).
    recorded: bool,
    /// Who it is for.
    tenant: Option<Arc<Tenant>>,
    /// Its hold on its key's limits and the key's quotas for the response
    /// headers (keys with limits only): boxed, so a request whose key has
    /// none does not carry their room for its life.
    key: Option<Box<Keyed>>,
    /// The tokens a stream may relay before its key's limits end it
    /// (its reservation less its prompt); `u64::MAX` when they cannot.
    key_budget: u64,
    /// The request's id: its response, its replica, its span and its access
    /// log line carry it.
    pub(super) request_id: HeaderValue,
    endpoint: Endpoint,
    /// The status the client got; 0 until a response is made (a client
    /// gone before one is logged as 499, as nginx does).
    status: u16,
    bytes_in: u64,
    /// Body bytes sent to the client.
    pub(super) bytes_out: u64,
    access_log: Option<Arc<AccessLog>>,
    /// Its body's bytes, held against the gateway's budgets until it ends.
    body: Option<crate::server::bodies::BodyHold>,
    /// A Responses request: where the owner of the response it makes is
    /// learned, and its tenant; taken once learned.
    learn: Option<(Arc<crate::upstream::owners::Owners>, Arc<str>)>,
}

/// A request's hold on its key's limits, and the key's quotas for the
/// response headers.
#[derive(Default)]
struct Keyed {
    permit: Option<Permit>,
    rate: Option<RateState>,
}

impl Tracker {
    /// Boxed: a tracker is about 620 bytes, and it travels with its request
    /// by value (into the forwarding's future, into the observed body, that
    /// into its shared cell); inline, each of those moves copied all of it.
    pub(crate) fn new(metrics: Arc<Metrics>, class: Arc<Class>, start: Instant) -> Box<Tracker> {
        Box::new(Tracker {
            metrics,
            series: None,
            class,
            start,
            first_token: None,
            last_token: None,
            gaps: 0,
            gaps_over: 0,
            gaps_reported: None,
            usage: None,
            prompt_estimate: 0,
            answer_estimate: None,
            streaming: false,
            outcome: None,
            cut: false,
            lease: None,
            queued: std::time::Duration::ZERO,
            probe: None,
            finish_reason: None,
            span: tracing::Span::none(),
            recorded: false,
            tenant: None,
            key: None,
            key_budget: u64::MAX,
            request_id: HeaderValue::from_static(""),
            endpoint: Endpoint::Other,
            status: 0,
            bytes_in: 0,
            bytes_out: 0,
            access_log: None,
            body: None,
            learn: None,
        })
    }

    /// Which request this is: its id and endpoint, and the access log its line goes to.
    pub(crate) fn set_request(&mut self, id: HeaderValue, endpoint: Endpoint, access_log: Option<Arc<AccessLog>>) {
        self.request_id = id;
        self.endpoint = endpoint;
        self.access_log = access_log;
    }

    /// The status of the response to the client.
    pub(crate) fn set_status(&mut self, status: u16) {
        self.status = status;
    }

    /// It makes a stored response: learn its owner in `owners`, for `tenant`.
    pub(crate) fn learn_responses(&mut self, owners: Arc<crate::upstream::owners::Owners>, tenant: Arc<str>) {
        self.learn = Some((owners, tenant));
    }

    /// Still to learn its response's id.
    #[inline]
    pub(super) fn learning(&self) -> bool {
        self.learn.is_some()
    }

    /// Its response is `id`, made on its lease's replica.
    pub(super) fn learned(&mut self, id: &str) {
        if let (Some((owners, tenant)), Some(lease)) = (self.learn.take(), &self.lease) {
            owners.learn(id, lease.replica(), tenant);
        }
    }

    /// Its body's bytes are held until it ends.
    /// What routing found: the body's bytes (held against the budgets
    /// until the request ends), the model, whether it streams, and the
    /// prompt's estimate.
    pub(super) fn routed(&mut self, routed: &super::route::Routed<'_>, hold: crate::server::bodies::BodyHold) {
        self.hold_body(hold);
        self.set_bytes_in(routed.bytes_in());
        if let Some(m) = &routed.model {
            self.set_model(m);
        }
        // Speech is sent as it is made: its first audio byte is its first token.
        self.streaming = routed.stream || self.endpoint == Endpoint::Speech;
        self.set_prompt_estimate(routed.request.prompt_estimate());
    }

    /// What admission decided: whether it is the breaker's probe, and the
    /// time it waited (on the span).
    pub(super) fn admitted(&mut self, admitted: &mut crate::admission::Admitted) {
        self.set_probe(admitted.probe.take());
        self.span.record("slogate.queue_ms", admitted.waited.as_secs_f64() * 1000.0);
    }

    pub(crate) fn hold_body(&mut self, hold: crate::server::bodies::BodyHold) {
        self.body = Some(hold);
    }

    /// The request body's size as the client sent it.
    pub(crate) fn set_bytes_in(&mut self, n: u64) {
        self.bytes_in = n;
    }

    fn keyed(&mut self) -> &mut Keyed {
        self.key.get_or_insert_with(Box::default)
    }

    pub(crate) fn set_tenant(&mut self, tenant: Arc<Tenant>) {
        self.tenant = Some(tenant);
    }

    /// The key's limits let the request through: hold `permit` until it ends.
    pub(crate) fn set_permit(&mut self, permit: Permit, state: RateState) {
        if let Some(bound) = permit.token_bound() {
            self.key_budget = bound.saturating_sub(self.prompt_estimate);
        }
        let key = self.keyed();
        key.permit = Some(permit);
        key.rate = Some(state);
    }

    /// The key's quotas, for the headers of the response.
    pub(crate) fn set_rate(&mut self, state: RateState) {
        self.keyed().rate = Some(state);
    }

    pub(crate) fn rate(&self) -> Option<RateState> {
        self.key.as_ref().and_then(|k| k.rate)
    }

    pub(crate) fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// Attach the request's span; its fields are filled in as the request goes.
    pub(crate) fn set_span(&mut self, span: tracing::Span) {
        if !span.is_disabled() {
            span.record("slogate.request_id", self.request_id.to_str().unwrap_or(""));
        }
        self.span = span;
    }

    pub(crate) fn span(&self) -> &tracing::Span {
        &self.span
    }

    /// This request is a half-open breaker's probe (or not).
    pub(crate) fn set_probe(&mut self, probe: Option<Probe>) {
        self.probe = probe;
    }

    /// Set the model label (a model a pool serves: bounded).
    pub(crate) fn set_model(&mut self, model: &str) {
        self.series = Some(self.class.control.series.load().for_request(model, self.endpoint));
        self.span.record("gen_ai.request.model", model);
    }

    /// The model label: the request's model once known, `unknown` before.
    pub(crate) fn model(&self) -> &str {
        self.series.as_deref().map_or("unknown", RequestSeries::model)
    }

    /// The prompt's tokens as estimated from the request body, used only
    /// if the replica reports no usage.
    pub(crate) fn prompt_estimate(&self) -> u64 {
        self.prompt_estimate
    }

    pub(crate) fn set_prompt_estimate(&mut self, tokens: u64) {
        self.prompt_estimate = tokens;
    }

    /// The usage to account: the replica's, or (for a completed request
    /// whose replica reported none) an estimate, flagged as one. A stream's
    /// completion tokens are its content events: one token each, as most
    /// engines send them.
    fn usage_or_estimate(&self, outcome: Outcome) -> (Option<Usage>, bool) {
        if self.usage.is_some() || !outcome.completed() {
            return (self.usage, false);
        }
        let completion = if self.streaming { self.first_token.map_or(0, |_| self.gaps + 1) } else { self.answer_estimate.unwrap_or(0) };
        (Some(Usage::new(self.prompt_estimate, completion)), true)
    }

    /// What the request took from its key's tokens, however it ended
    /// (docs/access.md, rule 9): the replica's usage where it came (or, for
    /// a completed answer without one, its estimate); otherwise the prompt's
    /// estimate plus the tokens relayed (a stream's content events, one
    /// token each; an answer the replica refused, none). A request that
    /// reached a replica and whose answer never came (not streamed, the
    /// client gone or the body cut) keeps its reservation: how much the
    /// replica generated before it saw the cut is not known, and counting
    /// none would let a client take whole answers for the price of a prompt.
    fn key_tokens(&self, f: &Finished) -> Option<u64> {
        if let Some(u) = f.usage {
            return Some(u.prompt_tokens.saturating_add(u.completion_tokens));
        }
        let relayed = self.first_token.map_or(0, |_| self.gaps + 1);
        if self.streaming {
            return Some(self.prompt_estimate.saturating_add(relayed));
        }
        let refused = self.status != 0 && !(200..300).contains(&self.status);
        refused.then_some(self.prompt_estimate)
    }

    /// The stream has relayed the tokens its key's limits reserved for it
    /// (a content event is a token or more): the next is not relayed.
    #[inline]
    pub(super) fn at_key_budget(&self) -> bool {
        self.first_token.is_some() && self.gaps.saturating_add(1) >= self.key_budget
    }

    pub(crate) fn endpoint(&self) -> Endpoint {
        self.endpoint
    }

    /// The request holds `lease` from now until it ends; it waited
    /// `queued` for it (the replica's first-token time starts after).
    pub(crate) fn attach_lease(&mut self, lease: Lease, queued: std::time::Duration) {
        self.lease = Some(lease);
        self.queued = queued;
    }

    pub(crate) fn class(&self) -> &Arc<Class> {
        &self.class
    }

    pub(crate) fn start(&self) -> Instant {
        self.start
    }

    /// Set the outcome; the first call wins.
    #[inline]
    pub(crate) fn finish(&mut self, outcome: Outcome) {
        if self.outcome.is_none() {
            self.outcome = Some(outcome);
        }
    }

    // Inlined into the observed body's per-event path: in a module of its
    // own it stopped being inlined, and ab.sh measured +43 to +76 us of CPU
    // per streamed request (about 1 us per event); with the hint, -7 us.
    #[inline]
    pub(super) fn content_event(&mut self, now: Instant) {
        match self.last_token {
            None => {
                self.first_token = Some(now);
                // Recorded now, not at the end of the stream: the rolling
                // window must see a slow first token while the stream runs.
                let ttft = now - self.start;
                series(&mut self.series, &self.class, self.endpoint).ttft(&self.metrics).observe(ttft.as_secs_f64());
                if let Some(l) = self.lease.as_mut() {
                    l.first_token();
                    if self.class.control.tier == crate::config::Tier::Interactive {
                        l.replica().record_first_token(ttft.saturating_sub(self.queued), self.class.control.ttft_target());
                    }
                }
                // The class's breaker judges the requests within their
                // tenants' shares: a tenant over its share waited for its
                // own excess, so its wait is left out of the class's sample.
                let judged = self.lease.as_ref().map_or(ttft, |l| l.breaker_sample(ttft, self.queued));
                self.class.control.ttft.record(judged);
                if let Some(probe) = self.probe.take() {
                    probe.first_token(ttft);
                }
            }
            Some(prev) => {
                let gap = now - prev;
                series(&mut self.series, &self.class, self.endpoint).itl(&self.metrics).observe(gap.as_secs_f64());
                self.class.control.itl.record(gap);
                self.gaps += 1;
                if gap > self.class.itl {
                    self.gaps_over += 1;
                }
            }
        }
        self.last_token = Some(now);
        if self.gaps % GAPS_REPORTED_EVERY == 0 {
            // (A no-op at the first token: no gap yet.)
            self.report_gaps();
        }
    }

    /// Tell the replica this stream's gaps since the last report: every
    /// [`GAPS_REPORTED_EVERY`] gaps and at the end, so a replica that slows
    /// down is seen within a second or so, not only as its streams end.
    pub(super) fn report_gaps(&mut self) {
        let (Some(l), Some(first), Some(last)) = (&self.lease, self.first_token, self.last_token) else { return };
        let (from, before) = self.gaps_reported.unwrap_or((first, 0));
        if self.gaps > before {
            l.replica().record_itl(last - from, self.gaps - before);
            self.gaps_reported = Some((last, self.gaps));
        }
    }

    fn record(&mut self) {
        let outcome = self.outcome.unwrap_or(Outcome::cancelled);
        let (usage, usage_estimated) = self.usage_or_estimate(outcome);
        self.usage = usage;
        let f = Finished {
            outcome,
            signal: crate::telemetry::metrics::Signal::of(self.endpoint, self.streaming),
            cut: self.cut,
            start: self.start,
            end: Instant::now(),
            first_token: self.first_token,
            gaps: self.gaps,
            gaps_over: self.gaps_over,
            usage,
            usage_estimated,
            ttft_target: self.class.ttft,
            itl_target: self.class.itl,
            admitted: self.lease.is_some(),
            queued: if self.lease.is_some() { self.queued } else { std::time::Duration::ZERO },
        };
        // Each guard judges the finished request by its own rules.
        span_finished(&self.span, &f, self.finish_reason.as_deref(), self.lease.as_ref().map(|l| l.replica().label()));
        if let Some(probe) = self.probe.take() {
            probe.finished(&f);
        }
        let taken = self.key_tokens(&f);
        if let Some(p) = self.key.as_mut().and_then(|k| k.permit.as_mut()) {
            p.finished(f.admitted, taken);
        }
        if let Some(l) = self.lease.as_mut() {
            l.finished(&f);
        }
        if let Some(t) = &self.tenant {
            t.finished(&f);
        }
        self.log_access(&f);
        self.report_gaps();
        if let (true, Some(reason)) = (outcome.completed(), self.finish_reason.as_deref()) {
            self.class.control.series.load().finish(&self.metrics, FinishReason::of(reason)).inc();
        }
        let control = &self.class.control;
        let series = series(&mut self.series, &self.class, self.endpoint);
        let class = control.series.load();
        accounting::account(
            &f,
            &Sinks { metrics: &self.metrics, series, class: &class, budget: &control.budget, ttft_window: &control.ttft },
        );
    }
}

impl Tracker {
    /// The request's access log line, when there is an access log.
    fn log_access(&self, f: &Finished) {
        let Some(log) = &self.access_log else { return };
        let status = if self.status == 0 { 499 } else { self.status };
        // A stream that did not complete and reported no usage: what its
        // key was charged (its prompt's estimate, the tokens relayed), as
        // an estimate, so the log agrees with the key's quota.
        let relayed = self.first_token.map(|_| self.gaps + 1);
        let (usage, usage_estimated) = match (f.usage, relayed) {
            (None, Some(n)) if self.streaming => (Some(Usage::new(self.prompt_estimate, n)), true),
            (u, _) => (u, f.usage_estimated),
        };
        log.log(AccessRecord {
            end: std::time::SystemTime::now(),
            request_id: self.request_id.clone(),
            tenant: self.tenant.as_ref().map(|t| t.name.clone()),
            model: self.series.clone(),
            class: self.class.name.clone(),
            endpoint: self.endpoint,
            replica: self.lease.as_ref().map(|l| l.replica().public_name()),
            status,
            outcome: f.outcome,
            queued: f.queued,
            ttft: f.ttft(),
            e2e: f.e2e(),
            prompt_tokens: usage.map(|u| u.prompt_tokens),
            completion_tokens: usage.map(|u| u.completion_tokens),
            usage_estimated,
            bytes_in: self.bytes_in,
            bytes_out: self.bytes_out,
        });
    }
}

/// A request's series: its model's, or `unknown` when it never got one.
fn series<'a>(slot: &'a mut Option<Arc<RequestSeries>>, class: &Class, endpoint: Endpoint) -> &'a RequestSeries {
    slot.get_or_insert_with(|| class.control.series.load().for_request("unknown", endpoint))
}

impl Tracker {
    /// The request is over: account for it (once) and give its slot back,
    /// now, even if the response body lives on (a client that stopped
    /// reading keeps it until its connection goes).
    pub(super) fn close(&mut self) {
        if !std::mem::replace(&mut self.recorded, true) {
            self.record();
        }
        self.lease = None;
        self.body = None;
    }
}

impl Drop for Tracker {
    fn drop(&mut self) {
        self.close();
    }
}
