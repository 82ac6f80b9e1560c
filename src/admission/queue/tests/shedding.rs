//! Who is refused first under pressure, what they are told, and when: the
//! tenant over its share before those within theirs, Retry-After from the
//! measured drain, a caller's deadline, and `shed_late`'s moment.

use super::*;
use crate::admission::lease::OverWhy;

const TARGET: Duration = Duration::from_millis(300);

/// `claim(tenant)` of an interactive class with a 300 ms TTFT target.
fn timed(tenant: u32) -> Claim {
    Claim { ttft: Some(TARGET), ..claim(tenant) }
}

/// The pool's replicas take `ms` to a first token, 90 % of the time.
fn first_token_in(pool: &Arc<PoolAdmission>, ms: u64) {
    for r in &pool.pool().replicas {
        for _ in 0..500 {
            r.record_first_token(Duration::from_millis(ms), TARGET);
        }
    }
}

/// Tenant 1 holds `heavy` of the slots (taken while it was alone), tenant 2 `light`.
async fn held(pool: &Arc<PoolAdmission>, heavy: usize, light: usize) -> Vec<Lease> {
    let mut leases = Vec::new();
    for (tenant, n) in [(1, heavy), (2, light)] {
        for _ in 0..n {
            leases.push(pool.admit(Tier::Interactive, 0, claim(tenant), None).await.expect("a free slot").lease);
        }
    }
    leases
}

/// Tenant 1 over its share waits only until its request can no longer
/// make the class's TTFT target, and is refused with its own reason; tenant
/// 2, within its share, goes on waiting (shed_late is off) and gets the
/// next slot.
#[tokio::test(start_paused = true)]
async fn a_tenant_over_its_share_is_refused_at_the_target_while_one_within_waits_on() {
    let pool = pool(10, tiers(0.0, 10, 10));
    first_token_in(&pool, 100);
    let mut leases = held(&pool, 8, 2).await;
    // Tenant 2 holds 2 of its 5: its first request takes the seat above the slots, its second waits.
    let above = pool.admit(Tier::Interactive, 0, timed(2), None).await.expect("a seat above");
    let light = queued_as(&pool, timed(2)).await;
    let start = Instant::now();
    let heavy = queued_as(&pool, timed(1)).await;
    let r = heavy.await.expect("task");
    let waited = start.elapsed();
    let Err(Refusal::OverShare { over, why: OverWhy::Late, retry_after }) = r else { panic!("{r:?}") };
    assert!(waited >= Duration::from_millis(190) && waited <= Duration::from_millis(210), "the target less 100 ms: {waited:?}");
    assert_eq!((over.held, over.slots), (8, 10));
    assert!((over.part - 5.0).abs() < 1e-9, "{over:?}");
    assert_eq!(retry_after, Duration::from_secs(1), "no drain rate measured yet");
    assert!(!light.is_finished(), "within its share, it waits on");
    // Two slots free: the first pays back the seat above, the second is tenant 2's.
    drop(leases.pop());
    drop(leases.pop());
    settle().await;
    assert!(light.await.expect("task").is_ok());
    drop((above, leases));
}

/// A full queue takes a request of a tenant within its share in place of
/// the newest waiter of the tenant over its share; the tenant over its
/// share is refused at once while the queue is full.
#[tokio::test(start_paused = true)]
async fn a_full_queue_refuses_the_tenant_over_its_share_first() {
    let pool = pool(10, tiers(0.0, 2, 10));
    let leases = held(&pool, 9, 1).await;
    let older = queued_as(&pool, claim(1)).await;
    let newer = queued_as(&pool, claim(1)).await;
    assert_eq!(pool.depth(Tier::Interactive), 2, "full");
    let above = pool.admit(Tier::Interactive, 0, claim(2), None).await.expect("a seat above");
    // (The queue's depth stays at 2: `light` in, `newer` out.)
    let p = pool.clone();
    let light = tokio::spawn(async move { p.admit(Tier::Interactive, 0, claim(2), None).await });
    settle().await;
    let r = newer.await.expect("task");
    assert!(matches!(r, Err(Refusal::OverShare { why: OverWhy::Displaced, .. })), "{r:?}");
    assert!(!older.is_finished() && !light.is_finished());
    let r = pool.admit(Tier::Interactive, 0, claim(1), None).await;
    assert!(matches!(r, Err(Refusal::OverShare { why: OverWhy::Full, .. })), "{r:?}");
    // A third tenant takes the over-share tenant's last place.
    let p = pool.clone();
    let third = tokio::spawn(async move { p.admit(Tier::Interactive, 0, claim(3), None).await });
    settle().await;
    assert!(matches!(older.await.expect("task"), Err(Refusal::OverShare { why: OverWhy::Displaced, .. })));
    // With no tenant over its share waiting, a full queue refuses as before.
    let r = pool.admit(Tier::Interactive, 0, claim(4), None).await;
    assert!(matches!(r, Err(Refusal::QueueFull { .. })), "{r:?}");
    assert!(!light.is_finished() && !third.is_finished());
    drop((leases, above, light, third));
}

/// The breaker's sample of an over-share tenant's first token leaves out
/// its wait in the queue; within its share, the whole time counts.
#[tokio::test(start_paused = true)]
async fn the_breaker_is_not_shown_an_over_share_tenants_own_queueing() {
    let pool = pool(10, tiers(0.0, 10, 10));
    let leases = held(&pool, 7, 0).await;
    let within = pool.admit(Tier::Interactive, 0, claim(2), None).await.expect("a slot").lease;
    let over = pool.admit(Tier::Interactive, 0, claim(1), None).await.expect("a slot").lease;
    let (ttft, queued) = (Duration::from_millis(900), Duration::from_millis(700));
    assert!(over.over_share() && !within.over_share());
    assert_eq!(over.breaker_sample(ttft, queued), Duration::from_millis(200));
    assert_eq!(within.breaker_sample(ttft, queued), ttft);
    // Without keys nobody is over a share.
    let plain = pool.admit(Tier::Interactive, 0, Claim::default(), None).await;
    drop((leases, over, within, plain));
}

/// Retry-After for a queue is the queue ahead at the measured drain rate;
/// for a tenant over its share, its own waiters at its part of the drain.
#[tokio::test(start_paused = true)]
async fn retry_after_follows_the_measured_drain() {
    let pool = pool(10, tiers(0.0, 10, 10));
    // The queue drained 8 slots a second while requests waited.
    pool.rates[Tier::Interactive as usize].store(8.0);
    let leases = held(&pool, 10, 0).await;
    for _ in 0..4 {
        drop(queued(&pool, Tier::Interactive).await);
    }
    let r = pool.admit(Tier::Interactive, 0, Claim { ttft: None, ..Claim::default() }, None);
    let start = Instant::now();
    let r = r.await;
    assert_eq!(start.elapsed(), Duration::from_secs(2), "the queue timeout");
    // Five waiting (it is still among them) at 8 slots a second: 0.75 s.
    let Err(Refusal::Timeout { retry_after }) = r else { panic!("{r:?}") };
    assert!(retry_after >= Duration::from_millis(600) && retry_after <= Duration::from_millis(900), "{retry_after:?}");
    drop(leases);
}

/// A caller's deadline: the request waits no longer than it, and one the
/// queue cannot make at its measured rate is refused at once.
#[tokio::test(start_paused = true)]
async fn a_callers_deadline_bounds_its_wait() {
    let pool = pool(1, tiers(0.0, 10, 10));
    let held = take(&pool, Tier::Interactive).await;
    let start = Instant::now();
    let c = Claim { deadline: Some(start + Duration::from_millis(500)), ..Claim::default() };
    let r = pool.admit(Tier::Interactive, 0, c, None).await;
    assert!(matches!(r, Err(Refusal::Deadline { .. })), "{r:?}");
    assert_eq!(start.elapsed(), Duration::from_millis(500));
    // A slot freed a second: with three waiting, a 2 s deadline cannot be made.
    pool.rates[Tier::Interactive as usize].store(1.0);
    let _waiting: Vec<_> = futures_util::future::join_all((0..3).map(|_| queued(&pool, Tier::Interactive))).await;
    let start = Instant::now();
    let c = Claim { deadline: Some(start + Duration::from_secs(2)), ..Claim::default() };
    let r = pool.admit(Tier::Interactive, 0, c, None).await;
    assert!(matches!(r, Err(Refusal::Deadline { .. })), "{r:?}");
    assert_eq!(start.elapsed(), Duration::ZERO, "refused at once");
    drop(held);
}

/// Clients refused one after another are told to come back one drain
/// interval apart, not all at the moment the queue is estimated to drain.
#[tokio::test(start_paused = true)]
async fn refused_clients_are_told_to_return_at_the_drain_rate() {
    let pool = pool(10, tiers(0.0, 10, 10));
    let s = Duration::from_millis;
    assert_eq!(pool.schedule(Tier::Interactive, s(700)), s(700), "no rate yet: the estimate");
    pool.rates[Tier::Interactive as usize].store(10.0);
    // Three refused at once, each estimated 500 ms: 500, 600, 700 ms.
    let told: Vec<_> = (0..3).map(|_| pool.schedule(Tier::Interactive, s(500))).collect();
    assert_eq!(told, [s(500), s(600), s(700)]);
    // A later, longer estimate stands on its own; the next follows it.
    tokio::time::advance(s(100)).await;
    assert_eq!(pool.schedule(Tier::Interactive, s(2000)), s(2000));
    assert_eq!(pool.schedule(Tier::Interactive, s(100)), s(2100));
    // The calendar never runs past the 30 s bound.
    for _ in 0..1000 {
        pool.schedule(Tier::Interactive, s(0));
    }
    assert!(pool.schedule(Tier::Interactive, s(0)) <= Duration::from_secs(30));
    // Once nobody waits, the calendar starts over.
    pool.tick(Instant::now());
    assert_eq!(pool.schedule(Tier::Interactive, s(300)), s(300));
    // Batch keeps its own.
    pool.rates[Tier::Batch as usize].store(10.0);
    assert_eq!(pool.schedule(Tier::Batch, s(500)), s(500));
}

#[tokio::test(start_paused = true)]
async fn with_shed_late_an_interactive_request_waits_only_while_it_can_make_its_target() {
    let mut t = tiers(0.0, 10, 10);
    t.interactive.shed_late = true;
    let pool = pool(1, t);
    let target = Duration::from_millis(300);
    // The replica takes half the target to a first token, 90 % of the time.
    let replica = pool.pool().replicas[0].clone();
    for _ in 0..500 {
        replica.record_first_token(Duration::from_millis(150), target);
    }
    assert!((pool.pool().first_token_p90() - 0.5).abs() < 0.03, "{}", pool.pool().first_token_p90());
    let held = take(&pool, Tier::Interactive).await;
    let claim = Claim { ttft: Some(target), ..Claim::default() };
    let start = Instant::now();
    let p = pool.clone();
    let r = tokio::spawn(async move { p.admit(Tier::Interactive, 0, claim, None).await }).await.expect("task");
    assert!(matches!(r, Err(Refusal::Late { .. })), "{r:?}");
    let waited = start.elapsed();
    assert!(
        waited >= Duration::from_millis(140) && waited <= Duration::from_millis(160),
        "refused at its slack, not the 2 s timeout: {waited:?}"
    );
    // Replicas over the target already: a request that would have to wait is refused at once.
    for _ in 0..500 {
        replica.record_first_token(Duration::from_millis(400), target);
    }
    let start = Instant::now();
    let r = pool.admit(Tier::Interactive, 0, claim, None).await;
    assert!(matches!(r, Err(Refusal::Late { .. })), "{r:?}");
    assert_eq!(start.elapsed(), Duration::ZERO);
    // A free slot is taken whatever the estimate: nothing to wait for.
    drop(held);
    assert!(pool.admit(Tier::Interactive, 0, claim, None).await.is_ok());
    // A request without a target (batch, or a class the proxy did not mark) is untouched.
    let held2 = take(&pool, Tier::Interactive).await;
    let p = pool.clone();
    let start = Instant::now();
    let r = tokio::spawn(async move { p.admit(Tier::Interactive, 0, Claim::default(), None).await }).await.expect("task");
    assert!(matches!(r, Err(Refusal::Timeout { .. })), "{r:?}");
    assert_eq!(start.elapsed(), Duration::from_secs(2));
    drop(held2);
}

/// Replicas whose first tokens mostly come quickly, one in five late (long
/// prompts in bursts): their 90th percentile is past the target, their
/// median is not. A request that must wait while no other interactive
/// request does is not refused as it arrives, as though no slot could come
/// in time: it waits while the median still makes its target, and where
/// the pool preempts it asks a batch stream for its slot at once, since
/// the tail says a slot is at risk. One that would wait behind it is
/// judged by the tail, as a slot spent on it would make the first late.
#[tokio::test(start_paused = true)]
async fn with_shed_late_a_tail_past_the_target_does_not_refuse_a_lone_waiter_while_the_median_makes_it() {
    let waker = futures_util::task::noop_waker();
    let target = Duration::from_millis(300);
    let chat = Claim { ttft: Some(target), ..Claim::default() };
    for upstream_priority in [false, true] {
        let mut t = tiers(0.0, 10, 10);
        t.interactive.shed_late = true;
        let pool = pool_with(1, t, upstream_priority);
        let replica = pool.pool().replicas[0].clone();
        for i in 0..1000 {
            replica.record_first_token(Duration::from_millis(if i % 5 == 0 { 450 } else { 120 }), target);
        }
        assert!(pool.pool().first_token_p90() >= 1.0, "{}", pool.pool().first_token_p90());
        assert!((pool.pool().first_token_p50() - 0.4).abs() < 0.03, "{}", pool.pool().first_token_p50());
        let held = take(&pool, Tier::Batch).await;
        let v = victim_on(&pool);
        let start = Instant::now();
        let p = pool.clone();
        let h = tokio::spawn(async move { p.admit(Tier::Interactive, 0, chat, None).await });
        settle().await;
        assert!(!h.is_finished(), "not refused as it arrives ({upstream_priority})");
        assert!(v.asked(&waker), "a batch stream asked for its slot at once ({upstream_priority})");
        let behind = Instant::now();
        let r = pool.admit(Tier::Interactive, 0, chat, None).await;
        assert!(matches!(r, Err(Refusal::Late { .. })), "behind another: refused at once ({upstream_priority}): {r:?}");
        assert_eq!(behind.elapsed(), Duration::ZERO);
        let r = h.await.expect("task");
        let Err(Refusal::Late { expected, .. }) = r else { panic!("{r:?}") };
        let waited = start.elapsed();
        assert!(
            waited >= Duration::from_millis(170) && waited <= Duration::from_millis(190),
            "refused once the median no longer makes it, the target less 120 ms: {waited:?}"
        );
        assert!(expected >= Duration::from_millis(110) && expected <= Duration::from_millis(130), "told the median: {expected:?}");
        drop(held);
    }
}
