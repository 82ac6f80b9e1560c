//! Active health checks, model discovery and vLLM load scraping, one task
//! per replica. These tasks only write the replica's atomics; the request
//! path reads them and never waits on a check.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use super::conn::get;
use super::{Load, Pool, Replica};
use crate::config::Engine;

/// Run health checks (and, for `auto` pools, model discovery; with
/// `scrape_metrics`, vLLM load scraping) for every replica of `pool` until
/// `stop` changes.
pub(crate) fn spawn(pool: Arc<Pool>, stop: watch::Receiver<bool>) -> Vec<tokio::task::JoinHandle<()>> {
    let mut tasks = Vec::new();
    for r in &pool.replicas {
        let (p, replica, s) = (pool.clone(), r.clone(), stop.clone());
        tasks.push(tokio::spawn(async move { replica_loop(p, replica, s).await }));
        if !pool.config.scrape_metrics.get().is_zero() {
            let (p, replica, s) = (pool.clone(), r.clone(), stop.clone());
            tasks.push(tokio::spawn(async move { load_loop(p, replica, s).await }));
        }
    }
    tasks
}

/// Every `scrape_metrics`: read the replica's waiting queue (for
/// `least_loaded`) and, with learned limits, run one period of its
/// controller. A replica that is not healthy is left alone: its limit
/// keeps what it learned. While nothing is sent to it by any instance of
/// the fleet and nothing waits for the pool, the scrape rests (its
/// readings cannot be acted on) for up to [`SCRAPE_REST`], and the next
/// dispatch here wakes it: it scrapes one period later.
async fn load_loop(pool: Arc<Pool>, replica: Arc<Replica>, mut stop: watch::Receiver<bool>) {
    let mut interval = tokio::time::interval(pool.config.scrape_metrics.get());
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let timeout = pool.config.health.timeout.get().min(pool.config.scrape_metrics.get() * 4);
    let most = SCRAPE_REST.max(pool.config.scrape_metrics.get());
    loop {
        tokio::select! {
            _ = interval.tick() => {}
            _ = stop.changed() => return,
        }
        let seen = replica.readings.scrape.pokes();
        if replica.is_passing() {
            let load = scrape_load(&replica, pool.config.engine, timeout).await;
            if pool.learns_limits() {
                replica.control(&pool.config.name, load, pool.fleet_waiting() > 0);
            }
        }
        let unused = || replica.unused() && pool.fleet_waiting() == 0;
        tokio::select! {
            rested = replica.readings.scrape.rest(seen, most, unused) => if rested {
                // One period after the wake, not at it: the dispatch that woke
                // it is taking a kept-alive connection of the replica's now,
                // and a scrape at once would race it for one.
                interval.reset();
            },
            _ = stop.changed() => return,
        }
    }
}

/// The longest a replica's load scrape rests while nothing is sent to it:
/// its readings (the queue other clients make, its cache's size) are at
/// most this old when a request comes.
const SCRAPE_REST: Duration = Duration::from_secs(5);

async fn replica_loop(pool: Arc<Pool>, replica: Arc<Replica>, mut stop: watch::Receiver<bool>) {
    let h = pool.config.health.clone();
    let mut interval = tokio::time::interval(h.interval.get());
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut streak_ok = 0u32;
    let mut streak_bad = 0u32;
    let mut known = false;
    // What this loop last decided (its traffic may have taken it out since).
    let mut set = false;
    let mut tick = 0u64;
    // Whether `/props` was asked since llama.cpp's metric names were seen.
    let mut asked_seen = false;
    loop {
        tokio::select! {
            _ = interval.tick() => {}
            _ = stop.changed() => return,
        }
        replica.conn.sweep_idle();
        // Why a check failed, for the log line that takes the replica out
        // and for the status page.
        let mut failure = check(&pool, &replica, &h).await;
        // A replica delivering tokens is alive: a health check that fails
        // under its load (a slow /health) does not take it out; one idle
        // and failing does.
        let streaming = failure.is_some() && replica.is_passing() && replica.delivered_within(h.interval.get() * (h.unhealthy_after + 1));
        if streaming {
            failure = failure.map(|f| format!("{f}; kept in: it delivers tokens"));
        }
        replica.set_health_error(failure.clone());
        let ok = failure.is_none() || streaming;
        let was = replica.is_passing();
        if known && was != set {
            // Taken out by its traffic since the last check: the checks
            // that bring it back start counting now.
            (streak_ok, streak_bad) = (0, 0);
        }
        if ok {
            streak_ok += 1;
            streak_bad = 0;
        } else {
            streak_bad += 1;
            streak_ok = 0;
        }
        // Before the first verdict routes requests here, so the first of
        // them already find the limit within the engine's slots.
        let seen = replica.readings.llamacpp.load(std::sync::atomic::Ordering::Relaxed);
        if ok && (!known || tick % 15 == 0 || (seen && !asked_seen)) {
            asked_seen |= seen;
            read_slots(&pool, &replica, seen, h.timeout.get()).await;
        }
        // The first check decides at once; after that the thresholds apply.
        let now = if !known {
            ok
        } else if was {
            streak_bad < h.unhealthy_after
        } else {
            streak_ok >= h.healthy_after
        };
        if !known || now != was {
            replica.set_healthy(now);
            judged(&pool, &replica, known, now, streak_bad, failure.as_deref().unwrap_or(""));
        }
        (known, set) = (true, now);
        // The list routes `auto` pools, and describes named models in `/v1/models`.
        if now && pool.config.api_key_env.is_none() && (tick % 15 == 0 || replica.readings.models.load().is_empty()) {
            discover_models(&replica, h.timeout.get()).await;
        }
        tick += 1;
    }
}

/// The checks changed `replica`'s verdict to `now` (`known`: it had one):
/// say so, keep why for the status page, and route the pool by it.
fn judged(pool: &Pool, replica: &Replica, known: bool, now: bool, failures: u32, reason: &str) {
    let name = &pool.config.name;
    if now {
        if known {
            tracing::info!(pool = %name, replica = %replica.url, "replica healthy again");
        }
        replica.health.verdict.changed(if known { "brought back" } else { "in" }, "its health checks pass");
    } else if known {
        tracing::warn!(pool = %name, replica = %replica.url, failures, reason, "replica taken out: failing health checks");
        replica.health.verdict.changed("taken out", &format!("{failures} health checks failed: {reason}"));
    } else {
        tracing::warn!(pool = %name, replica = %replica.url, reason, "replica not healthy at its first check: not used until it passes");
        replica.health.verdict.changed("not in", &format!("its first health check failed: {reason}"));
    }
    pool.judge();
}

/// One health check: why it failed, if it did. With an API key, the check
/// also lists the models (vLLM checks its key on /v1 only), so a wrong key
/// shows here rather than as 401s to callers; the list doubles as discovery.
async fn check(pool: &Pool, replica: &Arc<Replica>, h: &crate::config::HealthConfig) -> Option<String> {
    let mut failure = match get(replica, &h.path, h.timeout.get()).await {
        Ok((status, _)) if status.is_success() => None,
        Ok((status, _)) => Some(format!("{} answered {status}", h.path)),
        Err(e) => Some(e),
    };
    if failure.is_none() {
        if let Some(var) = &pool.config.api_key_env {
            match get(replica, "/v1/models", h.timeout.get()).await {
                Ok((status, _)) if status == http::StatusCode::UNAUTHORIZED || status == http::StatusCode::FORBIDDEN => {
                    failure = Some(format!("/v1/models answered {status}: the replica refused the key in {var}"));
                }
                Ok((status, body)) if status.is_success() => store_models(replica, &body),
                // Anything else is the health path's to judge.
                _ => {}
            }
        }
    }
    failure
}

async fn discover_models(replica: &Arc<Replica>, timeout: Duration) {
    let Ok((status, body)) = get(replica, "/v1/models", timeout).await else { return };
    if status.is_success() {
        store_models(replica, &body);
    }
}

/// Keep the models a `/v1/models` answer lists.
fn store_models(replica: &Replica, body: &[u8]) {
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(body) else { return };
    if let Some(list) = v.get("data").and_then(|d| d.as_array()) {
        replica.readings.models.store(Arc::new(list.clone()));
    }
}

/// Where the engine says how many requests it runs at once (llama.cpp's
/// server, named so or seen by its metric names in an `auto` pool): its
/// `/props` `total_slots` (`--parallel`), read at the first check and
/// every 15th after (a restarted server may have other slots), and once
/// more at the next check after its metric names are first seen. A
/// replica that does not answer it is left as it was. `seen`: its metric
/// names were llama.cpp's.
async fn read_slots(pool: &Pool, replica: &Arc<Replica>, seen: bool, timeout: Duration) {
    let asks = match pool.config.engine {
        Engine::Llamacpp => true,
        Engine::Auto => seen,
        _ => false,
    };
    if !asks {
        return;
    }
    let Ok((status, body)) = get(replica, "/props", timeout).await else { return };
    if let Some(n) = status.is_success().then(|| total_slots(&body)).flatten() {
        replica.declare_slots(n, pool.learns_limits(), &pool.config.name);
    }
}

/// `total_slots` of a llama.cpp server's `/props` answer, when it is a count.
fn total_slots(body: &[u8]) -> Option<usize> {
    let v: serde_json::Value = serde_json::from_slice(body).ok()?;
    v.get("total_slots")?.as_u64().filter(|&n| n > 0).and_then(|n| usize::try_from(n).ok())
}

/// llama.cpp's server's queue names: it waits only while every slot is busy.
const LLAMACPP: (&str, &str) = ("llamacpp:requests_deferred", "llamacpp:requests_processing");

/// The metric names an engine reports its queue under: (waiting, running).
fn queue_metrics(engine: Engine) -> &'static [(&'static str, &'static str)] {
    const VLLM: (&str, &str) = ("vllm:num_requests_waiting", "vllm:num_requests_running");
    const SGLANG: (&str, &str) = ("sglang:num_queue_reqs", "sglang:num_running_reqs");
    const TGI: (&str, &str) = ("tgi_queue_size", "tgi_batch_current_size");
    match engine {
        Engine::Auto => &[VLLM, SGLANG, LLAMACPP, TGI],
        Engine::Vllm => &[VLLM],
        Engine::Sglang => &[SGLANG],
        Engine::Llamacpp => &[LLAMACPP],
        Engine::Tgi => &[TGI],
        Engine::Ollama => &[],
    }
}

/// Read the replica's waiting and running requests from its `/metrics`
/// (each summed over its series, under its engine's names: the first of
/// them it exports) so least-loaded sees the replica's own queue; `None`
/// for one the replica does not export (or when it did not answer).
/// Ollama has no metrics endpoint: not asked.
async fn scrape_load(replica: &Arc<Replica>, engine: Engine, timeout: Duration) -> Load {
    let names = queue_metrics(engine);
    if names.is_empty() {
        return Load::default();
    }
    let Ok((status, body)) = get(replica, "/metrics", timeout).await else {
        replica.set_scraped_total(None);
        return Load::default();
    };
    if !status.is_success() {
        replica.set_scraped_total(None);
        return Load::default();
    }
    let (load, cache_tokens) = read_metrics(&body, engine);
    if let Some(tokens) = cache_tokens {
        replica.readings.cache_tokens.store(tokens, std::sync::atomic::Ordering::Relaxed);
    }
    if let Some(w) = load.waiting {
        replica.readings.scraped_waiting.store(w as u64, std::sync::atomic::Ordering::Relaxed);
    }
    if let Some(r) = load.running {
        replica.readings.saw_running(r);
    }
    replica.set_scraped_total(load.waiting.zip(load.running).map(|(w, r)| w + r));
    if load.waits_only_when_full {
        replica.readings.llamacpp.store(true, std::sync::atomic::Ordering::Relaxed);
    }
    load
}

/// What a replica's metrics text says, read in one pass over its lines
/// (as bytes: only the values read are checked as text): its load, under
/// the first pair of its engine's queue names whose waiting metric it has
/// (each summed over its series); and the tokens its KV cache holds, where
/// its metrics say: vLLM's `vllm:cache_config_info` (`num_gpu_blocks` x
/// `block_size`, summed over its engines), SGLang's
/// `sglang:max_total_num_tokens`. Prefix-aware routing sizes what it
/// believes a replica holds by the latter.
fn read_metrics(text: &[u8], engine: Engine) -> (Load, Option<u64>) {
    let names = queue_metrics(engine);
    let (vllm, sglang) = match engine {
        Engine::Auto => (true, true),
        Engine::Vllm => (true, false),
        Engine::Sglang => (false, true),
        _ => (false, false),
    };
    let add = |sum: &mut Option<f64>, v: Option<f64>| {
        if let Some(v) = v {
            *sum = Some(sum.unwrap_or(0.0) + v);
        }
    };
    // Per pair of names: (waiting, running).
    let mut sums = vec![(None, None); names.len()];
    let (mut vllm_cache, mut sglang_cache): (Option<u64>, Option<u64>) = (None, None);
    let mut rest = text;
    while !rest.is_empty() {
        let (line, next) = memchr::memchr(b'\n', rest).map_or((rest, &[][..]), |i| (&rest[..i], &rest[i + 1..]));
        rest = next;
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.first() == Some(&b'#') {
            continue;
        }
        let Some(name) = memchr::memchr2(b'{', b' ', line).map(|end| &line[..end]) else { continue };
        let value = || std::str::from_utf8(line.rsplit(|b| *b == b' ').next()?).ok()?.parse::<f64>().ok();
        if let Some(i) = names.iter().position(|(w, _)| w.as_bytes() == name) {
            add(&mut sums[i].0, value());
        } else if let Some(i) = names.iter().position(|(_, r)| r.as_bytes() == name) {
            add(&mut sums[i].1, value());
        } else if vllm && name == b"vllm:cache_config_info" {
            let line = String::from_utf8_lossy(line);
            if let (Some(blocks), Some(size)) = (label(&line, "num_gpu_blocks"), label(&line, "block_size")) {
                vllm_cache = Some(vllm_cache.unwrap_or(0) + blocks * size);
            }
        } else if sglang && name == b"sglang:max_total_num_tokens" {
            if let Some(v) = value() {
                sglang_cache = Some(sglang_cache.unwrap_or(0) + v.max(0.0) as u64);
            }
        }
    }
    let load = sums
        .iter()
        .zip(names)
        .find_map(|((w, r), (name, _))| {
            w.map(|w| Load { waiting: Some(w.max(0.0)), running: r.map(|r| r.max(0.0)), waits_only_when_full: *name == LLAMACPP.0 })
        })
        .unwrap_or_default();
    (load, vllm_cache.or(sglang_cache).filter(|t| *t > 0))
}

/// The value of label `name` in a series' line, as a number.
fn label(line: &str, name: &str) -> Option<u64> {
    let labels = line.split_once('{')?.1.rsplit_once('}')?.0;
    labels.split("\",").find_map(|kv| kv.strip_prefix(name)?.strip_prefix("=\"")).and_then(|v| v.trim_end_matches('"').parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::PoolConfig;
    use crate::upstream::Access;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    /// The replica at `url`, as a pool holds it.
    fn replica(url: &str) -> Arc<Replica> {
        let cfg = PoolConfig { replicas: vec![url.into()], ..PoolConfig::default() };
        let access = Access::new(&cfg).expect("access");
        let pool = Pool::new(cfg, access, None);
        pool.replicas[0].clone()
    }

    /// Each engine's queue, under its own names; `auto` finds whichever a
    /// replica exports; Ollama is never asked.
    #[test]
    fn each_engines_queue_is_read_under_its_own_names() {
        let texts = [
            (Engine::Vllm, "vllm:num_requests_waiting{model_name=\"m\"} 3.0\nvllm:num_requests_running{model_name=\"m\"} 5.0\n"),
            (Engine::Sglang, "# TYPE sglang:num_queue_reqs gauge\nsglang:num_queue_reqs{model_name=\"m\"} 3.0\nsglang:num_running_reqs{model_name=\"m\"} 5.0\n"),
            (Engine::Llamacpp, "# HELP llamacpp:requests_processing Number of requests processing.\nllamacpp:requests_processing 5\nllamacpp:requests_deferred 3\n"),
            (Engine::Tgi, "tgi_queue_size 3\ntgi_batch_current_size 5\n"),
        ];
        for (engine, text) in texts {
            let want = (Some(3.0), Some(5.0));
            let got = read_metrics(text.as_bytes(), engine).0;
            assert_eq!((got.waiting, got.running), want, "{engine:?}");
            // Only llama.cpp's server waits only while every slot is busy.
            assert_eq!(got.waits_only_when_full, engine == Engine::Llamacpp, "{engine:?}");
            let got = read_metrics(text.as_bytes(), Engine::Auto).0;
            assert_eq!((got.waiting, got.running), want, "auto on {engine:?}");
            assert_eq!(got.waits_only_when_full, engine == Engine::Llamacpp, "auto on {engine:?}");
            // Another engine's names find nothing in it.
            let other = if engine == Engine::Vllm { Engine::Tgi } else { Engine::Vllm };
            assert_eq!(read_metrics(text.as_bytes(), other).0.waiting, None, "{other:?} names in {engine:?}'s text");
        }
        assert!(queue_metrics(Engine::Ollama).is_empty());
    }

    /// The KV cache's size, where an engine says it: vLLM's info series
    /// (its look-alike labels not taken for it), SGLang's gauge.
    #[test]
    fn a_replicas_cache_size_is_read_from_its_engines_series() {
        let vllm = "# TYPE vllm:cache_config_info gauge\nvllm:cache_config_info{block_size=\"16\",cache_dtype=\"auto\",mamba_block_size=\"32\",num_gpu_blocks=\"573\",num_gpu_blocks_override=\"None\"} 1.0\n";
        assert_eq!(read_metrics(vllm.as_bytes(), Engine::Vllm).1, Some(573 * 16));
        assert_eq!(read_metrics(vllm.as_bytes(), Engine::Auto).1, Some(573 * 16));
        assert_eq!(read_metrics(vllm.as_bytes(), Engine::Sglang).1, None);
        // Two engines (data parallel): both caches.
        let two = "vllm:cache_config_info{engine=\"0\",num_gpu_blocks=\"100\",block_size=\"16\"} 1\nvllm:cache_config_info{engine=\"1\",num_gpu_blocks=\"100\",block_size=\"16\"} 1\n";
        assert_eq!(read_metrics(two.as_bytes(), Engine::Vllm).1, Some(3200));
        // Without the counts (an older vLLM, or a label vLLM writes as "None"): unknown.
        assert_eq!(read_metrics(b"vllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"None\"} 1\n", Engine::Vllm).1, None);
        let sglang = "sglang:max_total_num_tokens{model_name=\"m\"} 420000.0\n";
        assert_eq!(read_metrics(sglang.as_bytes(), Engine::Sglang).1, Some(420_000));
        assert_eq!(read_metrics(sglang.as_bytes(), Engine::Llamacpp).1, None);
    }

    /// A whole vLLM text, as its /metrics has it (help and type lines,
    /// histograms, two engines): the queue and the cache in one reading.
    #[test]
    fn a_vllm_text_gives_its_queue_and_cache_in_one_reading() {
        let text = "# HELP vllm:num_requests_running Number of requests in model execution batches.\n\
            # TYPE vllm:num_requests_running gauge\n\
            vllm:num_requests_running{engine=\"0\",model_name=\"m\"} 4.0\n\
            vllm:num_requests_running{engine=\"1\",model_name=\"m\"} 3.0\n\
            vllm:num_requests_waiting_by_reason{engine=\"0\",reason=\"capacity\"} 9.0\n\
            vllm:num_requests_waiting{engine=\"0\",model_name=\"m\"} 2.0\n\
            vllm:num_requests_waiting{engine=\"1\",model_name=\"m\"} -1.0\n\
            vllm:time_to_first_token_seconds_bucket{engine=\"0\",le=\"0.001\",model_name=\"m\"} 0.0\n\
            vllm:cache_config_info{block_size=\"16\",engine=\"0\",num_gpu_blocks=\"100\"} 1.0\n\
            vllm:cache_config_info{block_size=\"16\",engine=\"1\",num_gpu_blocks=\"50\"} 1.0\n";
        for (engine, text) in
            [(Engine::Vllm, text.to_string()), (Engine::Auto, text.to_string()), (Engine::Vllm, text.replace('\n', "\r\n"))]
        {
            let (load, cache) = read_metrics(text.as_bytes(), engine);
            // Summed over both engines; a look-alike name is not the queue.
            assert_eq!((load.waiting, load.running, cache), (Some(1.0), Some(7.0), Some(2400)), "{engine:?}: {text}");
        }
        let (load, cache) = read_metrics(text.as_bytes(), Engine::Sglang);
        assert_eq!((load.waiting, load.running, cache), (None, None, None), "SGLang's names find nothing");
    }

    /// Where the engine orders its queue by priority, an interactive request
    /// waits for a slot only where the replica runs (nearly) all it was ever
    /// seen running: below that, a KV-bound engine runs the prompt at once and
    /// it waits for prefill, which a preempted batch stream does not give.
    #[test]
    fn a_request_waits_for_a_slot_where_requests_wait_and_under_priority_every_slot_runs() {
        let r = replica("http://127.0.0.1:1");
        // A scrape as `scrape_load` reads it: 3 waiting beside `running`.
        let scraped = |running: f64| {
            r.readings.set_scraped_total(Some(running + 3.0));
            r.readings.saw_running(running);
        };
        assert!(!r.waits_for_a_slot(false) && !r.waits_for_a_slot(true), "nothing waits inside it");
        r.readings.scraped_waiting.store(3, std::sync::atomic::Ordering::Relaxed);
        assert!(r.waits_for_a_slot(true), "requests wait, and its metrics never said what it runs");
        scraped(64.0);
        assert!(r.waits_for_a_slot(false) && r.waits_for_a_slot(true), "all 64 run and 3 wait");
        // Its cache, not its slots, bounds it now: 55 run, 3 wait.
        scraped(55.0);
        assert!(r.waits_for_a_slot(false), "first come, first served: it waits behind them");
        assert!(!r.waits_for_a_slot(true), "under priority it is prefilled at once");
        // A slot or four just freed, refilled at the next steps: still its slots.
        scraped(60.0);
        assert!(r.waits_for_a_slot(true));
        scraped(59.0);
        assert!(!r.waits_for_a_slot(true));
    }

    /// The last scrape may be a period older than the request: where this
    /// gateway (with the fleet's other instances, as last heard) has more
    /// requests on a replica than it was ever seen running, one of them
    /// waits inside it for a slot, whatever that scrape said of its queue.
    #[test]
    fn a_request_waits_for_a_slot_where_the_gateway_sends_past_the_most_seen_running() {
        use std::sync::atomic::Ordering::Relaxed;
        let r = replica("http://127.0.0.1:1");
        r.readings.set_scraped_total(Some(64.0));
        r.seats.inflight.store(65, Relaxed);
        assert!(!r.waits_for_a_slot(false), "no scrape said what it runs: its slots are unknown");
        r.readings.saw_running(64.0);
        r.seats.inflight.store(64, Relaxed);
        assert!(!r.waits_for_a_slot(false) && !r.waits_for_a_slot(true), "64 sent, 64 run, none waits");
        r.seats.inflight.store(65, Relaxed);
        assert!(r.waits_for_a_slot(false) && r.waits_for_a_slot(true), "the 65th waits, before any scrape saw it");
        // Its cache bounds it now (the last scrape saw 55 run): under
        // priority the request is prefilled at once.
        r.readings.set_scraped_total(Some(55.0));
        assert!(r.waits_for_a_slot(false) && !r.waits_for_a_slot(true));
        // One of a fleet: 30 of its own and 35 of the others' as last heard.
        r.readings.set_scraped_total(Some(64.0));
        r.seats.inflight.store(30, Relaxed);
        r.seats.set_fleet_share(Some((32, 34)));
        assert!(!r.waits_for_a_slot(false), "64 sent by the fleet, none waits");
        r.seats.set_fleet_share(Some((32, 35)));
        assert!(r.waits_for_a_slot(false) && r.waits_for_a_slot(true), "the fleet's 65th waits, though this instance holds 30");
    }

    /// A failed check says why, for the log line that takes the replica out.
    #[tokio::test]
    async fn a_failed_check_says_why() {
        // Nothing listens: refused.
        let port = TcpListener::bind("127.0.0.1:0").await.expect("bind").local_addr().expect("addr").port();
        let refused = get(&replica(&format!("http://127.0.0.1:{port}")), "/health", Duration::from_secs(5)).await.expect_err("refused");
        assert!(refused.starts_with("GET /health: ") && refused.contains("connect"), "{refused}");

        // A listener that accepts and never answers: the check's timeout.
        let silent = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!("http://{}", silent.local_addr().expect("addr"));
        let hold = tokio::spawn(async move {
            let (_s, _) = silent.accept().await.expect("accept");
            std::future::pending::<()>().await
        });
        let slow = get(&replica(&url), "/health", Duration::from_millis(200)).await.expect_err("no answer");
        assert_eq!(slow, "GET /health: no answer within 200ms");
        hold.abort();

        // An answer with a status: the status, for the caller to judge.
        let busy = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!("http://{}", busy.local_addr().expect("addr"));
        tokio::spawn(async move {
            let (mut s, _) = busy.accept().await.expect("accept");
            let mut buf = [0u8; 1024];
            let _ = s.read(&mut buf).await;
            let _ = s.write_all(b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 4\r\n\r\nbusy").await;
        });
        let (status, body) = get(&replica(&url), "/health", Duration::from_secs(5)).await.expect("an answer");
        assert_eq!((status.as_u16(), &body[..]), (503, &b"busy"[..]));
    }

    #[test]
    fn llama_cpps_props_give_its_slots_and_nothing_else_does() {
        assert_eq!(total_slots(br#"{"total_slots":8,"model_alias":"m","endpoint_slots":true}"#), Some(8));
        for body in
            [&br#"{"total_slots":0}"#[..], br#"{"total_slots":-1}"#, br#"{"total_slots":"8"}"#, br#"{"detail":"Not Found"}"#, b"not json"]
        {
            assert_eq!(total_slots(body), None, "{}", String::from_utf8_lossy(body));
        }
    }
}
