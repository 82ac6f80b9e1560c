//! Running a scenario: open-loop dispatch on a precomputed schedule (or
//! closed-loop workers), each request measured as a client sees it.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use hdrhistogram::Histogram;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use rand::rngs::StdRng;
use rand::SeedableRng;
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use super::body::{self, request_body};
use super::scenario::{Arrival, Prompt, Scenario, StreamSpec, Targets, TtftDefinition};

type HttpClient = Client<HttpConnector, Full<Bytes>>;

/// One request as the client saw it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Record {
    pub stream: String,
    pub class: String,
    /// Seconds from the start of the run to sending.
    pub start_s: f64,
    pub status: u16,
    /// ok, length, rejected (429), http_NNN, stream_error, cut, timeout, connect_error, client_overload.
    pub outcome: String,
    pub ttft_ms: Option<f64>,
    pub e2e_ms: f64,
    pub tokens: u32,
    pub prompt_tokens: u32,
    pub gaps: u32,
    /// Gaps longer than the class ITL target.
    pub itl_over: u32,
    pub itl_max_ms: Option<f64>,
    pub retry_after: Option<u64>,
    pub queue_ms: Option<f64>,
    pub context_reduced: Option<String>,
    /// With a stamping simulator (`vllm-sim --stamp-events`): the engine's
    /// share of this request's TTFT, from the request's arrival at the
    /// replica to its first content chunk leaving it. `ttft_ms` minus this is
    /// the path's share (network, gateway).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine_ttft_ms: Option<f64>,
    /// With a stamping simulator: the inbound part of the path's share, from
    /// the request leaving the client to its arrival at the replica (both on
    /// the wall clock, which processes on one machine share).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path_in_ms: Option<f64>,
    /// For a stream with several targets: which one (0-based, in the order
    /// listed) this request went to. Requests take the targets in turn.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<usize>,
    /// A refusal's OpenAI error `code` (`breaker_open`, `tenant_over_share`, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_code: Option<String>,
    /// A refusal's `retry-after-ms`, where it was sent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after_ms: Option<u64>,
}

impl Record {
    pub fn completed(&self) -> bool {
        self.outcome == "ok" || self.outcome == "length"
    }
    /// Completed with TTFT and (at least 99% of) ITL gaps within the class targets.
    pub fn within_slo(&self, t: Option<&Targets>) -> bool {
        let Some(t) = t else { return self.completed() };
        self.completed() && self.ttft_ms.is_none_or(|v| v <= t.ttft_ms) && self.itl_over <= self.gaps / 100
    }
}

/// Everything a run produced.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunResult {
    pub scenario: Scenario,
    pub label: String,
    pub elapsed_s: f64,
    pub records: Vec<Record>,
    /// All inter-token gaps per class, in microseconds, as (value, count) pairs.
    pub itl_us: BTreeMap<String, Vec<(u64, u64)>>,
    /// With a stamping simulator: the same gaps as the replica sent them.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub engine_itl_us: BTreeMap<String, Vec<(u64, u64)>>,
    /// With a stamping simulator: how much longer each gap reached the client
    /// than it left the replica (0 when shorter): the path's share of ITL.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub itl_path_us: BTreeMap<String, Vec<(u64, u64)>>,
    /// For streams with several targets: the same three sets of gaps keyed
    /// by target index ("0", "1", ... in the order listed), classes together.
    #[serde(default, skip_serializing_if = "TargetGaps::is_empty")]
    pub itl_by_target: TargetGaps,
    /// Every request's own gaps, in the order of `records` (only when asked
    /// for: see [`Options::details`]); not part of the JSON result.
    #[serde(skip)]
    pub details: Vec<Detail>,
}

/// One request's inter-token gaps, in seconds, and its output length.
#[derive(Debug, Clone, Default)]
pub struct Detail {
    pub itl_s: Vec<f64>,
    /// The replica's `usage.completion_tokens` when it sent usage, else the
    /// events counted.
    pub output_tokens: u32,
}

/// How a run measures and what it keeps.
#[derive(Debug, Clone, Copy, Default)]
pub struct Options {
    pub progress: bool,
    /// Keep each request's gaps ([`RunResult::details`]), for a per-request
    /// export; memory grows with every token of the run.
    pub details: bool,
}

/// Gaps per target index, as (value, count) pairs in microseconds.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TargetGaps {
    pub client_us: BTreeMap<String, Vec<(u64, u64)>>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub engine_us: BTreeMap<String, Vec<(u64, u64)>>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub path_us: BTreeMap<String, Vec<(u64, u64)>>,
}

impl TargetGaps {
    pub fn is_empty(&self) -> bool {
        self.client_us.is_empty()
    }
}

impl RunResult {
    pub fn itl_histogram(&self, class: &str) -> Histogram<u64> {
        let mut h = new_hist();
        for (v, c) in self.itl_us.get(class).into_iter().flatten() {
            let _ = h.record_n(*v, *c);
        }
        h
    }
}

pub fn new_hist() -> Histogram<u64> {
    // 1 us .. 1 h at 3 significant digits: constant, valid bounds.
    Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("valid histogram bounds")
}

/// Gaps of one request, in microseconds: as the client saw them, and (with a
/// stamping simulator) as the replica sent them and what the path added.
#[derive(Default)]
struct Gaps {
    client: Vec<u64>,
    engine: Vec<u64>,
    path: Vec<u64>,
}

#[derive(Default)]
struct GapHistograms {
    client: BTreeMap<String, Histogram<u64>>,
    engine: BTreeMap<String, Histogram<u64>>,
    path: BTreeMap<String, Histogram<u64>>,
}

impl GapHistograms {
    fn record(&mut self, key: &str, gaps: &Gaps) {
        for (m, v) in [(&mut self.client, &gaps.client), (&mut self.engine, &gaps.engine), (&mut self.path, &gaps.path)] {
            if v.is_empty() {
                continue;
            }
            let h = m.entry(key.to_string()).or_insert_with(new_hist);
            for g in v {
                let _ = h.record((*g).max(1));
            }
        }
    }
}

/// Gaps keyed by class, and by target index for streams with several.
#[derive(Default)]
struct AllGaps {
    by_class: GapHistograms,
    by_target: GapHistograms,
}

fn pairs(m: &BTreeMap<String, Histogram<u64>>) -> BTreeMap<String, Vec<(u64, u64)>> {
    m.iter().map(|(k, h)| (k.clone(), h.iter_recorded().map(|v| (v.value_iterated_to(), v.count_at_value())).collect())).collect()
}

/// `"name":<digits>` in a JSON payload, without parsing the rest.
fn stamp(data: &[u8], name: &[u8]) -> Option<u64> {
    let at = memchr::memmem::find(data, name)? + name.len();
    let digits = data[at..].iter().take_while(|b| b.is_ascii_digit()).count();
    std::str::from_utf8(&data[at..at + digits]).ok()?.parse().ok()
}

struct Shared {
    records: Mutex<Vec<Record>>,
    /// With [`Options::details`]: each record's details, pushed with it.
    details: Option<Mutex<Vec<Detail>>>,
    itl: Mutex<AllGaps>,
    ttft_recent: Mutex<Histogram<u64>>,
    sent: AtomicU64,
    done: AtomicU64,
    errors: AtomicU64,
}

const MAX_INFLIGHT: usize = 20_000;

/// Run a scenario to the end (its duration, or `max_requests`).
pub async fn run(s: &Scenario, label: &str, progress: bool) -> Result<RunResult, String> {
    run_with(s, label, Options { progress, details: false }).await
}

/// [`run`], with options.
pub async fn run_with(s: &Scenario, label: &str, opts: Options) -> Result<RunResult, String> {
    let progress = opts.progress;
    s.check()?;
    let mut http = HttpConnector::new();
    http.set_nodelay(true);
    let client: HttpClient = Client::builder(TokioExecutor::new()).pool_max_idle_per_host(4096).build(http.clone());
    // Windows as a browser's or a gRPC client's: a stream the reader is
    // slow on cannot take the whole connection's window.
    let client_h2: HttpClient = Client::builder(TokioExecutor::new())
        .http2_only(true)
        .http2_initial_stream_window_size(1 << 20)
        .http2_initial_connection_window_size(16 << 20)
        .build(http);
    let shared = Arc::new(Shared {
        records: Mutex::new(Vec::new()),
        details: opts.details.then(|| Mutex::new(Vec::new())),
        itl: Mutex::new(AllGaps::default()),
        ttft_recent: Mutex::new(new_hist()),
        sent: AtomicU64::new(0),
        done: AtomicU64::new(0),
        errors: AtomicU64::new(0),
    });
    let limit = Arc::new(tokio::sync::Semaphore::new(MAX_INFLIGHT));
    let t0 = Instant::now();
    let end = t0 + s.duration;
    let mut rng = StdRng::seed_from_u64(s.seed);
    let mut dispatchers = Vec::new();
    let mut expected = 0u64;
    for (i, spec) in s.streams.iter().enumerate() {
        let spec = Arc::new(spec.clone());
        let target = s.classes.get(spec.class.as_deref().unwrap_or("")).copied();
        let ctx = Ctx {
            client: if spec.http2 { client_h2.clone() } else { client.clone() },
            bases: Arc::new(s.targets_of(&spec)),
            turn: Arc::new(AtomicU64::new(0)),
            spec: spec.clone(),
            target,
            shared: shared.clone(),
            t0,
            timeout: s.request_timeout,
            ttft: s.ttft,
            form: spec.upload_bytes.map(|n| body::form(&spec.model, n)),
        };
        match &spec.arrival {
            Arrival::Closed { concurrency, ramp } => {
                let shared_sampler = spec.sampler(s.seed.wrapping_add(i as u64 * 7919))?;
                for w in 0..*concurrency {
                    let begin = t0 + ramp.mul_f64(w as f64 / *concurrency as f64);
                    let ctx = ctx.clone();
                    let mut sampler = shared_sampler.clone();
                    let mut wrng = StdRng::seed_from_u64(s.seed.wrapping_add((i * 100_003 + w) as u64));
                    let max = s.max_requests;
                    dispatchers.push(tokio::spawn(async move {
                        tokio::time::sleep_until(begin).await;
                        while Instant::now() < end && ctx.shared.sent.fetch_add(1, Ordering::Relaxed) < max {
                            ctx.clone().one(sampler.sample(&mut wrng)).await;
                        }
                    }));
                }
            }
            arrival => {
                let sseed = s.seed.wrapping_add(i as u64 * 7919);
                let mut sampler = spec.sampler(sseed)?;
                let mut srng = StdRng::seed_from_u64(sseed);
                let schedule = arrival.schedule(s.duration, s.max_requests, &mut rng)?;
                expected += schedule.len() as u64;
                let lens: Vec<Prompt> = schedule.iter().map(|_| sampler.sample(&mut srng)).collect();
                let limit = limit.clone();
                let max = s.max_requests;
                dispatchers.push(tokio::spawn(async move {
                    let mut inflight = tokio::task::JoinSet::new();
                    for (off, p) in schedule.into_iter().zip(lens) {
                        tokio::time::sleep_until(t0 + off).await;
                        if ctx.shared.sent.fetch_add(1, Ordering::Relaxed) >= max {
                            break;
                        }
                        match limit.clone().try_acquire_owned() {
                            Ok(permit) => {
                                let c = ctx.clone();
                                inflight.spawn(async move {
                                    c.one(p).await;
                                    drop(permit);
                                });
                            }
                            Err(_) => ctx.record_overload(),
                        }
                        while inflight.try_join_next().is_some() {}
                    }
                    while inflight.join_next().await.is_some() {}
                }));
            }
        }
    }
    let bar = progress.then(|| {
        let b = if expected > 0 { indicatif::ProgressBar::new(expected) } else { indicatif::ProgressBar::new(s.duration.as_secs()) };
        b.set_style(
            indicatif::ProgressStyle::with_template("{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} {msg}")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        b
    });
    let all = futures_join(dispatchers);
    tokio::pin!(all);
    let mut tick = tokio::time::interval(Duration::from_millis(500));
    let mut last_done = 0;
    loop {
        tokio::select! {
            _ = &mut all => break,
            _ = tick.tick() => {
                if let Some(b) = &bar {
                    let done = shared.done.load(Ordering::Relaxed);
                    let rate = (done - last_done) as f64 * 2.0;
                    last_done = done;
                    let p99 = {
                        let mut h = shared.ttft_recent.lock().unwrap_or_else(|e| e.into_inner());
                        let v = h.value_at_quantile(0.99) as f64 / 1000.0;
                        h.reset();
                        v
                    };
                    if expected > 0 { b.set_position(done) } else { b.set_position(t0.elapsed().as_secs()) }
                    b.set_message(format!("{rate:.0} req/s  errors {}  TTFT p99 {p99:.0} ms", shared.errors.load(Ordering::Relaxed)));
                }
            }
        }
    }
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    let elapsed_s = t0.elapsed().as_secs_f64();
    let mut records = std::mem::take(&mut *shared.records.lock().unwrap_or_else(|e| e.into_inner()));
    let mut details =
        shared.details.as_ref().map(|d| std::mem::take(&mut *d.lock().unwrap_or_else(|e| e.into_inner()))).unwrap_or_default();
    if details.len() == records.len() {
        let mut both: Vec<(Record, Detail)> = records.into_iter().zip(details).collect();
        both.sort_by(|a, b| a.0.start_s.total_cmp(&b.0.start_s));
        (records, details) = both.into_iter().unzip();
    } else {
        records.sort_by(|a, b| a.start_s.total_cmp(&b.start_s));
        details = Vec::new();
    }
    let gaps = shared.itl.lock().unwrap_or_else(|e| e.into_inner());
    let c = &gaps.by_class;
    let (itl_us, engine_itl_us, itl_path_us) = (pairs(&c.client), pairs(&c.engine), pairs(&c.path));
    let t = &gaps.by_target;
    let itl_by_target = TargetGaps { client_us: pairs(&t.client), engine_us: pairs(&t.engine), path_us: pairs(&t.path) };
    Ok(RunResult {
        scenario: s.clone(),
        label: label.to_string(),
        elapsed_s,
        records,
        itl_us,
        engine_itl_us,
        itl_path_us,
        itl_by_target,
        details,
    })
}

async fn futures_join(handles: Vec<tokio::task::JoinHandle<()>>) {
    for h in handles {
        let _ = h.await;
    }
}

#[derive(Clone)]
struct Ctx {
    client: HttpClient,
    /// Target base URLs, used in turn.
    bases: Arc<Vec<String>>,
    /// The stream's next target, in turn (its own: not shared with other
    /// streams or with other runs in the same process).
    turn: Arc<AtomicU64>,
    spec: Arc<StreamSpec>,
    target: Option<Targets>,
    shared: Arc<Shared>,
    t0: Instant,
    timeout: Duration,
    ttft: TtftDefinition,
    /// `transcriptions`: the stream's form, made once and sent by every request.
    form: Option<Bytes>,
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

    fn record_overload(&self) {
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
            path_in_ms: None,
            target: None,
            error_code: None,
            retry_after_ms: None,
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

    async fn one(self, p: Prompt) {
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
        let spec = &self.spec;
        // Writing a body of megabytes takes milliseconds: not on the threads
        // that read the other streams' tokens (their gaps would grow).
        let (body, content_type) = if let Some(form) = &self.form {
            (form.clone(), body::FORM_CONTENT_TYPE)
        } else if p.prompt_tokens >= LARGE_PROMPT {
            let spec = spec.clone();
            match tokio::task::spawn_blocking(move || request_body(&spec, &p)).await {
                Ok(b) => (Bytes::from(b), "application/json"),
                Err(_) => return "client_error".into(),
            }
        } else {
            (Bytes::from(request_body(spec, &p)), "application/json")
        };
        let path = body::path(spec.endpoint);
        let i = self.turn.fetch_add(1, Ordering::Relaxed) as usize % self.bases.len().max(1);
        let base = &self.bases[i];
        if self.bases.len() > 1 {
            rec.target = Some(i);
        }
        let mut req = http::Request::post(format!("{base}{path}")).header("content-type", content_type);
        if let Some(c) = &spec.class {
            req = req.header("x-slo-class", c);
        }
        if let Some(k) = &spec.api_key {
            req = req.header("authorization", format!("Bearer {k}"));
        }
        let Ok(req) = req.body(Full::new(body)) else { return "client_error".into() };
        let sent_unix_ns = crate::unix_nanos();
        let resp = match self.client.request(req).await {
            Ok(r) => r,
            Err(_) => return "connect_error".into(),
        };
        rec.status = resp.status().as_u16();
        let h = resp.headers();
        rec.retry_after = h.get("retry-after").and_then(|v| v.to_str().ok()?.parse().ok());
        rec.retry_after_ms = h.get("retry-after-ms").and_then(|v| v.to_str().ok()?.parse().ok());
        rec.queue_ms = h.get("x-slogate-queue-ms").and_then(|v| v.to_str().ok()?.parse().ok());
        rec.context_reduced = h.get("x-slogate-context-reduced").and_then(|v| v.to_str().ok()).map(str::to_string);
        let status = resp.status();
        let mut body = resp.into_body();
        if !status.is_success() {
            if let Ok(b) = body.collect().await {
                let v: serde_json::Value = serde_json::from_slice(&b.to_bytes()).unwrap_or_default();
                rec.error_code = v.pointer("/error/code").and_then(|c| c.as_str()).map(str::to_string);
            }
            return if status.as_u16() == 429 { "rejected".into() } else { format!("http_{}", status.as_u16()) };
        }
        if !spec.stream || spec.endpoint.whole_answer() {
            let Ok(bytes) = body.collect().await.map(|c| c.to_bytes()) else { return "cut".into() };
            let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap_or_default();
            rec.tokens = v.pointer("/usage/completion_tokens").and_then(|t| t.as_u64()).unwrap_or(0) as u32;
            *usage = Some(rec.tokens);
            let length = v.pointer("/choices/0/finish_reason").and_then(|f| f.as_str()) == Some("length");
            return if length { "length" } else { "ok" }.into();
        }
        let itl_target_us = self.target.map(|t| (t.itl_ms * 1000.0) as u64);
        let mut parser = sse::SseParser::new();
        let mut memo = sse::Memo::new();
        let (mut last, mut done, mut error, mut finish) = (None::<Instant>, false, false, None::<String>);
        // With a stamping simulator: when the previous content chunk left the replica.
        let mut last_sent_ns = None::<u64>;
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
                    let sent_ns = stamp(d, b"\"sim_t_ns\":");
                    match last {
                        None => {
                            rec.ttft_ms = Some((now - start).as_secs_f64() * 1000.0);
                            if let (Some(t), Some(rx)) = (sent_ns, stamp(d, b"\"sim_rx_ns\":")) {
                                rec.engine_ttft_ms = Some(t.saturating_sub(rx) as f64 / 1e6);
                                rec.path_in_ms = Some(rx.saturating_sub(sent_unix_ns) as f64 / 1e6);
                            }
                        }
                        Some(prev) => {
                            let g = (now - prev).as_micros() as u64;
                            gaps.client.push(g);
                            if let (Some(t), Some(p)) = (sent_ns, last_sent_ns) {
                                let eg = t.saturating_sub(p) / 1000;
                                gaps.engine.push(eg);
                                gaps.path.push(g.saturating_sub(eg));
                            }
                            rec.gaps += 1;
                            if itl_target_us.is_some_and(|t| g > t) {
                                rec.itl_over += 1;
                            }
                            let ms = g as f64 / 1000.0;
                            rec.itl_max_ms = Some(rec.itl_max_ms.map_or(ms, |m: f64| m.max(ms)));
                        }
                    }
                    last = Some(now);
                    last_sent_ns = sent_ns;
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
