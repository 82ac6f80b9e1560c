//! The observed body: what it forwards, measures and ends.

use std::collections::VecDeque;

use http_body_util::BodyExt;

use std::sync::Arc;

use super::*;
use crate::proxy::fixtures::{cut_into_reads, fixture};
use crate::proxy::tracker::GAPS_REPORTED_EVERY;
use crate::proxy::watchdog::Watched;

/// A body that yields the given chunks, then stays pending or ends.
struct Chunks {
    q: VecDeque<Bytes>,
    hang: bool,
}

impl Body for Chunks {
    type Data = Bytes;
    type Error = std::io::Error;
    fn poll_frame(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        match self.q.pop_front() {
            Some(b) => Poll::Ready(Some(Ok(Frame::data(b)))),
            None if self.hang => Poll::Pending,
            None => Poll::Ready(None),
        }
    }
}

const TIMEOUTS: StreamTimeouts = StreamTimeouts {
    first_token: Duration::from_secs(5),
    idle: Duration::from_secs(5),
    total: Duration::from_secs(60),
    max_event: 1 << 20,
    send: Duration::from_secs(30),
};

const ROLE: &str = "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n";
const TOK: &str = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"x\"}}]}\n\n";
const FIN: &str = "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n";
const USAGE: &str = "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":4,\"completion_tokens\":3}}\n\n";
const DONE: &str = "data: [DONE]\n\n";

async fn run(chunks: Vec<Bytes>, strip: bool) -> (Bytes, String) {
    let (metrics, class) = fixture();
    let tracker = Tracker::new(metrics.clone(), class, Instant::now());
    let body = ObservedBody::sse(Chunks { q: chunks.into(), hang: false }, tracker, TIMEOUTS, strip);
    let out = body.collect().await.expect("body").to_bytes();
    (out, metrics.encode())
}

#[tokio::test]
async fn usage_event_is_cut_at_every_split_point_and_nothing_else_changes() {
    let with_usage = format!("{ROLE}: ka\n\n{TOK}{TOK}{TOK}{FIN}{USAGE}{DONE}");
    let expected = format!("{ROLE}: ka\n\n{TOK}{TOK}{TOK}{FIN}{DONE}");
    let whole = Bytes::from(with_usage.clone());
    for a in 0..=whole.len() {
        for b in [a, (a + 7).min(whole.len()), (a + 40).min(whole.len())] {
            let chunks = vec![whole.slice(..a), whole.slice(a..b), whole.slice(b..)];
            let (out, metrics) = run(chunks, true).await;
            assert_eq!(String::from_utf8_lossy(&out), expected, "split at {a},{b}");
            assert!(metrics.contains("slogate_generation_tokens_total{model=\"unknown\",class=\"chat\"} 3"), "usage read at {a},{b}");
            assert!(
                metrics.contains(
                    "slogate_inter_token_latency_seconds_count{model=\"unknown\",class=\"chat\",tier=\"interactive\",endpoint=\"other\"} 2"
                ),
                "{a},{b}"
            );
        }
    }
    let bytes: Vec<Bytes> = (0..whole.len()).map(|i| whole.slice(i..i + 1)).collect();
    assert_eq!(String::from_utf8_lossy(&run(bytes, true).await.0), expected);
    // Without stripping, bytes are forwarded untouched.
    assert_eq!(run(vec![whole.clone()], false).await.0, whole);
}

/// Found by the SSE property (`tests/it/fuzz_properties.rs`): a blank line
/// ended by CRLF that the reads split between CR and LF, followed by the
/// usage event, lost its LF when the usage event was cut.
#[tokio::test]
async fn a_crlf_split_before_a_usage_event_keeps_its_lf() {
    let usage = USAGE.as_bytes();
    for chunks in [vec![&b"\r"[..], &b"\n"[..], usage, DONE.as_bytes()], vec![&b"\r"[..], &[b"\n", usage].concat(), DONE.as_bytes()]] {
        let chunks: Vec<Bytes> = chunks.into_iter().map(Bytes::copy_from_slice).collect();
        let (out, _) = run(chunks, true).await;
        assert_eq!(String::from_utf8_lossy(&out), format!("\r\n{DONE}"));
    }
}

#[tokio::test]
async fn outcome_is_recorded_exactly_once_when_the_body_is_dropped_midway() {
    let (metrics, class) = fixture();
    let tracker = Tracker::new(metrics.clone(), class, Instant::now());
    let mut body = ObservedBody::sse(Chunks { q: vec![Bytes::from(ROLE), Bytes::from(TOK)].into(), hang: true }, tracker, TIMEOUTS, true);
    body.frame().await.expect("frame").expect("ok");
    drop(body);
    let text = metrics.encode();
    assert!(text.contains("outcome=\"cancelled\"} 1"), "{text}");
    assert_eq!(text.matches("slogate_requests_total{").count(), 1);
}

/// A JSON answer without usage has its completion estimated from its
/// text, four characters a token; content that is not a string counts
/// nothing and does not make the answer unreadable.
#[test]
fn a_json_answer_without_usage_is_estimated_from_its_text() {
    let (metrics, class) = fixture();
    let mut t = Tracker::new(metrics, class, Instant::now());
    let body = br#"{"choices":[{"message":{"role":"assistant","content":"h\u00e9llo there"},"finish_reason":"stop"},{"message":{"content":[{"type":"text","text":"x"}]}},{"text":"abcd"}]}"#;
    assert_eq!(read_json_outcome(body, false, &mut t), Outcome::ok);
    // "héllo there" is 11 characters, "abcd" 4: 15, so 4 tokens.
    assert_eq!(t.answer_estimate, Some(4));
}

/// The text is not read unless it is counted, but an answer whose text
/// is not UTF-8 (or whose string is cut) is still no usable answer.
#[test]
fn an_answer_whose_text_is_not_utf8_is_an_upstream_error() {
    let (metrics, class) = fixture();
    let mut t = Tracker::new(metrics, class, Instant::now());
    let usage = br#"],"usage":{"prompt_tokens":2,"completion_tokens":3}}"#;
    let mut body = br#"{"choices":[{"text":"ok "#.to_vec();
    body.extend_from_slice(&[0xff, 0xfe, b'"', b'}']);
    body.extend_from_slice(usage);
    assert_eq!(read_json_outcome(&body, false, &mut t), Outcome::upstream_error);
    let cut = br#"{"choices":[{"text":"no end}],"usage":{"prompt_tokens":2}}"#;
    assert_eq!(read_json_outcome(cut, false, &mut t), Outcome::upstream_error);
    let fine = br#"{"choices":[{"text":"ok","finish_reason":"length"}],"usage":{"prompt_tokens":2,"completion_tokens":3}}"#;
    assert_eq!(read_json_outcome(fine, false, &mut t), Outcome::length);
    assert_eq!((t.answer_estimate, t.usage.map(|u| u.completion_tokens)), (None, Some(3)), "with usage, no estimate");
}

/// An embeddings answer's usage is read from its end, and an answer
/// whose end is not its usage is read whole, with the same result.
#[test]
fn an_embeddings_answers_usage_is_read_from_its_end() {
    let (metrics, class) = fixture();
    let usage = |body: &[u8]| {
        let mut t = Tracker::new(metrics.clone(), class.clone(), Instant::now());
        (read_json_outcome(body, true, &mut t), t.usage.map(|u| (u.prompt_tokens, u.completion_tokens)))
    };
    let at_end = br#"{"object":"list","data":[{"index":0,"embedding":[0.1,-0.2,3e-5]}],"usage": {"prompt_tokens":12,"total_tokens":12,"completion_tokens":0,"prompt_tokens_details":null} }"#;
    assert_eq!(usage(at_end), (Outcome::ok, Some((12, 0))));
    let in_middle = br#"{"usage":{"prompt_tokens":3,"total_tokens":3},"data":[{"embedding":[1]}],"object":"list"}"#;
    assert_eq!(usage(in_middle), (Outcome::ok, Some((3, 0))), "read whole");
    let quoted = br#"{"data":[{"text":"a "usage":{"prompt_tokens":99}"}],"usage":{"prompt_tokens":4}}"#;
    assert_eq!(usage(quoted), (Outcome::ok, Some((4, 0))), "a quoted pattern is not a member");
    assert_eq!(usage(br#"{"data":[1,2],"usage":{"prompt_tokens":4}"#).0, Outcome::upstream_error, "cut short");
    assert_eq!(usage(b"<html>usage</html>").0, Outcome::upstream_error);
}

#[tokio::test(start_paused = true)]
async fn first_token_timeout_ends_the_stream_with_an_error_event() {
    let (metrics, class) = fixture();
    let tracker = Tracker::new(metrics.clone(), class, Instant::now());
    let start = Instant::now();
    let body = ObservedBody::sse(Chunks { q: vec![Bytes::from(ROLE)].into(), hang: true }, tracker, TIMEOUTS, true);
    let out = body.collect().await.expect("body").to_bytes();
    assert_eq!(start.elapsed(), TIMEOUTS.first_token, "fires exactly at the first-token deadline");
    let text = String::from_utf8_lossy(&out);
    assert!(text.starts_with(ROLE) && text.contains("no first token within 5s") && text.ends_with("data: [DONE]\n\n"), "{text}");
    assert!(metrics.encode().contains("outcome=\"timeout\"} 1"));
}

/// A replica with data always ready, that notes when it is dropped
/// (the request to it cancelled).
struct Endless(Arc<std::sync::atomic::AtomicBool>);

impl Body for Endless {
    type Data = Bytes;
    type Error = std::io::Error;
    fn poll_frame(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        Poll::Ready(Some(Ok(Frame::data(Bytes::from(TOK)))))
    }
}

impl Drop for Endless {
    fn drop(&mut self) {
        self.0.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

/// A client that takes one frame and then no more: the server stops
/// polling the body. The deadline that comes first still ends it, from
/// the watchdog's timer: the replica's request is dropped and the
/// request accounted for at that moment, with no poll.
async fn unread(timeouts: StreamTimeouts, wait: Duration) -> (bool, String) {
    let (metrics, class) = fixture();
    let tracker = Tracker::new(metrics.clone(), class, Instant::now());
    let dropped = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let list = Arc::new(crate::sync::Watchlist::default());
    let mut body = Watched::new(ObservedBody::sse(Endless(dropped.clone()), tracker, timeouts, false), &list);
    body.frame().await.expect("a frame").expect("ok");
    tokio::time::advance(wait).await;
    // Let the watchdog run.
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    let out = (dropped.load(std::sync::atomic::Ordering::SeqCst), metrics.encode());
    drop(body);
    out
}

#[tokio::test(start_paused = true)]
async fn the_total_timeout_fires_for_a_body_nobody_polls() {
    let t =
        StreamTimeouts { first_token: Duration::from_secs(60), idle: Duration::from_secs(60), total: Duration::from_secs(4), ..TIMEOUTS };
    let (dropped, text) = unread(t, Duration::from_millis(3900)).await;
    assert!(!dropped && !text.contains("slogate_requests_total{"), "nothing ends before the deadline: {text}");
    let (dropped, text) = unread(t, Duration::from_millis(4100)).await;
    assert!(dropped, "the replica's request is cancelled");
    assert!(text.contains("outcome=\"timeout\"} 1"), "{text}");
}

#[tokio::test(start_paused = true)]
async fn a_client_that_takes_nothing_for_the_send_timeout_is_cancelled() {
    let t = StreamTimeouts {
        first_token: Duration::from_secs(600),
        idle: Duration::from_secs(600),
        total: Duration::from_secs(3600),
        send: Duration::from_secs(10),
        ..TIMEOUTS
    };
    let (dropped, text) = unread(t, Duration::from_millis(10_100)).await;
    assert!(dropped, "the replica's request is cancelled");
    assert!(text.contains("outcome=\"cancelled\"} 1"), "{text}");
}

/// A body whose chunks arrive at given times after its start (for
/// paused-time tests: the times are exact), then ends or hangs.
struct Timed {
    start: Instant,
    q: VecDeque<(Duration, Bytes)>,
    sleep: Option<Pin<Box<Sleep>>>,
    hang: bool,
}

impl Timed {
    fn new(chunks: Vec<(u64, &str)>, hang: bool) -> Self {
        let q = chunks.into_iter().map(|(ms, b)| (Duration::from_millis(ms), Bytes::from(b.to_string()))).collect();
        Timed { start: Instant::now(), q, sleep: None, hang }
    }
}

impl Body for Timed {
    type Data = Bytes;
    type Error = std::io::Error;
    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        let Some(&(at, _)) = self.q.front() else {
            return if self.hang { Poll::Pending } else { Poll::Ready(None) };
        };
        let due = self.start + at;
        let sleep = self.sleep.get_or_insert_with(|| Box::pin(tokio::time::sleep_until(due)));
        ready!(sleep.as_mut().poll(cx));
        self.sleep = None;
        Poll::Ready(self.q.pop_front().map(|(_, b)| Ok(Frame::data(b))))
    }
}

/// A sample's value in the exposition: `NAME{...class="chat"...} VALUE`.
fn sample(text: &str, name: &str) -> f64 {
    text.lines()
        .find(|l| l.starts_with(&format!("{name}{{")) && l.contains("class=\"chat\""))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in\n{text}"))
}

async fn observe_timed(chunks: Vec<(u64, &str)>, hang: bool, timeouts: StreamTimeouts) -> (String, String) {
    let (metrics, class) = fixture();
    let mut tracker = Tracker::new(metrics.clone(), class, Instant::now());
    tracker.streaming = true;
    let body = ObservedBody::sse(Timed::new(chunks, hang), tracker, timeouts, true);
    let out = body.collect().await.expect("body").to_bytes();
    (String::from_utf8_lossy(&out).into_owned(), metrics.encode())
}

#[tokio::test(start_paused = true)]
async fn ttft_and_itl_are_the_exact_times_of_the_content_events() {
    // Role chunk at once, a keep-alive at 100 ms, content at 400 ms and
    // 900 ms: TTFT is 400 ms (not 0, not 900), the one gap 500 ms.
    let (_, m) =
        observe_timed(vec![(0, ROLE), (100, ": ka\n\n"), (400, TOK), (900, TOK), (900, FIN), (900, USAGE), (900, DONE)], false, TIMEOUTS)
            .await;
    assert_eq!(sample(&m, "slogate_time_to_first_token_seconds_sum"), 0.4);
    assert_eq!(sample(&m, "slogate_time_to_first_token_seconds_count"), 1.0);
    assert_eq!(sample(&m, "slogate_inter_token_latency_seconds_sum"), 0.5);
    assert_eq!(sample(&m, "slogate_inter_token_latency_seconds_count"), 1.0);
    assert_eq!(sample(&m, "slogate_e2e_request_latency_seconds_sum"), 0.9);
    // TPOT = (e2e - TTFT) / (3 tokens - 1) = 0.25 s.
    assert_eq!(sample(&m, "slogate_time_per_output_token_seconds_sum"), 0.25);
}

/// A pool of one healthy replica with 4 slots (nothing listens): the
/// replica and the pool's admission.
fn one_replica(metrics: &Arc<crate::telemetry::Metrics>) -> (Arc<crate::upstream::Replica>, Arc<crate::admission::queue::PoolAdmission>) {
    use crate::config::{InflightLimit, PoolConfig, TiersConfig};
    use crate::upstream::{Access, Pool};
    let cfg = PoolConfig {
        replicas: vec!["http://127.0.0.1:9".into()],
        max_inflight_per_replica: InflightLimit::Fixed(4),
        ..PoolConfig::default()
    };
    let pool = Pool::new(cfg.clone(), Access::new(&cfg).expect("access"), None);
    let replica = pool.replicas[0].clone();
    replica.set_healthy(true);
    (replica, Arc::new(crate::admission::queue::PoolAdmission::new(Arc::new(pool), TiersConfig::default(), metrics)))
}

#[tokio::test(start_paused = true)]
async fn a_stream_reports_its_gaps_to_its_replica_while_it_runs_and_at_its_end() {
    use crate::config::Tier;
    let (metrics, class) = fixture();
    let (replica, admission) = one_replica(&metrics);
    let mut tracker = Tracker::new(metrics.clone(), class, Instant::now());
    tracker.attach_lease(admission.try_lease(Tier::Interactive).expect("a slot"), Duration::ZERO);
    let tick = |t: &mut Tracker, ms: u64| {
        let now = t.last_token.map_or(Instant::now(), |l| l + Duration::from_millis(ms));
        t.content_event(now);
    };
    tick(&mut tracker, 0);
    for _ in 0..GAPS_REPORTED_EVERY - 1 {
        tick(&mut tracker, 40);
    }
    assert_eq!(replica.itl_mean(), Duration::ZERO, "nothing reported before the first {GAPS_REPORTED_EVERY} gaps");
    tick(&mut tracker, 40);
    assert_eq!(replica.itl_mean(), Duration::from_millis(40), "the stream still runs");
    // The replica slows down: the next report moves its mean a fifth of the way to 90 ms.
    for _ in 0..GAPS_REPORTED_EVERY {
        tick(&mut tracker, 90);
    }
    assert_eq!(replica.itl_mean(), Duration::from_millis(50));
    // The end reports what is left (4 gaps of 140 ms), once.
    for _ in 0..4 {
        tick(&mut tracker, 140);
    }
    drop(tracker);
    assert_eq!(replica.itl_mean(), Duration::from_millis(68));
    assert_eq!(replica.inflight(), 0, "the slot given back");
}

#[tokio::test(start_paused = true)]
async fn more_than_one_gap_in_a_hundred_over_the_itl_target_is_an_itl_breach() {
    // 101 tokens, 100 gaps of 10 ms; `slow` of them 60 ms (chat's target is 50 ms).
    for (slow, breach) in [(1, false), (2, true)] {
        let mut chunks = vec![(0u64, ROLE)];
        let mut t = 0;
        for i in 0..101 {
            if i > 0 {
                t += if i <= slow { 60 } else { 10 };
            }
            chunks.push((t, TOK));
        }
        chunks.extend([(t, FIN), (t, DONE)]);
        let (_, m) = observe_timed(chunks, false, TIMEOUTS).await;
        let itl_breaches =
            m.lines().any(|l| l.starts_with("slogate_slo_breaches_total{") && l.contains("kind=\"itl\"") && l.ends_with(" 1"));
        assert_eq!(itl_breaches, breach, "{slow} slow gaps of 100");
        let goodput = m.lines().any(|l| l.starts_with("slogate_goodput_requests_total{") && l.ends_with(" 1"));
        assert_eq!(goodput, !breach, "{slow} slow gaps of 100: goodput\n{m}");
    }
}

#[tokio::test(start_paused = true)]
async fn the_total_timeout_ends_a_stream_that_still_flows() {
    // A token every 500 ms for ever; idle and first-token budgets never
    // run out, the 2 s total does: the stream ends exactly then.
    let total =
        StreamTimeouts { first_token: Duration::from_secs(5), idle: Duration::from_secs(5), total: Duration::from_secs(2), ..TIMEOUTS };
    let chunks: Vec<(u64, &str)> = std::iter::once((0, ROLE)).chain((1..20).map(|i| (i * 500, TOK))).collect();
    let start = Instant::now();
    let (out, m) = observe_timed(chunks, true, total).await;
    assert_eq!(start.elapsed(), Duration::from_secs(2), "ended at the total timeout");
    assert_eq!(out.matches("\"x\"").count(), 4, "the tokens of 0.5-2.0 s were delivered: {out}");
    assert!(out.contains("exceeded the total timeout of 2s") && out.ends_with("data: [DONE]\n\n"), "{out}");
    assert!(m.contains("outcome=\"timeout\"} 1"), "{m}");
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(200))]

    /// Usage stripping leaves exactly the replica's bytes without the
    /// usage event, however the stream is cut into reads.
    #[test]
    fn stripping_leaves_exactly_the_replicas_bytes_minus_the_usage_event(
        tokens in 0usize..6,
        keepalives in proptest::collection::vec(0usize..8, 0..3),
        cuts in proptest::collection::vec(proptest::prelude::any::<proptest::sample::Index>(), 0..8),
    ) {
        let mut events: Vec<&str> = vec![ROLE];
        events.extend(std::iter::repeat_n(TOK, tokens));
        for k in &keepalives {
            events.insert((*k).min(events.len()), ": keep-alive\n\n");
        }
        events.push(FIN);
        let expected = format!("{}{DONE}", events.concat());
        events.push(USAGE);
        events.push(DONE);
        let whole = Bytes::from(events.concat());
        let chunks = cut_into_reads(&whole, cuts.iter().map(|c| c.index(whole.len() + 1)).collect());
        let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().expect("runtime");
        let (out, _) = rt.block_on(run(chunks, true));
        proptest::prop_assert_eq!(String::from_utf8_lossy(&out), expected);
    }
}

/// A read of whole events is handed on as it came, not copied (the replica
/// connection copied it out of its read buffer already, at its size), and
/// the stream keeps no buffer of its own between events; a read that ends
/// mid-event is held only until the event completes.
#[tokio::test]
async fn a_read_of_whole_events_is_handed_on_as_it_came_and_nothing_is_kept_between_events() {
    let (metrics, class) = fixture();
    let tracker = Tracker::new(metrics, class, Instant::now());
    let (tok_a, tok_b) = TOK.split_at(TOK.len() / 2);
    let reads = [format!("{ROLE}{TOK}"), TOK.to_string(), tok_a.to_string(), format!("{tok_b}{FIN}{DONE}")].map(Bytes::from);
    let mut body = ObservedBody::sse(Chunks { q: reads.iter().cloned().collect(), hang: false }, tracker, TIMEOUTS, false);
    let held = |body: &ObservedBody<Chunks>| match &body.mode {
        Mode::Sse { pending, .. } => pending.capacity(),
        _ => panic!("an SSE body"),
    };
    for (i, read) in reads[..2].iter().enumerate() {
        let data = body.frame().await.expect("a frame").expect("data").into_data().expect("data");
        assert_eq!(data, read, "the events as the replica sent them");
        assert_eq!(data.as_ptr(), read.as_ptr(), "read {i} handed on as it came, not copied");
        assert_eq!(held(&body), 0, "nothing kept after read {i}");
    }
    // Half an event: held, nothing handed on until it completes.
    let data = body.frame().await.expect("a frame").expect("data").into_data().expect("data");
    assert_eq!(data, format!("{TOK}{FIN}{DONE}"), "the held half, then the rest");
    assert_eq!(held(&body), 0, "nothing kept once the event completed");
    assert!(body.frame().await.is_none());
}

/// An interactive stream with no first token asks for a batch stream's
/// slot at its moment, to the moment while the body is polled: its own
/// timer wakes it, not the watchdog's next look.
#[tokio::test(start_paused = true)]
async fn a_polled_stream_asks_for_a_slot_at_its_moment() {
    use crate::config::Tier;
    let (metrics, class) = fixture();
    let (replica, admission) = one_replica(&metrics);
    // The replica said at its last scrape that a request waits in it.
    replica.readings.scraped_waiting.store(1, std::sync::atomic::Ordering::Relaxed);
    let batch = admission.try_lease(Tier::Batch).expect("a slot");
    let victim = Arc::new(crate::admission::preempt::Victim::new(100, Some(500), 0));
    victim.sent(10);
    batch.enlist(Arc::downgrade(&victim));
    let start = Instant::now();
    let mut tracker = Tracker::new(metrics.clone(), class, start);
    tracker.streaming = true;
    tracker.attach_lease(admission.try_lease(Tier::Interactive).expect("a slot"), Duration::ZERO);
    let mut body = ObservedBody::sse(Timed::new(vec![(0, ROLE), (1000, TOK)], true), tracker, TIMEOUTS, true);
    body.asks_at(start + Duration::from_millis(120));
    let reading = tokio::spawn(async move { body.collect().await.map(|b| b.to_bytes()) });
    let waker = futures_util::task::noop_waker();
    tokio::time::sleep(Duration::from_millis(119)).await;
    assert!(!victim.asked(&waker), "not before its moment");
    tokio::time::sleep(Duration::from_millis(2)).await;
    assert!(victim.asked(&waker), "asked at 120 ms");
    reading.abort();
    drop(batch);
}
