//! Scheduling invariants of the simulated engine, on paused tokio time.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use loadtest::sim::engine::{Engine, Event, Faults, Finish, SeqRequest};
use loadtest::sim::metrics::SimMetrics;
use loadtest::sim::SimConfig;
use tokio::sync::mpsc::UnboundedReceiver;
use tokio::time::Instant;

fn cfg() -> SimConfig {
    SimConfig {
        step_base_ms: 10.0,
        decode_per_seq_ms: 1.0,
        prefill_per_token_ms: 0.1,
        max_num_seqs: 8,
        max_num_batched_tokens: 512,
        kv_blocks: 10_000,
        block_size: 16,
        ..SimConfig::default()
    }
}

fn start(c: SimConfig) -> Engine {
    let m = Arc::new(SimMetrics::new(&c.model, c.kv_blocks, c.block_size));
    Engine::start(Arc::new(c.clone()), m, Arc::new(Faults::new(c.faults))).0
}

fn req(prompt: u32, out: u32) -> SeqRequest {
    SeqRequest::new(prompt, out)
}

/// Times (since `t0`) of each token of one sequence, and its finish.
async fn drain(mut rx: UnboundedReceiver<Event>, t0: Instant) -> (Vec<Duration>, Option<Finish>) {
    let mut times = Vec::new();
    while let Some(ev) = rx.recv().await {
        if let Event::Token { finish, .. } = ev {
            times.push(t0.elapsed());
            if finish.is_some() {
                return (times, finish);
            }
        }
    }
    (times, None)
}

#[tokio::test(start_paused = true)]
async fn ttft_is_prefill_time_and_itl_is_the_decode_step() {
    let e = start(cfg());
    let t0 = Instant::now();
    let (times, finish) = drain(e.submit(req(200, 5)).expect("accepted"), t0).await;
    assert_eq!(finish, Some(Finish::Length));
    assert_eq!(times.len(), 5);
    // Prefill step: compute-bound, 200 x 0.1 ms = 20 ms (above the 10 ms memory
    // part); then memory-bound decode steps of 10 + 1 ms.
    assert_eq!(times[0], Duration::from_millis(20));
    for w in times.windows(2) {
        assert_eq!(w[1] - w[0], Duration::from_millis(11));
    }
}

#[tokio::test(start_paused = true)]
async fn decodes_run_before_prefill_and_long_prompts_are_chunked() {
    let e = start(cfg());
    let t0 = Instant::now();
    let short = tokio::spawn(drain(e.submit(req(16, 40)).expect("accepted"), t0));
    // Let the short one start decoding, then send a prompt of 4 budgets.
    tokio::time::sleep(Duration::from_millis(60)).await;
    let long = tokio::spawn(drain(e.submit(req(2000, 2)).expect("accepted"), Instant::now()));
    let (short_times, _) = short.await.expect("join");
    let (long_times, _) = long.await.expect("join");
    // The running sequence never misses a step while the long prompt prefills:
    // every gap is one step, which grows to the compute time of the chunk it
    // shares: at most 0.1 ms x 512 tokens = 51.2 ms (tokio's millisecond timer
    // rounds it up to 52 ms).
    for w in short_times.windows(2) {
        let gap = w[1] - w[0];
        assert!(gap >= Duration::from_millis(11) && gap <= Duration::from_millis(52), "gap {gap:?}");
    }
    // 2000 tokens with a 511-token budget per step (one decode uses a token) take 4 steps
    // of at least 0.1 ms per prefill token.
    assert!(long_times[0] >= Duration::from_millis(200), "chunked prefill: {:?}", long_times[0]);
    assert!(
        short_times.windows(2).filter(|w| w[1] - w[0] > Duration::from_millis(40)).count() >= 3,
        "the long prefill spans several shared steps"
    );
}

#[tokio::test(start_paused = true)]
async fn running_batch_never_exceeds_max_num_seqs() {
    let e = start(SimConfig { max_num_seqs: 4, ..cfg() });
    let t0 = Instant::now();
    let handles: Vec<_> = (0..10).map(|_| tokio::spawn(drain(e.submit(req(32, 10)).expect("accepted"), t0))).collect();
    let mut firsts = Vec::new();
    for h in handles {
        let (times, finish) = h.await.expect("join");
        assert_eq!(finish, Some(Finish::Length));
        firsts.push(times[0]);
    }
    assert_eq!(e.stats.max_running_seen.load(Ordering::Relaxed), 4);
    // The 5th request could only start when one of the first 4 finished.
    firsts.sort();
    assert!(firsts[4] > firsts[3] + Duration::from_millis(50), "{firsts:?}");
}

#[tokio::test(start_paused = true)]
async fn kv_exhaustion_preempts_and_every_sequence_still_completes() {
    // 12 blocks of 16 tokens: three sequences of 16 prompt + 64 output (5 blocks each) cannot all fit.
    let e = start(SimConfig { kv_blocks: 12, ..cfg() });
    let t0 = Instant::now();
    let handles: Vec<_> = (0..3).map(|_| tokio::spawn(drain(e.submit(req(16, 64)).expect("accepted"), t0))).collect();
    for h in handles {
        let (times, finish) = h.await.expect("join");
        assert_eq!((times.len(), finish), (64, Some(Finish::Length)), "each gets all its tokens exactly once");
    }
    assert!(e.stats.preemptions.load(Ordering::Relaxed) > 0, "KV ran out, so something was preempted");
    assert_eq!(e.stats.kv_used_blocks.load(Ordering::Relaxed), 0, "all blocks returned");
}

/// When the KV cache runs out, the most recently admitted sequence is the
/// one preempted (vLLM's recompute policy), and it pays for it: when blocks
/// free up, its prompt and every token it had generated are prefilled again
/// before its next token.
#[tokio::test(start_paused = true)]
async fn the_latest_admitted_sequence_is_preempted_and_recomputes_its_tokens() {
    // 12 blocks of 16 tokens; three sequences of 16 prompt + 64 output. At 64
    // tokens each holds 4 blocks (all 12): the next block forces a preemption.
    // Prefill at 1 ms a token makes the recompute visible: 64 tokens, 64 ms.
    let c = SimConfig { kv_blocks: 12, prefill_per_token_ms: 1.0, ..cfg() };
    let e = start(c);
    let t0 = Instant::now();
    let rx: Vec<_> = (0..3).map(|_| e.submit(req(16, 64)).expect("accepted")).collect();
    let handles: Vec<_> = rx.into_iter().map(|r| tokio::spawn(drain(r, t0))).collect();
    let mut runs = Vec::new();
    for h in handles {
        let (times, finish) = h.await.expect("join");
        assert_eq!((times.len(), finish), (64, Some(Finish::Length)), "every sequence gets all its tokens exactly once");
        runs.push(times);
    }
    assert_eq!(e.stats.preemptions.load(Ordering::Relaxed), 1);
    let (first, second, latest) = (&runs[0], &runs[1], &runs[2]);
    // The two admitted first run to the end without waiting for blocks; the
    // latest stops after 48 tokens (4 blocks) and resumes only once they finished.
    let gap_at = (1..64).max_by_key(|&i| latest[i] - latest[i - 1]).expect("gaps");
    assert_eq!(gap_at, 48, "the latest sequence stopped when its 5th block was needed: {latest:?}");
    let done = first[63].max(second[63]);
    assert!(latest[47] < done && latest[48] > done, "it resumed after the others finished: {latest:?}");
    // Recompute: 16 prompt + 48 generated tokens prefilled again, 64 ms at 1 ms a token.

    assert!(latest[48] - done >= Duration::from_millis(64), "resumed {:?} after the blocks freed", latest[48] - done);
    for run in [first, second] {
        let longest = run.windows(2).map(|w| w[1] - w[0]).max().expect("gaps");
        assert!(longest < Duration::from_millis(64), "a sequence admitted earlier waited {longest:?}: it was preempted");
    }
}

/// As vLLM's v1 scheduler: a prompt gets the blocks of the chunk scheduled
/// now, not its whole prompt's up front, and a running prompt whose next
/// chunk finds no block free preempts the lowest-priority sequence. So under
/// priority scheduling a high-priority prompt bigger than the free cache is
/// prefilled at once, not after a low-priority answer ends.
#[tokio::test(start_paused = true)]
async fn a_high_priority_prompt_takes_the_cache_a_low_priority_answer_holds_chunk_by_chunk() {
    // 20 blocks of 16 tokens. The low-priority answer's 240-token prompt and
    // first tokens hold 16 of them when a 96-token (6-block) prompt comes:
    // its first chunk (47 tokens, 3 blocks) fits the 4 free, its second does not.
    let c = SimConfig { kv_blocks: 20, max_num_batched_tokens: 48, priority_scheduling: true, ..cfg() };
    let e = start(c);
    let t0 = Instant::now();
    let low = tokio::spawn(drain(e.submit(SeqRequest { priority: 10, ..req(240, 50) }).expect("accepted"), t0));
    tokio::time::sleep(Duration::from_millis(100)).await;
    let came = t0.elapsed();
    let high = drain(e.submit(SeqRequest { priority: -1, ..req(96, 1) }).expect("accepted"), t0).await;
    let ttft = high.0[0] - came;
    // Three chunks of at most 47 tokens, a step of 10-11 ms each: well under
    // the ~450 ms the low-priority answer had left.
    assert!(ttft < Duration::from_millis(80), "the prompt waited {ttft:?} for its blocks");
    let (times, finish) = low.await.expect("join");
    assert_eq!((times.len(), finish), (50, Some(Finish::Length)), "the preempted answer still gets all its tokens exactly once");
    assert_eq!(e.stats.preemptions.load(Ordering::Relaxed), 1, "the low-priority answer was preempted for the chunk");
    assert!(times.windows(2).any(|w| w[1] - w[0] > Duration::from_millis(40)), "and paid for it with a pause: {times:?}");
}

#[tokio::test(start_paused = true)]
async fn priority_scheduling_serves_lower_priority_values_first() {
    let e = start(SimConfig { max_num_seqs: 1, priority_scheduling: true, ..cfg() });
    let t0 = Instant::now();
    let busy = e.submit(req(16, 20)).expect("accepted");
    tokio::time::sleep(Duration::from_millis(20)).await;
    let low = e.submit(SeqRequest { priority: 10, ..req(16, 1) }).expect("accepted");
    let high = e.submit(SeqRequest { priority: -5, ..req(16, 1) }).expect("accepted");
    let (low, high, _) = tokio::join!(drain(low, t0), drain(high, t0), drain(busy, t0));
    assert!(high.0[0] < low.0[0], "priority -5 before priority 10: {:?} vs {:?}", high.0[0], low.0[0]);
}

#[tokio::test(start_paused = true)]
async fn fcfs_without_priority_scheduling() {
    let e = start(SimConfig { max_num_seqs: 1, ..cfg() });
    let t0 = Instant::now();
    let busy = e.submit(req(16, 20)).expect("accepted");
    tokio::time::sleep(Duration::from_millis(20)).await;
    let first = e.submit(SeqRequest { priority: 10, ..req(16, 1) }).expect("accepted");
    let second = e.submit(SeqRequest { priority: -5, ..req(16, 1) }).expect("accepted");
    let (first, second, _) = tokio::join!(drain(first, t0), drain(second, t0), drain(busy, t0));
    assert!(first.0[0] < second.0[0]);
}

#[tokio::test(start_paused = true)]
async fn ttft_grows_with_queueing_under_load() {
    let e = start(SimConfig { max_num_seqs: 2, ..cfg() });
    let t0 = Instant::now();
    let handles: Vec<_> = (0..6).map(|_| tokio::spawn(drain(e.submit(req(64, 20)).expect("accepted"), t0))).collect();
    let mut ttfts = Vec::new();
    for h in handles {
        ttfts.push(h.await.expect("join").0[0]);
    }
    ttfts.sort();
    assert!(ttfts[5] > ttfts[0] * 5, "queued requests wait for slots: {ttfts:?}");
}

#[tokio::test(start_paused = true)]
async fn bounded_waiting_queue_rejects_when_full() {
    let e = start(SimConfig { max_waiting: Some(2), ..cfg() });
    let _a = e.submit(req(16, 5)).expect("first");
    let _b = e.submit(req(16, 5)).expect("second");
    assert!(e.submit(req(16, 5)).is_err(), "third exceeds the waiting bound before the engine runs");
}

/// Seed 003's batch-interference shape, from the engine alone on paused time
/// (deterministic: seeded lengths, one thread): with 5 % of requests carrying
/// a 4096-token prompt, the P99/P50 TTFT of the 512-token requests grows with
/// concurrency, from about 2x at 8 to past 4x at 64.
#[test]
fn long_prompts_make_the_ttft_tail_grow_with_concurrency() {
    use loadtest::loadgen::scenario::LenDist;
    use loadtest::sim::sweep::{closed_loop, ClosedLoop};
    use loadtest::sim::Profile;
    let ratio = |concurrency: usize, long_share: f64| {
        let spec = ClosedLoop {
            concurrency,
            prompt_tokens: 512,
            output_tokens: LenDist::Uniform { min: 64, max: 256 },
            long_share,
            long_prompt_tokens: 4096,
            warmup: Duration::from_secs(30),
            duration: Duration::from_secs(600),
            seed: 7,
        };
        let rt = tokio::runtime::Builder::new_current_thread().enable_time().start_paused(true).build().expect("runtime");
        let t = rt.block_on(closed_loop(Profile::Llama70bFp8H100.config(), &spec)).expect("sweep");
        assert!(t.micros.len() > 1000, "{concurrency}: {} measured", t.micros.len());
        t.ms_at(0.99) / t.ms_at(0.5)
    };
    let (low, high) = (ratio(8, 0.05), ratio(64, 0.05));
    assert!(low < 3.0 && high > 4.0, "P99/P50 {low:.2} at 8, {high:.2} at 64");
    // Equal short prompts alone: a much flatter tail, still growing.
    let (low, high) = (ratio(8, 0.0), ratio(64, 0.0));
    assert!(low < high && high < 3.0, "512 only: {low:.2} at 8, {high:.2} at 64");
}

/// A prompt of `tokens` simulator tokens (4 characters each): `shared`
/// characters of a common prefix, then `own`'s.
fn prompt_hashes(shared: usize, own: u8, tokens: usize, block_size: u32) -> Vec<u64> {
    let mut text = vec![b's'; shared];
    text.resize(tokens * 4, own);
    loadtest::sim::cache::block_hashes(&text, block_size as usize * 4, tokens / block_size as usize)
}

#[tokio::test(start_paused = true)]
async fn a_cached_prefix_skips_its_prefill_and_is_reported() {
    let c = cfg();
    let m = Arc::new(SimMetrics::new(&c.model, c.kv_blocks, c.block_size));
    let e = Engine::start(Arc::new(c.clone()), m.clone(), Arc::new(Faults::new(c.faults.clone()))).0;
    // 480 tokens: 400 shared (25 blocks of 16), 80 each its own.
    let first = SeqRequest { block_hashes: prompt_hashes(1600, b'a', 480, 16), ..req(480, 2) };
    let t0 = Instant::now();
    let (times, _) = drain(e.submit(first).expect("accepted"), t0).await;
    // 480 x 0.1 ms: compute-bound.
    assert_eq!(times[0], Duration::from_millis(48));
    let second = SeqRequest { block_hashes: prompt_hashes(1600, b'b', 480, 16), ..req(480, 2) };
    let cached = second.cached.clone();
    let t1 = Instant::now();
    let (times, _) = drain(e.submit(second).expect("accepted"), t1).await;
    // 400 tokens found: 80 prefilled, under the 10 ms memory-bound floor.
    assert_eq!(cached.load(Ordering::Relaxed), 400);
    assert_eq!(times[0], Duration::from_millis(10));
    assert_eq!(e.stats.prefix_queries.load(Ordering::Relaxed), 960);
    assert_eq!(e.stats.prefix_hits.load(Ordering::Relaxed), 400);
    let text = m.encode();
    assert!(text.contains(r#"vllm:prefix_cache_queries_total{model_name="sim-llama-8b"} 960"#), "{text}");
    assert!(text.contains(r#"vllm:prefix_cache_hits_total{model_name="sim-llama-8b"} 400"#), "{text}");
    // Its cache's size, as vLLM's info series states it (routers size their estimates by it).
    let info = text.lines().find(|l| l.starts_with("vllm:cache_config_info{")).expect("cache_config_info");
    for label in [r#"num_gpu_blocks="10000""#, r#"block_size="16""#, r#"enable_prefix_caching="True""#] {
        assert!(info.contains(label) && info.ends_with(" 1"), "{info}");
    }
    // A prompt that is all cache still computes its last block.
    let again = SeqRequest { block_hashes: prompt_hashes(1600, b'b', 480, 16), ..req(480, 1) };
    let cached = again.cached.clone();
    drain(e.submit(again).expect("accepted"), Instant::now()).await;
    assert_eq!(cached.load(Ordering::Relaxed), 464);
}

#[tokio::test(start_paused = true)]
async fn cached_prefixes_are_evicted_when_memory_is_needed() {
    // 64 blocks of 16 tokens. A 480-token prompt (one token out, so no
    // decode block) takes 30 blocks and leaves them named (cached) when it
    // ends; `a` leaves 34 free, `b` takes 30 of them, and `c` takes the 4
    // left and evicts 26 of `a`'s, tail first.
    let e = start(SimConfig { kv_blocks: 64, ..cfg() });
    let a = || SeqRequest { block_hashes: prompt_hashes(0, b'a', 480, 16), ..req(480, 1) };
    let b = || SeqRequest { block_hashes: prompt_hashes(0, b'b', 480, 16), ..req(480, 1) };
    let c = || SeqRequest { block_hashes: prompt_hashes(0, b'c', 480, 16), ..req(480, 1) };
    for r in [a(), b(), c()] {
        drain(e.submit(r).expect("accepted"), Instant::now()).await;
    }
    // Of `a`, freed first, only the head is left: 4 blocks.
    let again_a = a();
    let cached_a = again_a.cached.clone();
    drain(e.submit(again_a).expect("accepted"), Instant::now()).await;
    assert_eq!(cached_a.load(Ordering::Relaxed), 64, "a's tail was evicted");
    // `c` is cached whole (`a` took `b`'s blocks) (less the last block, always computed).
    let again_c = c();
    let cached_c = again_c.cached.clone();
    drain(e.submit(again_c).expect("accepted"), Instant::now()).await;
    assert_eq!(cached_c.load(Ordering::Relaxed), 464);
}
