//! Admission: reloads (prepared, then installed), probes, and the default breaker.

use super::*;
use crate::config::Dur;

/// Prepare, then install, as a reload does.
fn reload(controls: &Controls, name: &str, class: &ClassConfig, config: &Config) -> Arc<ClassControl> {
    let c = controls.prepare(name, class, config);
    let mut config = config.clone();
    config.classes.insert(name.to_string(), class.clone());
    controls.install([&c], &config);
    c
}

#[test]
fn a_reload_keeps_a_class_control_unless_its_tier_changes() {
    let config = Config::default();
    let metrics = Arc::new(Metrics::new(&config));
    let controls = Controls::new(metrics);
    let chat = config.classes["chat"].clone();
    let first = reload(&controls, "chat", &chat, &config);
    let tighter = ClassConfig { ttft: Dur::millis(200), ..chat.clone() };
    let again = reload(&controls, "chat", &tighter, &config);
    assert!(Arc::ptr_eq(&first, &again), "same tier: the same windows and breaker");
    assert_eq!(again.ttft_target(), Duration::from_millis(200));
    let batch = ClassConfig { tier: Tier::Batch, ..chat };
    let moved = reload(&controls, "chat", &batch, &config);
    assert!(!Arc::ptr_eq(&first, &moved));
    assert_eq!(moved.tier, Tier::Batch);
    assert_eq!(controls.all().len(), 1);
}

#[test]
fn prepare_changes_nothing_live_until_install() {
    let config = Config::default();
    let controls = Controls::new(Arc::new(Metrics::new(&config)));
    let chat = config.classes["chat"].clone();
    let live = reload(&controls, "chat", &chat, &config);
    let tighter = ClassConfig { ttft: Dur::millis(120), ..chat };
    let prepared = controls.prepare("chat", &tighter, &config);
    let new_class = controls.prepare("search", &config.classes["chat"], &config);
    // Thrown away: the running class keeps its target, no class was added.
    assert_eq!(live.ttft_target(), Duration::from_millis(300));
    assert_eq!(controls.all().len(), 1);
    drop((prepared, new_class));
    assert_eq!(live.ttft_target(), Duration::from_millis(300));
}

/// The probe judges the finished request: a whole answer by its time
/// against the targets for what it generated; a stream that ended
/// without its first token as slow; a hang-up gives its place back.
#[tokio::test(start_paused = true)]
async fn a_probe_judges_the_finished_request() {
    let config = Config::default();
    let controls = Controls::new(Arc::new(Metrics::new(&config)));
    let chat = reload(&controls, "chat", &config.classes["chat"], &config);
    let slow = WindowStats { count: 100, p50: Duration::from_millis(700), p99: Duration::from_millis(700) };
    let tick = |secs: f64| {
        let chat = chat.clone();
        async move {
            for _ in 0..(secs * 4.0) as u32 {
                tokio::time::advance(Duration::from_millis(250)).await;
                chat.breaker.tick(Instant::now(), &slow);
            }
        }
    };
    let probe = |non_streaming: bool| match chat.breaker.admit() {
        Gate::Probe(t) => {
            if non_streaming {
                chat.breaker.judge_at_end(t);
            }
            Probe { control: chat.clone(), ticket: Some(t) }
        }
        g => panic!("not half-open: {g:?}"),
    };
    tick(35.5).await;
    assert_eq!(chat.breaker.state(), BreakerState::HalfOpen);
    // A hang-up gives its place back: five places remain for the whole answers below.
    probe(false).finished(&Finished::example(Outcome::cancelled, true));
    // Whole answers of 100 tokens in 2 s, within 300 ms + 100 x 50 ms: in time; all five close it.
    for _ in 0..breaker::HALF_OPEN_PROBES {
        probe(true).finished(&Finished::example(Outcome::ok, false));
    }
    tick(0.25).await;
    assert_eq!(chat.breaker.state(), BreakerState::Closed);
    // Open it again; a whole answer past its allowance reopens at once.
    tick(35.5).await;
    assert_eq!(chat.breaker.state(), BreakerState::HalfOpen);
    let late = Finished::example(Outcome::ok, false);
    probe(true).finished(&Finished { end: late.start + Duration::from_millis(5301), ..late });
    tick(0.25).await;
    assert_eq!(chat.breaker.state(), BreakerState::Open);
    // And a stream that ended in an error before its first token is slow.
    tick(5.0).await;
    assert_eq!(chat.breaker.state(), BreakerState::HalfOpen);
    probe(false).finished(&Finished { first_token: None, ..Finished::example(Outcome::stream_error, true) });
    tick(0.25).await;
    assert_eq!(chat.breaker.state(), BreakerState::Open);
}

/// Drive chat's control with the default config on paused time: every
/// 250 ms tick, 10 requests (40 a second) with TTFT `slow` while
/// `slow_for(seconds)` says so, else 100 ms; returns when (seconds from
/// the start) the breaker opened, if it did within `secs`.
async fn breaker_opens_at(slow_for: impl Fn(f64) -> bool, secs: f64) -> Option<f64> {
    let config = Config::default();
    let controls = Controls::new(Arc::new(Metrics::new(&config)));
    let chat = reload(&controls, "chat", &config.classes["chat"], &config);
    let t0 = Instant::now();
    let mut t = 0.0;
    while t < secs {
        let ttft = if slow_for(t) { Duration::from_millis(1500) } else { Duration::from_millis(100) };
        for _ in 0..10 {
            chat.ttft.record(ttft);
        }
        tokio::time::advance(TICK).await;
        t = (Instant::now() - t0).as_secs_f64();
        chat.publish(Instant::now());
        if chat.breaker.state() == BreakerState::Open {
            return Some(t);
        }
    }
    None
}

/// The default breaker measures sustained slowness, not a burst: a
/// one-second burst at 5x the target leaves it closed; thirty seconds of
/// it open the breaker within `trip_after` plus one window.
#[tokio::test(start_paused = true)]
async fn the_default_breaker_ignores_a_burst_and_opens_on_sustained_slowness() {
    let b = crate::config::BreakerConfig::default();
    let (trip_after, window) = (b.trip_after.get().as_secs_f64(), b.window.get().as_secs_f64());
    let burst = breaker_opens_at(|t| (5.0..6.0).contains(&t), 120.0).await;
    assert_eq!(burst, None, "a one-second burst opened the breaker");
    let sustained = breaker_opens_at(|t| (5.0..35.0).contains(&t), 120.0).await;
    let opened = sustained.expect("thirty seconds of slowness open the breaker");
    assert!(opened - 5.0 <= trip_after + window, "opened {opened} s in, slowness began at 5 s");
    // And not before it had lasted trip_after.
    assert!(opened - 5.0 >= trip_after, "opened {opened} s in");
}

/// With nothing in the windows, no breaker or reduction moving and no
/// pool holding anything, the publisher rests: what is recorded meanwhile
/// is not published until a request is admitted, whose arrival publishes it
/// at once (before a tick would have). Its cost follows traffic, not time.
#[tokio::test(start_paused = true)]
async fn the_publisher_rests_while_nothing_moves_and_an_arrival_wakes_it() {
    let config = Arc::new(Config::default());
    let controls = Arc::new(Controls::new(Arc::new(Metrics::new(&config))));
    let chat = reload(&controls, "chat", &config.classes["chat"], &config);
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    let current: Box<Current> = Box::new({
        let config = config.clone();
        move || (config.clone(), Vec::new())
    });
    let task = publisher(controls.clone(), Arc::new(Metrics::new(&config)), current, stop);
    // Past a few ticks: nothing moved, so it rests.
    tokio::time::sleep(TICK * 4).await;
    chat.ttft.record(Duration::from_millis(100));
    tokio::time::sleep(TICK * 8).await;
    assert_eq!(chat.view().ttft.count, 0, "a resting publisher published: it ticks with nothing to do");
    // An arrival: published without waiting for a tick.
    chat.publisher.poke();
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    assert_eq!(chat.view().ttft.count, 1, "the arrival did not wake the publisher");
    // With a sample in the window it ticks again: the next one is published a tick later.
    chat.ttft.record(Duration::from_millis(100));
    tokio::time::sleep(TICK + Duration::from_millis(1)).await;
    assert_eq!(chat.view().ttft.count, 2, "with samples in the window the publisher stopped ticking");
    let _ = stop_tx.send(true);
    task.await.expect("publisher");
}

/// The stage tells the replica what an interactive stream asks of it (its
/// class's TTFT target), which batch leaves room for; a short request
/// (embeddings), whose seat is beside the streams, tells it nothing.
#[tokio::test(start_paused = true)]
async fn an_admitted_interactive_request_tells_its_replica_its_target_unless_it_is_short() {
    let config = Config::default();
    let metrics = Arc::new(Metrics::new(&config));
    let controls = Controls::new(metrics.clone());
    let chat = reload(&controls, "chat", &config.classes["chat"], &config);
    let cfg = crate::config::PoolConfig {
        replicas: vec!["http://127.0.0.1:9".into()],
        max_inflight_per_replica: crate::config::InflightLimit::Fixed(4),
        ..Default::default()
    };
    let access = crate::upstream::Access::new(&cfg).expect("access");
    let pool = Arc::new(crate::upstream::Pool::new(cfg, access, None));
    pool.replicas[0].set_healthy(true);
    let adm = Arc::new(PoolAdmission::new(pool.clone(), config.tiers.clone(), &metrics));
    let short = Claim { short: true, ..Claim::default() };
    let _embedding = admit(&chat, &adm, "t", false, 0, short, None).await.expect("a slot");
    assert_eq!(pool.replicas[0].interactive_outlook(), None, "a short request: nothing");
    let _stream = admit(&chat, &adm, "t", true, 0, Claim::default(), None).await.expect("a slot");
    assert_eq!(pool.replicas[0].interactive_outlook(), Some((Duration::from_millis(300), 0)), "chat's 300 ms, no prompt known");
}
