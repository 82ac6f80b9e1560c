//! The queue's behaviour over real leases on a simulated pool.

use super::*;
use crate::admission::fair::Share;
use crate::admission::seats::DEMAND_WINDOW;
use crate::config::Dur;
use crate::config::{Config, PoolConfig, TierConfig};

fn tiers(reserved: f64, i_cap: u32, b_cap: u32) -> TiersConfig {
    TiersConfig {
        interactive: TierConfig {
            queue_capacity: i_cap,
            queue_timeout: Dur::secs(2),
            reserved_share: reserved,
            queue_max_bytes: crate::config::Size(1 << 30),
            shed_late: false,
        },
        batch: TierConfig {
            queue_capacity: b_cap,
            queue_timeout: Dur::secs(10),
            reserved_share: 0.0,
            queue_max_bytes: crate::config::Size(1 << 30),
            shed_late: false,
        },
    }
}

/// A pool of one healthy replica with `slots` slots (nothing listens: the
/// queue never connects).
fn pool(slots: u32, tiers: TiersConfig) -> Arc<PoolAdmission> {
    pool_with(slots, tiers, false)
}

fn pool_with(slots: u32, tiers: TiersConfig, upstream_priority: bool) -> Arc<PoolAdmission> {
    replicas_with(1, slots, tiers, upstream_priority)
}

/// A pool of `n` healthy replicas with `slots` slots each (nothing listens).
fn replicas_with(n: u16, slots: u32, tiers: TiersConfig, upstream_priority: bool) -> Arc<PoolAdmission> {
    replicas_on(n, slots, tiers, upstream_priority, &Metrics::new(&Config::default()))
}

fn replicas_on(n: u16, slots: u32, tiers: TiersConfig, upstream_priority: bool, metrics: &Metrics) -> Arc<PoolAdmission> {
    let cfg = PoolConfig {
        replicas: (0..n).map(|i| format!("http://127.0.0.1:{}", 9 + i).into()).collect(),
        max_inflight_per_replica: crate::config::InflightLimit::Fixed(slots),
        upstream_priority,
        ..PoolConfig::default()
    };
    let access = crate::upstream::Access::new(&cfg).expect("access");
    let pool = Arc::new(Pool::new(cfg, access, None));
    for r in &pool.replicas {
        r.set_healthy(true);
    }
    Arc::new(PoolAdmission::new(pool, tiers, metrics))
}

/// Every lease `tier` may take now, without waiting.
fn lease_all(pool: &Arc<PoolAdmission>, tier: Tier) -> Vec<Lease> {
    std::iter::from_fn(|| pool.try_lease(tier).ok()).collect()
}

#[tokio::test(start_paused = true)]
async fn each_tick_publishes_the_seats_each_tier_holds_and_the_reservation() {
    let metrics = Metrics::new(&Config::default());
    let adm = replicas_on(1, 20, tiers(0.5, 10, 10), false, &metrics);
    let name = adm.pool().config.name.clone();
    let series = |text: &str, labels: &str, metric: &str| {
        let line = format!("slogate_{metric}{{{labels}}} ");
        text.lines().find_map(|l| l.strip_prefix(line.as_str()).map(str::to_string))
    };
    let text = metrics.encode_openmetrics();
    let at_start = |tier: &str| series(&text, &format!("pool=\"{name}\",tier=\"{tier}\""), "pool_seats");
    assert_eq!((at_start("interactive"), at_start("batch")), (Some("0".into()), Some("0".into())), "at zero from the start");
    let _held = [take(&adm, Tier::Interactive).await, take(&adm, Tier::Batch).await, take(&adm, Tier::Batch).await];
    adm.tick(Instant::now());
    let text = metrics.encode_openmetrics();
    let seats = |tier: &str| series(&text, &format!("pool=\"{name}\",tier=\"{tier}\""), "pool_seats");
    assert_eq!(seats("interactive").as_deref(), Some("1"));
    assert_eq!(seats("batch").as_deref(), Some("2"));
    // The reservation: the peak of 1 and a quarter, rounded up, and the headroom (1 of 20).
    assert_eq!(series(&text, &format!("pool=\"{name}\""), "pool_reserved_seats").as_deref(), Some("3"));
}

async fn take(pool: &Arc<PoolAdmission>, tier: Tier) -> Lease {
    pool.admit(tier, 0, Claim::default(), None).await.expect("a free slot").lease
}

/// Start a queued admission; the task runs until it is queued.
async fn queued(pool: &Arc<PoolAdmission>, tier: Tier) -> tokio::task::JoinHandle<Result<Granted, Refusal>> {
    let p = pool.clone();
    let before = pool.depth(tier);
    let h = tokio::spawn(async move { p.admit(tier, 0, Claim::default(), None).await });
    while pool.depth(tier) == before && !h.is_finished() {
        tokio::task::yield_now().await;
    }
    h
}

async fn settle() {
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
}

#[tokio::test(start_paused = true)]
async fn freed_slot_goes_to_interactive_before_earlier_batch_and_fifo_within_a_tier() {
    let pool = pool(2, tiers(0.0, 10, 10));
    let a = take(&pool, Tier::Batch).await;
    let b = take(&pool, Tier::Interactive).await;
    let batch = queued(&pool, Tier::Batch).await;
    let i1 = queued(&pool, Tier::Interactive).await;
    let i2 = queued(&pool, Tier::Interactive).await;
    assert_eq!((pool.depth(Tier::Interactive), pool.depth(Tier::Batch)), (2, 1));
    drop(a);
    settle().await;
    assert!(i1.is_finished() && !i2.is_finished() && !batch.is_finished());
    drop(b);
    settle().await;
    assert!(i2.is_finished() && !batch.is_finished());
    let l1 = i1.await.expect("task").expect("admitted");
    assert_eq!(l1.lease.tier(), Tier::Interactive);
    drop(l1);
    settle().await;
    let got = batch.await.expect("task").expect("batch admitted after interactive");
    assert_eq!(got.lease.tier(), Tier::Batch);
    assert_eq!(pool.depth(Tier::Batch), 0);
}

#[tokio::test(start_paused = true)]
async fn batch_never_holds_the_reserved_share() {
    // 4 slots, at most half reserved: with interactive demand seen in
    // the window, batch may hold 2.
    let pool = pool(4, tiers(0.5, 10, 10));
    let seen = take(&pool, Tier::Interactive).await;
    pool.tick(Instant::now());
    drop(seen);
    assert_eq!(pool.batch_limit(), 2);
    let _b1 = take(&pool, Tier::Batch).await;
    let _b2 = take(&pool, Tier::Batch).await;
    let b3 = queued(&pool, Tier::Batch).await;
    assert_eq!(pool.depth(Tier::Batch), 1);
    // Interactive still gets the two reserved slots at once.
    let _i1 = take(&pool, Tier::Interactive).await;
    let i2 = take(&pool, Tier::Interactive).await;
    drop(i2);
    settle().await;
    // A freed slot inside the reserved share does not go to batch.
    assert!(!b3.is_finished());
    assert_eq!(pool.batch_inflight(), 2);
    let r = b3.await.expect("task");
    assert!(matches!(r, Err(Refusal::Timeout { .. })), "{r:?}");
}

#[tokio::test(start_paused = true)]
async fn batch_takes_no_seat_interactive_holds_or_needs_now_even_past_the_share() {
    // 20 slots, at most a quarter (5) reserved, a headroom of 1.
    let pool = pool(20, tiers(0.25, 100, 100));
    // A burst of 8 interactive requests, past the share.
    let mut chat = Vec::new();
    for _ in 0..8 {
        chat.push(take(&pool, Tier::Interactive).await);
    }
    pool.tick(Instant::now());
    assert_eq!(pool.batch_limit(), 15, "the reservation stops at the share");
    // Batch fills what the 8 and the headroom leave: 11, not 12 (the 8
    // held leave 12 free, one of them the headroom) or 15.
    let held = lease_all(&pool, Tier::Batch);
    assert_eq!(held.len(), 11);
    // The next interactive request takes the headroom at once.
    chat.push(pool.try_lease(Tier::Interactive).expect("the headroom"));
    // A seat an interactive stream frees is the headroom again while 8 hold.
    drop(chat.pop());
    assert_eq!(chat.len(), 8);
    assert!(pool.try_lease(Tier::Batch).is_err(), "8 interactive, 11 batch: the free seat is the headroom");
    // The burst over (4 left), batch may take seats again, up to the batch limit.
    chat.truncate(4);
    let more = lease_all(&pool, Tier::Batch);
    assert_eq!(more.len(), 4, "batch back to 15, its limit");
}

/// Where the replicas order their queues by tier, the reservation of
/// interactive's peak narrows to the headroom once every replica's limit
/// has been at its engine's slots (the most a scrape saw running) for
/// every tick of the hold, a seat a tick, and widens again at the first
/// tick one is not.
#[tokio::test(start_paused = true)]
async fn a_prioritised_pool_at_its_slots_reserves_only_the_headroom_after_the_hold() {
    use crate::admission::seats::AT_SLOTS_HELD;
    // Two replicas of 8 slots, at most half (8) reserved, a headroom of 1.
    let pool = replicas_with(2, 8, tiers(0.5, 100, 100), true);
    let mut chat = Vec::new();
    for _ in 0..6 {
        chat.push(take(&pool, Tier::Interactive).await);
    }
    pool.tick(Instant::now());
    assert_eq!(pool.batch_limit(), 8, "a peak of 6 and a quarter, and the headroom: the share");
    let replicas = pool.pool().replicas.clone();
    for r in &replicas {
        r.readings.saw_running(8.0);
    }
    pool.tick(Instant::now());
    assert_eq!(pool.batch_limit(), 8, "at the slots for one tick only");
    tokio::time::advance(AT_SLOTS_HELD - Duration::from_millis(250)).await;
    pool.tick(Instant::now());
    assert_eq!(pool.batch_limit(), 8, "not yet held for the whole hold");
    tokio::time::advance(Duration::from_millis(250)).await;
    // Held: the reservation narrows a seat a tick, down to the headroom.
    for limit in 9..=15 {
        pool.tick(Instant::now());
        assert_eq!(pool.batch_limit(), limit, "a seat a tick");
    }
    pool.tick(Instant::now());
    assert_eq!(pool.batch_limit(), 15, "only the headroom is reserved");
    // While chat holds 6, batch still leaves them and the headroom.
    let batch = lease_all(&pool, Tier::Batch);
    assert_eq!(batch.len(), 9);
    // One replica was seen running 9: its limit of 8 is below its slots.
    replicas[1].readings.saw_running(9.0);
    pool.tick(Instant::now());
    assert_eq!(pool.batch_limit(), 8, "the peak is reserved again at once");
    // Without upstream_priority the peak is always reserved.
    let fcfs = replicas_with(2, 8, tiers(0.5, 100, 100), false);
    let mut chat = Vec::new();
    for _ in 0..6 {
        chat.push(take(&fcfs, Tier::Interactive).await);
    }
    for r in &fcfs.pool().replicas {
        r.readings.saw_running(8.0);
    }
    for _ in 0..2 {
        fcfs.tick(Instant::now());
        tokio::time::advance(AT_SLOTS_HELD).await;
    }
    fcfs.tick(Instant::now());
    assert_eq!(fcfs.batch_limit(), 8);
}

/// With no interactive traffic batch may use all but the headroom; when
/// interactive comes, the headroom serves it at once, a freed slot goes
/// to it first, and the reservation grows with its demand; after a
/// window of quiet it is back to the headroom.
#[tokio::test(start_paused = true)]
async fn the_reservation_follows_interactive_demand() {
    let pool = pool(20, tiers(0.25, 100, 100));
    assert_eq!(pool.batch_limit(), 19, "20 slots, a headroom of 1, no interactive demand");
    let mut batch = Vec::new();
    for _ in 0..19 {
        batch.push(take(&pool, Tier::Batch).await);
    }
    assert!(pool.try_lease(Tier::Batch).is_err(), "the headroom is not batch's");
    let i1 = take(&pool, Tier::Interactive).await;
    let i2 = queued(&pool, Tier::Interactive).await;
    drop(batch.pop());
    let i2 = i2.await.expect("task").expect("the freed slot goes to interactive").lease;
    // Demand 2: the next tick reserves ceil(2 x 1.25) + 1 = 4 (of at most 5).
    pool.tick(Instant::now());
    assert_eq!(pool.batch_limit(), 16);
    drop(batch.pop());
    assert_eq!(pool.batch_inflight(), 17);
    assert!(pool.try_lease(Tier::Batch).is_err(), "batch takes no slot above its new limit");
    // 19 of 20 slots held, batch one above its limit: that one is
    // interactive's, so interactive may go one above the slot count.
    let i3 = take(&pool, Tier::Interactive).await;
    let i4 = pool.try_lease(Tier::Interactive).expect("one above the slots: the slot batch holds over its limit");
    assert!(pool.try_lease(Tier::Interactive).is_err(), "no further");
    drop((i3, i4));
    drop((i1, i2));
    for _ in 0..(DEMAND_WINDOW.as_millis() / 250 + 2) {
        tokio::time::advance(Duration::from_millis(250)).await;
        pool.tick(Instant::now());
    }
    assert_eq!(pool.batch_limit(), 19, "quiet for the window: back to the headroom");
    pool.set_interactive_at_risk(true);
    assert_eq!(pool.batch_limit(), 15, "an interactive class over its target: the whole share");
    pool.set_interactive_at_risk(false);
    // A share of 0 reserves nothing, not even the headroom.
    assert_eq!(self::pool(20, tiers(0.0, 10, 10)).batch_limit(), 20);
}

#[tokio::test(start_paused = true)]
async fn starvation_guard_moves_batch_unless_interactive_is_at_risk() {
    for at_risk in [false, true] {
        let pool = pool(1, tiers(0.0, 100, 10));
        pool.set_interactive_at_risk(at_risk);
        let mut held = Some(take(&pool, Tier::Interactive).await);
        let mut batch = Some(queued(&pool, Tier::Batch).await);
        // Interactive keeps arriving; every 200 ms the slot is freed.
        let mut served_batch_at = None;
        for step in 1..=9u32 {
            let next = queued(&pool, Tier::Interactive).await;
            tokio::time::advance(Duration::from_millis(200)).await;
            drop(held.take());
            settle().await;
            if let Some(b) = batch.take_if(|b| b.is_finished()) {
                // The batch request got the slot; the interactive one still waits.
                served_batch_at = Some(step * 200);
                assert!(!next.is_finished());
                held = Some(b.await.expect("task").expect("batch admitted").lease);
                next.abort();
                break;
            }
            held = Some(next.await.expect("task").expect("interactive admitted").lease);
        }
        if at_risk {
            assert_eq!(served_batch_at, None, "batch must not pass interactive at risk");
        } else {
            // Batch waited at least the guard interval, then got the next freed slot.
            assert_eq!(served_batch_at, Some(1000));
        }
        drop(held);
    }
}

#[tokio::test(start_paused = true)]
async fn full_queue_shed_and_timeout_are_refusals() {
    let pool = pool(1, tiers(0.0, 1, 10));
    let held = take(&pool, Tier::Interactive).await;
    let waiting = queued(&pool, Tier::Interactive).await;
    // Interactive queue holds 1: the next is refused at once.
    assert!(matches!(pool.admit(Tier::Interactive, 0, Claim::default(), None).await, Err(Refusal::QueueFull { .. })));
    // Batch arriving while interactive waits is shed, not queued.
    assert!(matches!(pool.admit(Tier::Batch, 0, Claim::default(), None).await, Err(Refusal::Shed { .. })));
    assert_eq!(pool.depth(Tier::Batch), 0);
    // The waiting one times out after queue_timeout (2 s) and leaves the queue.
    let t0 = Instant::now();
    let r = waiting.await.expect("task");
    assert!(matches!(r, Err(Refusal::Timeout { .. })), "{r:?}");
    assert_eq!(t0.elapsed(), Duration::from_secs(2));
    assert_eq!(pool.depth(Tier::Interactive), 0);
    drop(held);
}

/// Bodies waiting in a tier count against its `queue_max_bytes`: one
/// that would take the queue past it is refused, whatever the count, and
/// bytes come back whichever way a waiter leaves (served, hung up, timed out).
#[tokio::test(start_paused = true)]
async fn waiting_bodies_count_against_the_queue_byte_budget() {
    let mut t = tiers(0.0, 100, 100);
    t.interactive.queue_max_bytes = crate::config::Size(10 << 20);
    let pool = pool(1, t);
    let held = take(&pool, Tier::Interactive).await;
    let spawn = |bytes: u64| {
        let p = pool.clone();
        tokio::spawn(async move { p.admit(Tier::Interactive, bytes, Claim::default(), None).await })
    };
    let first = spawn(4 << 20);
    settle().await;
    let second = spawn(4 << 20);
    settle().await;
    assert_eq!(pool.waiting_bytes(Tier::Interactive), 8 << 20);
    // 8 MiB waiting + 4 MiB > 10 MiB: refused though the queue has room for 98 more.
    assert!(matches!(pool.admit(Tier::Interactive, 4 << 20, Claim::default(), None).await, Err(Refusal::QueueBytesFull { .. })));
    // A small one still fits.
    let small = spawn(1 << 20);
    settle().await;
    assert_eq!(pool.waiting_bytes(Tier::Interactive), 9 << 20);
    // The first is served: its bytes leave the budget.
    drop(held);
    let lease = first.await.expect("task").expect("served").lease;
    assert_eq!(pool.waiting_bytes(Tier::Interactive), 5 << 20);
    // The second hangs up: its bytes leave too.
    second.abort();
    settle().await;
    assert_eq!(pool.waiting_bytes(Tier::Interactive), 1 << 20);
    // The small one times out.
    assert!(matches!(small.await.expect("task"), Err(Refusal::Timeout { .. })));
    assert_eq!(pool.waiting_bytes(Tier::Interactive), 0);
    assert_eq!(pool.depth(Tier::Interactive), 0);
    drop(lease);
    // With a free slot nothing waits: a body larger than the budget is served.
    assert!(pool.admit(Tier::Interactive, 64 << 20, Claim::default(), None).await.is_ok());
}

#[tokio::test(start_paused = true)]
async fn hanging_up_while_queued_leaves_the_queue_at_once() {
    let pool = pool(1, tiers(0.0, 10, 10));
    let held = take(&pool, Tier::Interactive).await;
    let gone = queued(&pool, Tier::Interactive).await;
    let stays = queued(&pool, Tier::Interactive).await;
    assert_eq!(pool.depth(Tier::Interactive), 2);
    gone.abort();
    settle().await;
    assert_eq!(pool.depth(Tier::Interactive), 1);
    drop(held);
    settle().await;
    // The slot went to the one still waiting, not into the void.
    assert!(stays.await.expect("task").is_ok());
    assert_eq!(pool.pool().replicas[0].inflight(), 0);
}

#[tokio::test(start_paused = true)]
async fn batch_that_cannot_make_its_deadline_is_refused_early() {
    // One slot; batch timeout 10 s; batch served at 1 per second.
    let pool = pool(1, tiers(0.0, 10, 100));
    // The rate counts while requests wait: one always does here.
    let mut held = take(&pool, Tier::Batch).await;
    for _ in 0..6 {
        let next = queued(&pool, Tier::Batch).await;
        tokio::time::advance(Duration::from_secs(1)).await;
        pool.tick(Instant::now());
        drop(held);
        held = next.await.expect("task").expect("the freed slot").lease;
    }
    // About 10 fit before the deadline; the rest are refused when they arrive.
    let mut waiting = Vec::new();
    let mut refused_at = None;
    for i in 0..20 {
        let h = queued(&pool, Tier::Batch).await;
        settle().await;
        if h.is_finished() {
            assert!(matches!(h.await.expect("task"), Err(Refusal::Hopeless { .. })));
            refused_at = Some(i);
            break;
        }
        waiting.push(h);
    }
    let refused_at = refused_at.expect("refused early");
    assert!((8..=10).contains(&refused_at), "refused at position {refused_at}");
    // When the rate drops, queued ones that can no longer make it go early too.
    for _ in 0..8 {
        tokio::time::advance(Duration::from_secs(1)).await;
        pool.tick(Instant::now());
    }
    settle().await;
    let early = waiting.iter().filter(|h| h.is_finished()).count();
    assert!(early > 0, "no queued batch request was refused before its deadline");
    drop(held);
}

fn claim(tenant: u32) -> Claim {
    Claim { share: Share { tenant, weight: 1.0 }, tokens: 100, fair: true, ttft: None, short: false, deadline: None, resumed: false }
}

async fn queued_as(pool: &Arc<PoolAdmission>, claim: Claim) -> tokio::task::JoinHandle<Result<Granted, Refusal>> {
    let p = pool.clone();
    let before = pool.depth(Tier::Interactive);
    let h = tokio::spawn(async move { p.admit(Tier::Interactive, 0, claim, None).await });
    while pool.depth(Tier::Interactive) == before && !h.is_finished() {
        tokio::task::yield_now().await;
    }
    h
}

#[tokio::test(start_paused = true)]
async fn a_tenant_under_its_share_takes_a_seat_above_the_slots_and_the_heavy_one_gives_it_back() {
    // 10 slots, all held by tenant 1, which has one more waiting.
    let plain = pool(1, tiers(0.0, 10, 10));
    let pool = pool(10, tiers(0.0, 10, 10));
    let mut heavy = Vec::new();
    for _ in 0..10 {
        heavy.push(pool.admit(Tier::Interactive, 0, claim(1), None).await.expect("a free slot").lease);
    }
    let waiting = queued_as(&pool, claim(1)).await;
    // Tenant 2 holds nothing: its part is 5 of 10. It does not queue.
    let light = pool.admit(Tier::Interactive, 0, claim(2), None).await.expect("a seat above the slots");
    assert_eq!(light.waited, Duration::ZERO);
    assert_eq!(pool.depth(Tier::Interactive), 1, "only tenant 1's request waits");
    // The headroom is a tenth of the slots: one seat. A second light request waits.
    let light2 = queued_as(&pool, claim(2)).await;
    assert_eq!(pool.depth(Tier::Interactive), 2);
    // One of tenant 1's ends: the pool is back at its slots, nothing is handed on.
    drop(heavy.pop());
    settle().await;
    assert!(!waiting.is_finished() && !light2.is_finished(), "the freed slot paid back the seat above");
    // The next one freed goes to tenant 2: tenant 1, at its share, leaves
    // the last seat (the reserve) to the other tenant.
    drop(heavy.pop());
    settle().await;
    assert!(light2.is_finished(), "tenant 2 served");
    assert!(!waiting.is_finished(), "tenant 1 leaves the reserve");
    // Without keys (no fair accounting) nobody goes above the slots.
    let _held = take(&plain, Tier::Interactive).await;
    let p = plain.clone();
    let h = tokio::spawn(async move { p.admit(Tier::Interactive, 0, Claim { fair: false, ..claim(2) }, None).await });
    settle().await;
    assert!(!h.is_finished(), "first come, first served: it waits");
    drop((light, heavy, waiting, light2, h));
}

#[tokio::test(start_paused = true)]
async fn a_tenant_at_its_share_leaves_the_last_seats_to_the_others_while_they_are_active() {
    // 20 slots: the reserve is two.
    let pool = pool(20, tiers(0.0, 10, 10));
    let light = pool.admit(Tier::Interactive, 0, claim(2), None).await.expect("a free slot").lease;
    let mut heavy = Vec::new();
    for _ in 0..17 {
        heavy.push(pool.admit(Tier::Interactive, 0, claim(1), None).await.expect("a free slot").lease);
    }
    // 18 held, two free: they are the reserve, not the heavy tenant's.
    let waiting = queued_as(&pool, claim(1)).await;
    assert_eq!(pool.depth(Tier::Interactive), 1);
    let second = pool.admit(Tier::Interactive, 0, claim(2), None).await.expect("a reserved seat");
    assert_eq!(second.waited, Duration::ZERO);
    let third = pool.admit(Tier::Interactive, 0, claim(2), None).await.expect("the other reserved seat");
    assert_eq!(third.waited, Duration::ZERO);
    assert_eq!(pool.depth(Tier::Interactive), 1, "the heavy tenant still waits");
    // The light tenant goes away: the heavy one may take every slot again.
    drop((light, second, third));
    settle().await;
    assert!(waiting.is_finished(), "alone, the heavy tenant is served");
    assert!(pool.admit(Tier::Interactive, 0, claim(1), None).await.is_ok(), "and takes the last one too");
    drop(heavy);
}

/// The lease judges the finished request: its tenant's service is settled
/// to the tokens the replica reported, and the charge stands without them.
#[tokio::test(start_paused = true)]
async fn a_lease_judges_the_finished_request() {
    use crate::telemetry::{accounting::Finished, Outcome};
    let q = pool(2, tiers(0.0, 4, 4));
    let mut reported = q.try_lease(Tier::Interactive).expect("a slot");
    reported.finished(&Finished::example(Outcome::ok, true));
    assert_eq!(reported.used, Some(110), "10 prompt + 100 completion tokens");
    let mut silent = q.try_lease(Tier::Interactive).expect("a slot");
    silent.finished(&Finished { usage: None, ..Finished::example(Outcome::ok, true) });
    assert_eq!(silent.used, None);
}

mod beyond;
mod held;
mod news;
mod preempted;
mod shedding;

/// A batch stream holding `pool`'s slot, enlisted as a victim that has sent tokens.
fn victim_on(pool: &Arc<PoolAdmission>) -> Arc<crate::admission::preempt::Victim> {
    let v = Arc::new(crate::admission::preempt::Victim::new(100, Some(500), 0));
    v.sent(10);
    pool.preemption.enlist(Arc::downgrade(&v));
    v
}

#[tokio::test(start_paused = true)]
async fn a_waiting_interactive_request_asks_for_a_batch_slot_only_when_it_would_miss_its_target() {
    let waker = futures_util::task::noop_waker();
    let target = Duration::from_millis(300);
    let chat = Claim { ttft: Some(target), ..Claim::default() };
    // No pace measured: it asks at three quarters of the time it can wait;
    // where the engine schedules by priority (`upstream_priority`) too, as
    // it frees no slot for an interactive request either.
    for upstream_priority in [false, true] {
        let pool = pool_with(1, tiers(0.0, 10, 10), upstream_priority);
        let held = take(&pool, Tier::Batch).await;
        let v = victim_on(&pool);
        let p = pool.clone();
        let h = tokio::spawn(async move { p.admit(Tier::Interactive, 0, chat, None).await });
        tokio::time::sleep(Duration::from_millis(220)).await;
        assert!(!v.asked(&waker), "a slot may still free in time ({upstream_priority})");
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert!(v.asked(&waker), "asked at 225 ms ({upstream_priority})");
        drop(held);
        assert!(h.await.expect("task").is_ok());
    }
    // Slots freeing once a second: it cannot make its target waiting, so it asks at once.
    let pool = pool_with(1, tiers(0.0, 10, 10), false);
    pool.rates[Tier::Batch as usize].store(1.0);
    let held = take(&pool, Tier::Batch).await;
    let v = victim_on(&pool);
    let p = pool.clone();
    let h = tokio::spawn(async move { p.admit(Tier::Interactive, 0, chat, None).await });
    settle().await;
    assert!(v.asked(&waker), "asked as it queued");
    drop(held);
    assert!(h.await.expect("task").is_ok());
    // Slots freeing ten times a second: it waits for one.
    pool.rates[Tier::Batch as usize].store(10.0);
    let held = take(&pool, Tier::Batch).await;
    let v = victim_on(&pool);
    let p = pool.clone();
    let h = tokio::spawn(async move { p.admit(Tier::Interactive, 0, chat, None).await });
    settle().await;
    assert!(!v.asked(&waker), "a slot frees in time at this pace");
    drop(held);
    assert!(h.await.expect("task").is_ok());
}
