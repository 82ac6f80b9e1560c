//! The load generator: schedules, loopback-only targets, and client-side
//! measurements that agree with the simulator's own.

use std::net::SocketAddr;
use std::time::Duration;

use loadtest::loadgen::scenario::{Arrival, Endpoint, LenDist, Stage, StreamSpec};
use loadtest::loadgen::{report, run, Scenario};
use loadtest::sim::{Profile, SimServer};
use rand::rngs::StdRng;
use rand::SeedableRng;

fn scenario(target: &str, duration: Duration, arrival: Arrival, prompt: u32, output: u32) -> Scenario {
    Scenario {
        target: target.into(),
        duration,
        max_requests: 1_000_000,
        seed: 7,
        warmup: Duration::ZERO,
        request_timeout: Duration::from_secs(30),
        classes: loadtest::loadgen::scenario::default_targets(),
        streams: vec![StreamSpec {
            name: "s".into(),
            class: Some("chat".into()),
            api_key: None,
            model: "sim-llama-8b".into(),
            endpoint: Endpoint::Chat,
            stream: true,
            arrival,
            prompt_tokens: LenDist::Fixed { value: prompt },
            output_tokens: LenDist::Fixed { value: output },
            turns: 1,
            target: None,
        }],
    }
}

#[test]
fn schedules_have_the_requested_shape() {
    let mut rng = StdRng::seed_from_u64(1);
    let d = Duration::from_secs(10);
    let constant = Arrival::Constant { rate: 10.0 }.schedule(d, u64::MAX, &mut rng).expect("ok");
    assert_eq!(constant.len(), 100);
    assert_eq!(constant[1] - constant[0], Duration::from_millis(100));
    let poisson = Arrival::Poisson { rate: 100.0 }.schedule(d, u64::MAX, &mut rng).expect("ok");
    assert!((850..=1150).contains(&poisson.len()), "{}", poisson.len());
    assert!(poisson.windows(2).all(|w| w[0] <= w[1]));
    let batch = Arrival::Batch { rate: 2.0, size: LenDist::Fixed { value: 5 } }.schedule(d, u64::MAX, &mut rng).expect("ok");
    assert_eq!(batch.len() % 5, 0);
    assert!(batch.chunks(5).all(|c| c.iter().all(|t| *t == c[0])), "a batch arrives at one instant");
    let ramp = Arrival::Stages { stages: vec![Stage { duration: d, rate: 100.0 }] }.schedule(d, u64::MAX, &mut rng).expect("ok");
    let first_half = ramp.iter().filter(|t| t.as_secs_f64() < 5.0).count();
    assert!(first_half * 2 < ramp.len() - first_half, "a ramp from 0 sends fewer in its first half: {first_half} of {}", ramp.len());
    assert_eq!(Arrival::Poisson { rate: 100.0 }.schedule(d, 10, &mut rng).expect("ok").len(), 10, "bounded by count");
}

#[test]
fn only_loopback_targets_are_accepted() {
    for bad in ["http://10.0.0.1:8080", "http://192.168.1.2", "http://example.com"] {
        assert!(scenario(bad, Duration::from_secs(1), Arrival::Constant { rate: 1.0 }, 1, 1).check().is_err(), "{bad}");
    }
    for ok in ["http://127.0.0.1:1", "http://localhost:2", "http://[::1]:3", "http://127.8.9.10:4"] {
        assert!(scenario(ok, Duration::from_secs(1), Arrival::Constant { rate: 1.0 }, 1, 1).check().is_ok(), "{ok}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_measurements_agree_with_the_simulator() {
    let sim = SimServer::start(Profile::Llama8bH100.config(), SocketAddr::from(([127, 0, 0, 1], 0))).await.expect("sim");
    let s = scenario(&sim.url(), Duration::from_secs(2), Arrival::Constant { rate: 20.0 }, 64, 16);
    let r = run(&s, "agree", false).await.expect("run");
    assert_eq!(r.records.len(), 40);
    for x in &r.records {
        assert_eq!((x.outcome.as_str(), x.tokens, x.gaps), ("length", 16, 15), "{x:?}");
        assert!(x.ttft_ms.is_some());
    }
    let client_ttft: f64 = r.records.iter().filter_map(|x| x.ttft_ms).sum::<f64>() / 40.0;
    let text = sim.metrics.encode();
    let get = |name: &str| -> f64 {
        text.lines().find(|l| l.starts_with(name)).and_then(|l| l.rsplit(' ').next()).and_then(|v| v.parse().ok()).unwrap_or(f64::NAN)
    };
    let sim_ttft = get("vllm:time_to_first_token_seconds_sum") * 1000.0 / get("vllm:time_to_first_token_seconds_count");
    assert_eq!(get("vllm:generation_tokens_total"), 640.0);
    // The client sees the engine's TTFT plus loopback and parsing: never less.
    // (How much more is the overhead benchmark's question; the upper bound
    // here only catches a gross error, such as stamping at the last token.)
    assert!(client_ttft >= sim_ttft && client_ttft < sim_ttft + 1000.0, "client {client_ttft:.2} ms vs simulator {sim_ttft:.2} ms");
    let sums = report::summarize(&r);
    assert_eq!(sums["chat"].completed, 40);
    assert!(report::markdown(&r).contains("| chat | 40 | 40 | 0 | 0 |"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stamped_chunks_split_the_paths_share_from_the_engines() {
    // A slow, steady engine: every step 30 ms, so each gap leaves the replica ~30 ms after the last.
    let mut cfg = Profile::Llama8bH100.config();
    (cfg.step_base_ms, cfg.decode_per_seq_ms, cfg.prefill_per_token_ms, cfg.stamp_events) = (30.0, 0.0, 0.0, true);
    let sim = SimServer::start(cfg, SocketAddr::from(([127, 0, 0, 1], 0))).await.expect("sim");
    let s = scenario(&sim.url(), Duration::from_secs(1), Arrival::Constant { rate: 10.0 }, 16, 6);
    let r = run(&s, "stamped", false).await.expect("run");
    assert_eq!(r.records.len(), 10);
    for x in &r.records {
        let (client, engine) = (x.ttft_ms.expect("ttft"), x.engine_ttft_ms.expect("stamped chunks give the engine's TTFT"));
        // The engine needs at least one 30 ms step for the first token; the client sees that plus the path.
        assert!(engine >= 29.0 && client >= engine, "client {client:.3} ms, engine {engine:.3} ms");
    }
    let engine = r.engine_itl_us.get("chat").expect("engine gaps recorded");
    let path = r.itl_path_us.get("chat").expect("path share recorded");
    assert_eq!(engine.iter().map(|(_, c)| c).sum::<u64>(), 50, "5 gaps in each of 10 streams");
    assert_eq!(path.iter().map(|(_, c)| c).sum::<u64>(), 50);
    // A step lasts at least its 30 ms (less 5 ms for the histogram's
    // resolution); how much later a loaded machine runs it is not bounded here.
    assert!(!engine.is_empty() && engine.iter().all(|(v, _)| *v >= 25_000), "engine gaps are steps: {engine:?}");
    // The saved result reads back with the new fields.
    let back: loadtest::loadgen::RunResult = serde_json::from_str(&serde_json::to_string(&r).expect("json")).expect("parses");
    assert_eq!(back.itl_path_us, r.itl_path_us);

    // Without stamping, chunks are exactly vLLM's: no extra fields.
    let plain = SimServer::start(Profile::Llama8bH100.config(), SocketAddr::from(([127, 0, 0, 1], 0))).await.expect("sim");
    let r = run(&scenario(&plain.url(), Duration::from_millis(300), Arrival::Constant { rate: 10.0 }, 16, 4), "plain", false)
        .await
        .expect("run");
    assert!(!r.records.is_empty() && r.records.iter().all(|x| x.engine_ttft_ms.is_none()) && r.engine_itl_us.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_with_its_own_target_sends_there() {
    let a = SimServer::start(Profile::Llama8bH100.config(), SocketAddr::from(([127, 0, 0, 1], 0))).await.expect("sim");
    let b = SimServer::start(Profile::Llama8bH100.config(), SocketAddr::from(([127, 0, 0, 1], 0))).await.expect("sim");
    let mut s = scenario(&a.url(), Duration::from_millis(500), Arrival::Constant { rate: 10.0 }, 16, 2);
    let mut other = s.streams[0].clone();
    (other.name, other.class, other.target) = ("other".into(), Some("batch".into()), Some(b.url()));
    s.streams.push(other);
    let r = run(&s, "two targets", false).await.expect("run");
    assert_eq!(r.records.len(), 10);
    assert!(r.records.iter().all(|x| x.outcome == "length"));
    let tokens = |sim: &SimServer| sim.metrics.encode().lines().find(|l| l.starts_with("vllm:generation_tokens_total")).map(str::to_string);
    // Each replica served exactly its own stream's five requests of two tokens.
    assert!(tokens(&a).is_some_and(|l| l.ends_with(" 10")), "{:?}", tokens(&a));
    assert!(tokens(&b).is_some_and(|l| l.ends_with(" 10")), "{:?}", tokens(&b));
    // A stream's own target is held to loopback too.
    s.streams[1].target = Some("http://10.1.2.3:80".into());
    assert!(s.check().is_err());
    s.streams[1].target = Some(" , ".into());
    assert!(s.check().is_err(), "an empty list is refused");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_with_two_targets_takes_them_in_turn_and_says_which() {
    let a = SimServer::start(Profile::Llama8bH100.config(), SocketAddr::from(([127, 0, 0, 1], 0))).await.expect("sim");
    let b = SimServer::start(Profile::Llama8bH100.config(), SocketAddr::from(([127, 0, 0, 1], 0))).await.expect("sim");
    let s = scenario(&format!("{},{}", a.url(), b.url()), Duration::from_millis(600), Arrival::Constant { rate: 10.0 }, 16, 2);
    let r = run(&s, "interleaved", false).await.expect("run");
    assert_eq!(r.records.len(), 6);
    let to = |i| r.records.iter().filter(|x| x.target == Some(i)).count();
    assert_eq!((to(0), to(1)), (3, 3), "{:?}", r.records.iter().map(|x| x.target).collect::<Vec<_>>());
    // Each target's gaps are kept apart too: three requests of two tokens, one gap each.
    let gaps = |i: &str| r.itl_by_target.client_us.get(i).map(|h| h.iter().map(|(_, c)| c).sum::<u64>());
    assert_eq!((gaps("0"), gaps("1")), (Some(3), Some(3)));
    let tokens = |sim: &SimServer| sim.metrics.encode().lines().find(|l| l.starts_with("vllm:generation_tokens_total")).map(str::to_string);
    assert!(tokens(&a).is_some_and(|l| l.ends_with(" 6")), "{:?}", tokens(&a));
    assert!(tokens(&b).is_some_and(|l| l.ends_with(" 6")), "{:?}", tokens(&b));
    // One target: nothing to say.
    let one =
        run(&scenario(&a.url(), Duration::from_millis(200), Arrival::Constant { rate: 10.0 }, 16, 2), "one", false).await.expect("run");
    assert!(!one.records.is_empty() && one.records.iter().all(|x| x.target.is_none()) && one.itl_by_target.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closed_loop_keeps_its_concurrency() {
    let sim = SimServer::start(Profile::Llama8bH100.config(), SocketAddr::from(([127, 0, 0, 1], 0))).await.expect("sim");
    let s = scenario(&sim.url(), Duration::from_secs(1), Arrival::Closed { concurrency: 3 }, 16, 8);
    let r = run(&s, "closed", false).await.expect("run");
    assert!(r.records.len() >= 6, "{}", r.records.len());
    assert!(r.records.iter().all(|x| x.outcome == "length"));
    assert!(sim.engine.stats.max_running_seen.load(std::sync::atomic::Ordering::Relaxed) <= 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_errors_and_cut_streams_are_classified() {
    let mut cfg = Profile::Llama8bH100.config();
    cfg.faults.cut_rate = 1.0;
    let sim = SimServer::start(cfg, SocketAddr::from(([127, 0, 0, 1], 0))).await.expect("sim");
    let r =
        run(&scenario(&sim.url(), Duration::from_millis(500), Arrival::Constant { rate: 10.0 }, 16, 8), "cut", false).await.expect("run");
    assert!(
        !r.records.is_empty() && r.records.iter().all(|x| x.outcome == "cut"),
        "{:?}",
        r.records.iter().map(|x| &x.outcome).collect::<Vec<_>>()
    );
    sim.set_faults(loadtest::sim::FaultConfig { error_rate: 1.0, ..Default::default() });
    let r = run(&scenario(&sim.url(), Duration::from_millis(500), Arrival::Constant { rate: 10.0 }, 16, 8), "errors", false)
        .await
        .expect("run");
    assert!(!r.records.is_empty() && r.records.iter().all(|x| x.outcome == "http_500" || x.outcome == "http_503"));
}

#[test]
fn a_mix_draws_each_part_in_proportion_to_its_weight() {
    let d: LenDist = serde_norway::from_str(
        "{dist: mix, parts: [{weight: 19, len: {dist: fixed, value: 512}}, {weight: 1, len: {dist: uniform, min: 4000, max: 4096}}]}",
    )
    .expect("a mix parses");
    let mut s = d.sampler().expect("valid mix");
    let mut rng = StdRng::seed_from_u64(3);
    let draws: Vec<u32> = (0..20_000).map(|_| s.sample(&mut rng)).collect();
    let long = draws.iter().filter(|&&n| (4000..=4096).contains(&n)).count();
    assert_eq!(draws.iter().filter(|&&n| n == 512).count() + long, draws.len(), "every draw comes from one of the parts");
    let share = long as f64 / draws.len() as f64;
    assert!((0.04..0.06).contains(&share), "the 1-in-20 part drew {share}");

    for bad in [
        "{dist: mix, parts: []}",
        "{dist: mix, parts: [{weight: 0, len: {dist: fixed, value: 1}}]}",
        "{dist: mix, parts: [{weight: -1, len: {dist: fixed, value: 1}}]}",
        "{dist: mix, parts: [{weight: 1, len: {dist: uniform, min: 9, max: 1}}]}",
    ] {
        let d: LenDist = serde_norway::from_str(bad).expect("parses");
        assert!(d.sampler().is_err(), "{bad} is refused");
    }
}
