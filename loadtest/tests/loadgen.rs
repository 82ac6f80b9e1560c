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
        ttft: Default::default(),
        streams: vec![StreamSpec {
            name: "s".into(),
            class: Some("chat".into()),
            api_key: None,
            model: "sim-llama-8b".into(),
            endpoint: Endpoint::Chat,
            stream: true,
            arrival,
            prompt_tokens: Some(LenDist::Fixed { value: prompt }),
            output_tokens: Some(LenDist::Fixed { value: output }),
            dataset: None,
            turns: 1,
            http2: false,
            target: None,
            upload_bytes: None,
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
    let mut s = scenario(&sim.url(), Duration::from_secs(1), Arrival::Constant { rate: 10.0 }, 16, 6);
    // A gap target under the engine's 30 ms step: every gap is over it as the replica sent it.
    s.classes.get_mut("chat").expect("chat's targets").itl_ms = 10.0;
    let r = run(&s, "stamped", false).await.expect("run");
    assert_eq!(r.records.len(), 10);
    for x in &r.records {
        let (client, engine) = (x.ttft_ms.expect("ttft"), x.engine_ttft_ms.expect("stamped chunks give the engine's TTFT"));
        // The engine needs at least one 30 ms step for the first token; the client sees that plus the path.
        assert!(engine >= 29.0 && client >= engine, "client {client:.3} ms, engine {engine:.3} ms");
        // Each gap over the target is counted as the replica sent it (a
        // step apart at least), beside the client's own count.
        assert_eq!(x.engine_itl_over, Some(5), "{x:?}");
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
    assert!(
        !r.records.is_empty()
            && r.records.iter().all(|x| x.engine_ttft_ms.is_none() && x.engine_itl_over.is_none())
            && r.engine_itl_us.is_empty()
    );
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
    let s = scenario(&sim.url(), Duration::from_secs(1), Arrival::Closed { concurrency: 3, ramp: Duration::ZERO }, 16, 8);
    let r = run(&s, "closed", false).await.expect("run");
    assert!(r.records.len() >= 6, "{}", r.records.len());
    assert!(r.records.iter().all(|x| x.outcome == "length"));
    assert!(sim.engine.stats.max_running_seen.load(std::sync::atomic::Ordering::Relaxed) <= 3);
}

/// With a ramp, client i of N sends its first request i/N of the ramp after
/// the start. (Each request outlasts the run, so each client sends one.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_loop_with_a_ramp_starts_its_clients_over_it() {
    let sim = SimServer::start(Profile::Llama8bH100.config(), SocketAddr::from(([127, 0, 0, 1], 0))).await.expect("sim");
    let s = scenario(&sim.url(), Duration::from_millis(500), Arrival::Closed { concurrency: 4, ramp: Duration::from_millis(400) }, 16, 200);
    let r = run(&s, "ramp", false).await.expect("run");
    let mut starts: Vec<f64> = r.records.iter().map(|x| x.start_s).collect();
    starts.sort_by(f64::total_cmp);
    assert_eq!(starts.len(), 4, "{starts:?}");
    for (k, t) in starts.iter().enumerate() {
        assert!(*t >= k as f64 * 0.1, "the first request of client {k} at {t} s: {starts:?}");
    }
    assert!(r.records.iter().all(|x| x.outcome == "length"));
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

/// The keys `vllm bench serve --save-result` writes for a generation run
/// (with `--percentile-metrics ttft,tpot,itl,e2el`), as in vLLM's
/// `benchmarks/serve.py`.
const VLLM_KEYS: &[&str] = &[
    "date",
    "endpoint_type",
    "tokenizer_id",
    "max_output_tokens_per_s",
    "max_concurrent_requests",
    "backend",
    "label",
    "model_id",
    "num_prompts",
    "request_rate",
    "burstiness",
    "max_concurrency",
    "duration",
    "completed",
    "failed",
    "total_input_tokens",
    "total_output_tokens",
    "request_throughput",
    "request_goodput",
    "output_throughput",
    "total_token_throughput",
    "mean_ttft_ms",
    "median_ttft_ms",
    "std_ttft_ms",
    "p99_ttft_ms",
    "mean_tpot_ms",
    "median_tpot_ms",
    "std_tpot_ms",
    "p99_tpot_ms",
    "mean_itl_ms",
    "median_itl_ms",
    "std_itl_ms",
    "p99_itl_ms",
    "mean_e2el_ms",
    "median_e2el_ms",
    "std_e2el_ms",
    "p99_e2el_ms",
];

/// `loadgen run` with a ShareGPT dataset writes vllm bench's summary and
/// per-request lines beside its own result; `loadgen compare` reads them,
/// and a summary vllm bench itself wrote.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vllm_bench_results_are_written_and_compared() {
    let sim = SimServer::start(Profile::Llama8bH100.config(), SocketAddr::from(([127, 0, 0, 1], 0))).await.expect("sim");
    let dir = tempfile::tempdir().expect("tempdir");
    let sharegpt = dir.path().join("sharegpt.json");
    // Two usable conversations (prompts of 40 and 8 characters: 10 and 2
    // tokens; replies of 4 and 12 tokens) and one of a single turn, skipped.
    let conv =
        |q: &str, a: &str| serde_json::json!({"id": "x", "conversations": [{"from": "human", "value": q}, {"from": "gpt", "value": a}]});
    let data = serde_json::json!([conv(&"abcd".repeat(10), &"wxyz".repeat(4)), {"id": "y", "conversations": [{"from": "human", "value": "alone"}]}, conv("abcdefgh", &"wxyz".repeat(12))]);
    std::fs::write(&sharegpt, data.to_string()).expect("write");
    let loadgen = env!("CARGO_BIN_EXE_loadgen");
    let run_cli = |ttft: &'static str, prefix: std::path::PathBuf, out: std::path::PathBuf| {
        let scenario = dir.path().join(format!("{ttft}.yaml"));
        let yaml = format!(
            "target: {}\nduration: 20s\nmax_requests: 6\nstreams:\n  - name: s\n    class: chat\n    model: sim-llama-8b\n    arrival: {{ kind: closed, concurrency: 2 }}\n    dataset: {{ name: sharegpt, path: {} }}\n",
            sim.url(),
            sharegpt.display()
        );
        std::fs::write(&scenario, yaml).expect("write");
        let mut cmd = std::process::Command::new(loadgen);
        cmd.args(["run", "--no-progress", "--ttft", ttft, "--label", ttft])
            .arg(&scenario)
            .arg("--out")
            .arg(&out)
            .arg("--vllm-bench")
            .arg(&prefix);
        if ttft == "first_content" {
            cmd.arg("--save-detailed");
        }
        async move { tokio::task::spawn_blocking(move || cmd.output().expect("loadgen runs")).await.expect("join") }
    };
    let (content, choices) = (dir.path().join("content"), dir.path().join("choices"));
    let out = run_cli("first_content", content.clone(), dir.path().join("content-result.json")).await;
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let out = run_cli("first_choices", choices.clone(), dir.path().join("choices-result.json")).await;
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));

    let read = |p: std::path::PathBuf| std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    for (prefix, definition) in [(&content, "first_content"), (&choices, "first_choices")] {
        let summary: serde_json::Value = serde_json::from_str(&read(prefix.with_extension("json"))).expect("summary JSON");
        for k in VLLM_KEYS {
            assert!(summary.get(*k).is_some(), "{definition}: vllm bench's key `{k}` missing: {summary}");
        }
        assert_eq!(summary["completed"], 6, "{summary}");
        assert_eq!(summary["failed"], 0);
        assert_eq!(summary["ttft_definition"], definition);
        assert_eq!(summary["max_concurrency"], 2);
        let date = summary["date"].as_str().expect("date");
        assert!(
            date.len() == 15 && date.as_bytes()[8] == b'-' && date.chars().filter(char::is_ascii_digit).count() == 14,
            "%Y%m%d-%H%M%S: {date}"
        );
        assert_eq!(summary["max_concurrent_requests"], 2, "a closed loop of 2: {summary}");
        let peak = summary["max_output_tokens_per_s"].as_f64().expect("number");
        // Counted as vllm bench counts them: the first token and one per gap
        // (with first_choices the role chunks are six more).
        assert!((1.0..=54.0).contains(&peak), "at most every token in one second: {summary}");
        let detailed = ["input_lens", "output_lens", "ttfts", "itls", "generated_texts", "errors"];
        if definition == "first_content" {
            for k in detailed {
                assert_eq!(summary[k].as_array().map(Vec::len), Some(6), "--save-detailed writes `{k}` per request: {summary}");
            }
            let outs: u64 = summary["output_lens"].as_array().expect("lens").iter().filter_map(|v| v.as_u64()).sum();
            assert_eq!(outs, 48);
        } else {
            assert!(detailed.iter().all(|k| summary.get(*k).is_none()), "without --save-detailed, no per-request arrays: {summary}");
        }
        // Prompts taken in turn: three of each, 10 and 2 tokens.
        assert_eq!(summary["total_input_tokens"], 36, "{summary}");
        assert_eq!(summary["total_output_tokens"], 48, "replies of 4 and 12 tokens, three each: {summary}");
        let mean_ttft = summary["mean_ttft_ms"].as_f64().expect("number");
        assert!(mean_ttft > 0.0 && summary["p99_ttft_ms"].as_f64().expect("number") >= summary["median_ttft_ms"].as_f64().expect("number"));
        let lines: Vec<serde_json::Value> =
            read(prefix.with_extension("jsonl")).lines().map(|l| serde_json::from_str(l).expect("a JSON line")).collect();
        assert_eq!(lines.len(), 6);
        for l in &lines {
            let (tokens, gaps) = (l["output_tokens"].as_u64().expect("tokens"), l["itl"].as_array().expect("itl list").len() as u64);
            assert!(
                l["success"] == true && l["ttft"].as_f64().is_some_and(|t| t > 0.0) && l["latency"].as_f64() >= l["ttft"].as_f64(),
                "{l}"
            );
            assert!([2, 10].contains(&l["prompt_len"].as_u64().expect("prompt_len")), "{l}");
            if definition == "first_content" {
                assert_eq!(gaps, tokens - 1, "a gap between each two content events: {l}");
            } else {
                assert!(gaps >= tokens, "the role chunk is the first token, every content event a gap: {l}");
            }
        }
    }

    // compare reads vllm bench summaries, loadgen results, and a mix.
    let compare = |a: &std::path::Path, b: &std::path::Path| {
        let out = std::process::Command::new(loadgen).arg("compare").arg(a).arg(b).output().expect("compare runs");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let both = compare(&content.with_extension("json"), &choices.with_extension("json"));
    assert!(both.contains("first_content (A) vs first_choices (B)") && both.contains("| all | TTFT p50 ms |"), "{both}");
    assert!(!both.contains("within SLO"), "a vllm summary has no SLO figures: {both}");
    let mixed = compare(&dir.path().join("content-result.json"), &choices.with_extension("json"));
    assert!(mixed.contains("| all | ITL p99 ms |") && !mixed.contains("| chat |"), "only what both have: {mixed}");
    // A summary as vllm bench writes it (its own keys only, p99 only).
    let theirs = dir.path().join("vllm-bench.json");
    let mut v = serde_json::json!({"backend": "vllm", "label": null, "request_throughput": 4.0, "completed": 100, "failed": 0});
    for m in ["ttft", "tpot", "itl", "e2el"] {
        for s in ["mean", "median", "std", "p99"] {
            v[format!("{s}_{m}_ms")] = 100.0.into();
        }
    }
    std::fs::write(&theirs, v.to_string()).expect("write");
    let vs = compare(&theirs, &content.with_extension("json"));
    assert!(vs.contains("| all | TTFT p50 ms | 100.00 |") && vs.contains("| all | completed req/s | 4.00 |"), "{vs}");
    // Neither form: a clear error.
    std::fs::write(dir.path().join("other.json"), "{\"x\": 1}").expect("write");
    let out = std::process::Command::new(loadgen).arg("compare").arg(dir.path().join("other.json")).arg(&theirs).output().expect("runs");
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("neither a loadgen result nor a vllm bench summary"));
}

/// vllm bench's `random` dataset: lengths uniform in len * [1 - r, 1 + r];
/// a stream names either a dataset or both lengths.
#[test]
fn the_random_dataset_draws_within_its_range_ratio() {
    use loadtest::loadgen::scenario::Dataset;
    let mut s = scenario("http://127.0.0.1:1", Duration::from_secs(1), Arrival::Constant { rate: 1.0 }, 1, 1);
    let spec = &mut s.streams[0];
    assert!(spec.sampler(1).is_ok());
    spec.dataset = Some(Dataset::Random { input_len: 1000, output_len: 100, range_ratio: 0.5 });
    let e = spec.sampler(1).err().expect("both lengths and a dataset");
    assert!(e.contains("leave out prompt_tokens and output_tokens"), "{e}");
    (spec.prompt_tokens, spec.output_tokens) = (None, None);
    let mut sampler = spec.sampler(1).expect("random");
    let mut rng = StdRng::seed_from_u64(3);
    let drawn: Vec<_> = (0..2000).map(|_| sampler.sample(&mut rng)).collect();
    assert!(drawn.iter().all(|p| (500..=1500).contains(&p.prompt_tokens) && (50..=150).contains(&p.output_tokens) && p.text.is_none()));
    let (lo, hi) = (drawn.iter().map(|p| p.prompt_tokens).min(), drawn.iter().map(|p| p.prompt_tokens).max());
    assert!(lo < Some(550) && hi > Some(1450), "the whole range is drawn: {lo:?}..{hi:?}");
    spec.dataset = Some(Dataset::Random { input_len: 1000, output_len: 100, range_ratio: 1.0 });
    assert!(spec.sampler(1).is_err(), "a range ratio of 1 would draw empty prompts");
    spec.dataset = None;
    assert!(spec.sampler(1).err().is_some_and(|e| e.contains("prompt_tokens and output_tokens are required")));
}
