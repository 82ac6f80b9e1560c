//! Running a scenario: open-loop dispatch on a precomputed schedule (or
//! closed-loop workers), each request measured as a client sees it
//! (`loadgen::exchange`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use rand::rngs::StdRng;
use rand::SeedableRng;
use tokio::time::Instant;

use super::body;
use super::exchange::{Ctx, HttpClient};
pub use super::record::{new_hist, Options, RunResult};
use super::record::{pairs, AllGaps, Detail, Record, Shared, TargetGaps};
use super::scenario::{Arrival, Prompt, Scenario};

const MAX_INFLIGHT: usize = 20_000;

/// Run a scenario to the end (its duration, or `max_requests`).
pub async fn run(s: &Scenario, label: &str, progress: bool) -> Result<RunResult, String> {
    run_with(s, label, Options { progress, details: false }).await
}

/// [`run`], with options.
pub async fn run_with(s: &Scenario, label: &str, opts: Options) -> Result<RunResult, String> {
    s.check()?;
    let shared = Arc::new(Shared {
        records: Mutex::new(Vec::new()),
        details: opts.details.then(|| Mutex::new(Vec::new())),
        itl: Mutex::new(AllGaps::default()),
        ttft_recent: Mutex::new(new_hist()),
        sent: AtomicU64::new(0),
        done: AtomicU64::new(0),
        errors: AtomicU64::new(0),
    });
    let t0 = Instant::now();
    let (dispatchers, expected) = dispatch(s, &shared, t0)?;
    let bar = opts.progress.then(|| progress_bar(expected, s.duration));
    let all = futures_join(dispatchers);
    tokio::pin!(all);
    let mut tick = tokio::time::interval(Duration::from_millis(500));
    let mut last_done = 0;
    loop {
        tokio::select! {
            _ = &mut all => break,
            _ = tick.tick() => {
                if let Some(b) = &bar {
                    last_done = show_progress(b, &shared, last_done, expected, t0);
                }
            }
        }
    }
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    Ok(result(s, label, &shared, t0.elapsed().as_secs_f64()))
}

/// The clients a run sends with: HTTP/1.1, and HTTP/2 with windows as a
/// browser's or a gRPC client's (a stream the reader is slow on cannot
/// take the whole connection's window).
fn clients() -> (HttpClient, HttpClient) {
    let mut http = HttpConnector::new();
    http.set_nodelay(true);
    let client: HttpClient = Client::builder(TokioExecutor::new()).pool_max_idle_per_host(4096).build(http.clone());
    let client_h2: HttpClient = Client::builder(TokioExecutor::new())
        .http2_only(true)
        .http2_initial_stream_window_size(1 << 20)
        .http2_initial_connection_window_size(16 << 20)
        .build(http);
    (client, client_h2)
}

/// Each stream's dispatch started (its workers, or its schedule), and how
/// many requests the schedules hold (0 for closed loops only).
fn dispatch(s: &Scenario, shared: &Arc<Shared>, t0: Instant) -> Result<(Vec<tokio::task::JoinHandle<()>>, u64), String> {
    let (client, client_h2) = clients();
    let limit = Arc::new(tokio::sync::Semaphore::new(MAX_INFLIGHT));
    let mut rng = StdRng::seed_from_u64(s.seed);
    let (mut dispatchers, mut expected) = (Vec::new(), 0u64);
    for (i, spec) in s.streams.iter().enumerate() {
        let spec = Arc::new(spec.clone());
        let ctx = Ctx {
            client: if spec.http2 { client_h2.clone() } else { client.clone() },
            bases: Arc::new(s.targets_of(&spec)),
            turn: Arc::new(AtomicU64::new(0)),
            target: s.classes.get(spec.class.as_deref().unwrap_or("")).copied(),
            shared: shared.clone(),
            t0,
            timeout: s.request_timeout,
            ttft: s.ttft,
            form: spec.upload_bytes.map(|n| body::form(&spec.model, n)),
            spec: spec.clone(),
        };
        let seed = s.seed.wrapping_add(i as u64 * 7919);
        match &spec.arrival {
            Arrival::Closed { concurrency, ramp } => {
                let sampler = spec.sampler(seed)?;
                for w in 0..*concurrency {
                    let begin = t0 + ramp.mul_f64(w as f64 / *concurrency as f64);
                    let wseed = s.seed.wrapping_add((i * 100_003 + w) as u64);
                    dispatchers.push(tokio::spawn(worker(ctx.clone(), sampler.clone(), wseed, begin, t0 + s.duration, s.max_requests)));
                }
            }
            arrival => {
                let mut sampler = spec.sampler(seed)?;
                let mut srng = StdRng::seed_from_u64(seed);
                let schedule = arrival.schedule(s.duration, s.max_requests, &mut rng)?;
                expected += schedule.len() as u64;
                let lens: Vec<Prompt> = schedule.iter().map(|_| sampler.sample(&mut srng)).collect();
                let at: Vec<(Duration, Prompt)> = schedule.into_iter().zip(lens).collect();
                dispatchers.push(tokio::spawn(scheduled(ctx, at, limit.clone(), s.max_requests)));
            }
        }
    }
    Ok((dispatchers, expected))
}

/// A closed loop's worker: from `begin`, one request after another until
/// `end` or the run's `max` requests.
async fn worker(ctx: Ctx, mut sampler: super::scenario::PromptSampler, seed: u64, begin: Instant, end: Instant, max: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    tokio::time::sleep_until(begin).await;
    while Instant::now() < end && ctx.shared.sent.fetch_add(1, Ordering::Relaxed) < max {
        ctx.clone().one(sampler.sample(&mut rng)).await;
    }
}

/// An open loop: each request sent at its time whatever is in flight (up
/// to [`MAX_INFLIGHT`]; past it, the client's own overload is recorded).
async fn scheduled(ctx: Ctx, at: Vec<(Duration, Prompt)>, limit: Arc<tokio::sync::Semaphore>, max: u64) {
    let mut inflight = tokio::task::JoinSet::new();
    for (off, p) in at {
        tokio::time::sleep_until(ctx.t0 + off).await;
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
}

fn progress_bar(expected: u64, duration: Duration) -> indicatif::ProgressBar {
    let b = if expected > 0 { indicatif::ProgressBar::new(expected) } else { indicatif::ProgressBar::new(duration.as_secs()) };
    b.set_style(
        indicatif::ProgressStyle::with_template("{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} {msg}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    b
}

/// The bar moved on: requests done (or seconds), the rate, errors, and the
/// TTFT p99 of the last half second. The count done, for the next call.
fn show_progress(b: &indicatif::ProgressBar, shared: &Shared, last_done: u64, expected: u64, t0: Instant) -> u64 {
    let done = shared.done.load(Ordering::Relaxed);
    let rate = (done - last_done) as f64 * 2.0;
    let p99 = {
        let mut h = shared.ttft_recent.lock().unwrap_or_else(|e| e.into_inner());
        let v = h.value_at_quantile(0.99) as f64 / 1000.0;
        h.reset();
        v
    };
    if expected > 0 {
        b.set_position(done)
    } else {
        b.set_position(t0.elapsed().as_secs())
    }
    b.set_message(format!("{rate:.0} req/s  errors {}  TTFT p99 {p99:.0} ms", shared.errors.load(Ordering::Relaxed)));
    done
}

/// What the run recorded, its records (and details) in the order sent.
fn result(s: &Scenario, label: &str, shared: &Shared, elapsed_s: f64) -> RunResult {
    let mut records = std::mem::take(&mut *shared.records.lock().unwrap_or_else(|e| e.into_inner()));
    let mut details: Vec<Detail> =
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
    RunResult {
        scenario: s.clone(),
        label: label.to_string(),
        elapsed_s,
        records,
        itl_us,
        engine_itl_us,
        itl_path_us,
        itl_by_target,
        details,
    }
}

async fn futures_join(handles: Vec<tokio::task::JoinHandle<()>>) {
    for h in handles {
        let _ = h.await;
    }
}
