use super::*;
use crate::config::{Balance, Config, Tier};
use crate::upstream::parts::GAPS_FORGOTTEN_AFTER;
use crate::upstream::{Load, ReplicaSlot};

/// Two healthy replicas (nothing listens) with `slots` each, least loaded.
fn two(slots: u32, upstream_priority: bool) -> Pool {
    let cfg = PoolConfig {
        replicas: vec!["http://127.0.0.1:9".into(), "http://127.0.0.1:10".into()],
        max_inflight_per_replica: InflightLimit::Fixed(slots),
        balance: Balance::LeastLoaded,
        upstream_priority,
        ..PoolConfig::default()
    };
    let access = Access::new(&cfg).expect("access");
    let pool = Pool::new(cfg, access, None);
    for r in &pool.replicas {
        r.set_healthy(true);
    }
    pool
}

/// The reservation narrows to the headroom only where the replicas
/// order their queues by tier and every healthy one's limit reaches the
/// most it was seen running (its engine's slots).
#[test]
fn a_prioritised_pool_is_at_its_slots_where_every_healthy_limit_reaches_the_most_seen_running() {
    let pool = two(8, true);
    assert!(!pool.prioritised_at_its_slots(), "no scrape said what they run");
    pool.replicas[0].readings.saw_running(8.0);
    assert!(!pool.prioritised_at_its_slots(), "one replica's running count is unknown");
    pool.replicas[1].readings.saw_running(6.0);
    assert!(pool.prioritised_at_its_slots(), "limits 8 and 8 reach 8 and 6");
    pool.replicas[1].readings.saw_running(9.0);
    assert!(!pool.prioritised_at_its_slots(), "it ran 9: a limit of 8 holds it below its slots");
    pool.replicas[1].set_healthy(false);
    assert!(pool.prioritised_at_its_slots(), "only healthy replicas count");
    pool.replicas[0].set_healthy(false);
    assert!(!pool.prioritised_at_its_slots(), "no healthy replica");
    let fcfs = two(8, false);
    fcfs.replicas.iter().for_each(|r| r.readings.saw_running(8.0));
    assert!(!fcfs.prioritised_at_its_slots(), "without upstream_priority, never");
}

/// A replica that failed its checks may come back restarted with fewer
/// slots: what it ran before is forgotten, so a limit learned at its
/// new slots reaches them, and until a scrape says what it runs the
/// reservation stays whole.
#[test]
fn a_replica_that_went_down_is_at_its_slots_by_what_it_runs_once_back() {
    let pool = two(8, true);
    pool.replicas.iter().for_each(|r| r.readings.saw_running(8.0));
    assert!(pool.prioritised_at_its_slots());
    pool.replicas[1].set_healthy(false);
    pool.replicas[1].set_healthy(true);
    assert_eq!(pool.replicas[1].readings.most_running(), 0, "forgotten as it went down");
    assert!(!pool.prioritised_at_its_slots(), "back, and no scrape has said what it runs");
    pool.replicas[1].readings.saw_running(4.0);
    assert!(pool.prioritised_at_its_slots(), "back with 4 slots: a limit of 8 reaches them");
}

fn on(slot: &ReplicaSlot) -> &str {
    &slot.replica().url
}

#[tokio::test(start_paused = true)]
async fn interactive_waits_for_a_replica_whose_gaps_are_not_slow_and_batch_goes_to_the_slow_one() {
    use std::time::Duration;
    let pool = two(2, false);
    let (slow, fast) = (&pool.replicas[0], &pool.replicas[1]);
    // Before any stream ended, nothing changes the order.
    let picks: Vec<String> =
        (0..4).map(|_| on(&pool.pick(None, Room::Over(0), Tier::Interactive, None).expect("slot")).to_string()).collect();
    assert!(picks.contains(&slow.url) && picks.contains(&fast.url), "no gaps measured yet: {picks:?}");
    // Streams of 100 gaps: 90 ms apart on one replica, 40 ms on the other (more than 1.5x).
    slow.record_itl(Duration::from_millis(9000), 100);
    fast.record_itl(Duration::from_millis(4000), 100);
    assert!(slow.itl_mean().abs_diff(Duration::from_millis(90)) < Duration::from_micros(1), "{:?}", slow.itl_mean());
    for _ in 0..4 {
        // Whichever replica the rotation starts from.
        let i = pool.pick(None, Room::Over(0), Tier::Interactive, None).expect("slot");
        assert_eq!(on(&i), fast.url, "interactive where the gaps are short");
        let b = pool.pick(None, Room::Over(0), Tier::Batch, None).expect("slot");
        assert_eq!(on(&b), slow.url, "batch leaves that replica to interactive");
    }
    // The fast replica full: interactive waits for it (it would miss its
    // ITL on the slow one); batch still takes the slow one.
    let held: Vec<_> = (0..2).map(|_| pool.pick(None, Room::Over(0), Tier::Interactive, None).expect("slot")).collect();
    assert!(held.iter().all(|s| on(s) == fast.url));
    assert!(matches!(pool.pick(None, Room::Over(0), Tier::Interactive, None), Err(PickError::Saturated)));
    assert_eq!(on(&pool.pick(None, Room::Over(0), Tier::Batch, None).expect("slot")), slow.url);
    // The fast replica gone: the slow one serves interactive too.
    fast.set_healthy(false);
    assert_eq!(on(&pool.pick(None, Room::Over(0), Tier::Interactive, None).expect("slot")), slow.url);
    fast.set_healthy(true);
    drop(held);
    // The slow replica recovers: its batch streams bring its mean back near the other's.
    for _ in 0..10 {
        slow.record_itl(Duration::from_millis(4000), 100);
    }
    assert!(slow.itl_mean() < Duration::from_millis(60), "{:?}", slow.itl_mean());
    let picks: Vec<String> =
        (0..4).map(|_| on(&pool.pick(None, Room::Over(0), Tier::Interactive, None).expect("slot")).to_string()).collect();
    assert!(picks.contains(&slow.url) && picks.contains(&fast.url), "both serve interactive again: {picks:?}");
    // Slow again, then nothing ends there for longer than the gaps are
    // remembered (no batch to measure it): interactive tries it again.
    slow.record_itl(Duration::from_millis(90_000), 100);
    fast.record_itl(Duration::from_millis(4000), 100);
    assert_eq!(on(&pool.pick(None, Room::Over(0), Tier::Batch, None).expect("slot")), slow.url, "slow again");
    tokio::time::advance(GAPS_FORGOTTEN_AFTER + Duration::from_secs(1)).await;
    fast.record_itl(Duration::from_millis(4000), 100);
    assert_eq!(slow.itl_mean(), Duration::ZERO, "forgotten");
    let picks: Vec<String> =
        (0..4).map(|_| on(&pool.pick(None, Room::Over(0), Tier::Interactive, None).expect("slot")).to_string()).collect();
    assert!(picks.contains(&slow.url) && picks.contains(&fast.url), "{picks:?}");
    slow.record_itl(Duration::from_millis(4000), 100);
    assert!(slow.itl_mean().abs_diff(Duration::from_millis(40)) < Duration::from_micros(1), "measured anew");
    // A little slower (1.4x) is not slow.
    for _ in 0..20 {
        slow.record_itl(Duration::from_millis(5600), 100);
    }
    let picks: Vec<String> =
        (0..4).map(|_| on(&pool.pick(None, Room::Over(0), Tier::Interactive, None).expect("slot")).to_string()).collect();
    assert!(picks.contains(&slow.url) && picks.contains(&fast.url), "{picks:?}");
}

#[tokio::test(start_paused = true)]
async fn late_first_tokens_under_load_set_the_replicas_batch_cut_and_its_gauge() {
    use std::time::Duration;
    let cfg = PoolConfig {
        replicas: vec!["http://127.0.0.1:9".into()],
        max_inflight_per_replica: InflightLimit::Auto,
        upstream_priority: true,
        ..PoolConfig::default()
    };
    let metrics = Metrics::new(&Config::default());
    let access = Access::new(&cfg).expect("access");
    let pool = Pool::new(cfg, access, None);
    pool.activate(&metrics);
    let r = &pool.replicas[0];
    r.set_healthy(true);
    let (target, idle) = (Duration::from_millis(300), Load { waiting: Some(0.0), running: Some(1.0), waits_only_when_full: false });
    let batch = pool.pick(None, Room::Over(0), Tier::Batch, None).expect("slot");
    r.record_first_token(Duration::from_millis(100), target);
    r.control("p", idle, false);
    assert_eq!((r.seats.batch_cut.load(Ordering::Relaxed), r.gauges.get().expect("live").batch_cut.get()), (0, 0));
    // Over the target and over twice the best so far, batch on the replica: load.
    r.record_first_token(Duration::from_millis(450), target);
    r.control("p", idle, false);
    let cut = r.seats.batch_cut.load(Ordering::Relaxed);
    assert_eq!(cut, 2, "a tenth of the starting limit of 16, rounded up");
    assert_eq!(r.gauges.get().expect("live").batch_cut.get(), 2);
    assert_eq!(r.max_inflight(), 16, "the limit itself holds");
    drop(batch);
}

#[test]
fn batch_leaves_a_replicas_batch_cut_to_interactive_requests() {
    let pool = two(10, false);
    let (a, b) = (&pool.replicas[0], &pool.replicas[1]);
    // Four of each replica's ten seats are left to interactive requests
    // (in a fleet, this instance's part of them: 2 of its 5 slots).
    a.seats.batch_cut.store(4, Ordering::Relaxed);
    b.seats.batch_cut.store(4, Ordering::Relaxed);
    let batch: Vec<_> = (0..12).map(|_| pool.pick(None, Room::Over(0), Tier::Batch, None).expect("slot")).collect();
    assert!(matches!(pool.pick(None, Room::Over(0), Tier::Batch, None), Err(PickError::Saturated)));
    assert_eq!((a.inflight(), b.inflight()), (6, 6));
    let chat: Vec<_> = (0..8).map(|_| pool.pick(None, Room::Over(0), Tier::Interactive, None).expect("slot")).collect();
    assert!(matches!(pool.pick(None, Room::Over(0), Tier::Interactive, None), Err(PickError::Saturated)));
    drop(chat);
    a.set_fleet_share(Some((5, 5)));
    b.set_fleet_share(Some((5, 5)));
    drop(batch);
    let batch: Vec<_> = (0..6).map(|_| pool.pick(None, Room::Over(0), Tier::Batch, None).expect("slot")).collect();
    assert!(matches!(pool.pick(None, Room::Over(0), Tier::Batch, None), Err(PickError::Saturated)));
    assert_eq!((a.inflight(), b.inflight()), (3, 3));
    drop(batch);
    // The cut gone, batch takes every slot again.
    a.seats.batch_cut.store(0, Ordering::Relaxed);
    let on_a: Vec<_> = (0..5).filter_map(|_| pool.pick(Some(b), Room::Over(0), Tier::Batch, None).ok()).collect();
    assert_eq!(on_a.len(), 5);
}

#[tokio::test(start_paused = true)]
async fn while_a_replica_is_slow_batch_leaves_the_reserved_seats_on_the_others() {
    use std::time::Duration;
    let pool = two(4, false);
    let (slow, fast) = (&pool.replicas[0], &pool.replicas[1]);
    // Nothing slow: `Leave` is the batch limit's business, not the pick's.
    let all: Vec<_> = (0..8).map(|_| pool.pick(None, Room::Leave(3), Tier::Batch, None).expect("slot")).collect();
    assert_eq!(all.iter().filter(|s| on(s) == fast.url).count(), 4);
    drop(all);
    slow.record_itl(Duration::from_millis(9000), 100);
    fast.record_itl(Duration::from_millis(4000), 100);
    // Three seats reserved: batch fills the slow replica, then takes
    // one seat of the fast one's four and no more.
    let batch: Vec<_> = (0..5).map(|_| pool.pick(None, Room::Leave(3), Tier::Batch, None).expect("slot")).collect();
    assert_eq!(batch.iter().filter(|s| on(s) == slow.url).count(), 4);
    assert_eq!(fast.seats.batch_held.load(Ordering::Relaxed), 1);
    assert!(matches!(pool.pick(None, Room::Leave(3), Tier::Batch, None), Err(PickError::Saturated)));
    // The reserved seats are interactive's.
    let chat: Vec<_> = (0..3).map(|_| pool.pick(None, Room::Over(0), Tier::Interactive, None).expect("slot")).collect();
    assert!(chat.iter().all(|s| on(s) == fast.url));
    // Interactive's demand falls (less reserved): batch may take more of the fast replica.
    drop(chat);
    let more = pool.pick(None, Room::Leave(1), Tier::Batch, None).expect("slot");
    assert_eq!(on(&more), fast.url);
    assert_eq!(fast.seats.batch_held.load(Ordering::Relaxed), 2);
    // Each batch seat is counted off once, when given back.
    drop(more);
    drop(batch);
    assert_eq!((fast.seats.batch_held.load(Ordering::Relaxed), slow.seats.batch_held.load(Ordering::Relaxed)), (0, 0));
}

#[test]
fn a_new_request_goes_where_fewer_prefills_are_ahead_of_it_even_with_more_streams() {
    let pool = two(8, false);
    // Three streams decoding on one replica, one request still prefilling on the other.
    let mut decoding: Vec<ReplicaSlot> = (0..4).map(|_| pool.pick(None, Room::Over(0), Tier::Batch, None).expect("slot")).collect();
    let prefilling = decoding.pop().expect("four");
    let busy = on(&prefilling).to_string();
    decoding.retain(|s| on(s) != busy);
    for s in &mut decoding {
        s.prefilled();
    }
    let quiet = on(&decoding[0]).to_string();
    assert!(decoding.len() > prefilling.replica().inflight(), "more streams on {quiet} than on {busy}");
    for tier in [Tier::Interactive, Tier::Batch] {
        let next = pool.pick(None, Room::Over(0), tier, None).expect("slot");
        assert_eq!(on(&next), quiet, "{tier:?}: the replica with no prefill in progress");
    }
    // Once the prefill is done, streams count again.
    let mut prefilling = prefilling;
    prefilling.prefilled();
    let mut counts = HashSet::new();
    for _ in 0..2 {
        counts.insert(on(&pool.pick(None, Room::Over(0), Tier::Batch, None).expect("slot")).to_string());
    }
    assert_eq!(counts, HashSet::from([busy]), "fewest streams now");
}

#[test]
fn with_upstream_priority_an_interactive_request_waits_only_behind_interactive_prefills() {
    for priority in [true, false] {
        let pool = two(8, priority);
        let (ra, rb) = (pool.replicas[0].clone(), pool.replicas[1].clone());
        // Two batch prefills on one replica, one interactive prefill on the other.
        let _batch: Vec<ReplicaSlot> = (0..2).map(|_| pool.pick(Some(&ra), Room::Over(0), Tier::Batch, None).expect("slot")).collect();
        let _chat = pool.pick(Some(&rb), Room::Over(0), Tier::Interactive, None).expect("slot");
        let next = pool.pick(None, Room::Over(0), Tier::Interactive, None).expect("slot");
        // vLLM with priority scheduling runs the interactive request
        // before both batch prefills; first come, first served, it waits for both.
        let want = if priority { &rb } else { &ra };
        assert_eq!(on(&next), want.url, "upstream_priority {priority}");
    }
}

/// `pool`'s two replicas of 8 in a fleet where this instance's part is 4
/// of each and the others hold 6 on the first (one of them took seats past
/// its own part) and 2 on the second; then batch as far as it goes: the
/// first replica's 2 free seats and 4, its part, on the second.
fn batch_beside_the_others(pool: &Pool) -> (Arc<Replica>, Arc<Replica>, Vec<ReplicaSlot>) {
    let (a, b) = (pool.replicas[0].clone(), pool.replicas[1].clone());
    a.set_fleet_share(Some((4, 6)));
    b.set_fleet_share(Some((4, 2)));
    let batch: Vec<ReplicaSlot> = std::iter::from_fn(|| pool.pick(None, Room::Leave(0), Tier::Batch, None).ok()).take(10).collect();
    assert_eq!((a.inflight(), b.inflight()), (2, 4), "the first replica's 8 seats: 6 held elsewhere, 2 free");
    assert_eq!(batch.len(), 6);
    (a, b, batch)
}

#[test]
fn in_a_fleet_before_interactive_batch_takes_no_seat_of_its_part_while_the_replica_is_full_as_last_heard() {
    let pool = two(8, true);
    let (ra, rb, batch) = batch_beside_the_others(&pool);
    // Interactive still has its part there (the engine runs it first).
    let chat: Vec<ReplicaSlot> =
        std::iter::from_fn(|| pool.pick(Some(&rb), Room::Over(0), Tier::Interactive, None).ok()).take(10).collect();
    assert_eq!(chat.len(), 2, "up to this instance's part of 4");
    // A request that must go there (a stored response's follow-up) still does.
    assert!(pool.slot_on(&ra, Tier::Batch).is_some());
    // The others let go: batch takes its part again.
    drop(chat);
    ra.set_fleet_share(Some((4, 0)));
    assert!(pool.pick(Some(&rb), Room::Leave(0), Tier::Batch, None).is_ok());
    drop(batch);
    // First come, first served: the same for batch, and interactive too
    // takes no seat of its part while the replica is full as last heard
    // (the engine would queue it behind what it runs, first come first served).
    let fcfs = two(8, false);
    let (fa, fb, batch) = batch_beside_the_others(&fcfs);
    assert!(fcfs.pick(Some(&fb), Room::Over(0), Tier::Interactive, None).is_err(), "the first replica is full as last heard");
    drop(batch);
    let chat: Vec<ReplicaSlot> =
        std::iter::from_fn(|| fcfs.pick(Some(&fb), Room::Over(0), Tier::Interactive, None).ok()).take(10).collect();
    assert_eq!((chat.len(), fa.inflight()), (2, 2), "2 free of its part of 4");
    // A request that must go there still does.
    assert!(fcfs.slot_on(&fa, Tier::Interactive).is_some());
}

#[test]
fn in_a_fleet_an_interactive_request_may_take_a_seat_no_instance_holds() {
    let pool = two(8, false);
    let (ra, rb) = (pool.replicas[0].clone(), pool.replicas[1].clone());
    // This instance's part: 2 of each replica's 8; the others hold 5 on each.
    for r in [&ra, &rb] {
        r.set_fleet_share(Some((2, 5)));
    }
    let _mine: Vec<ReplicaSlot> = (0..4).map(|_| pool.pick(None, Room::Over(0), Tier::Batch, None).expect("within the part")).collect();
    assert_eq!(pool.pick(None, Room::Over(0), Tier::Batch, None).err(), Some(PickError::Saturated), "batch keeps to its part");
    // One seat on each replica is nobody's: interactive takes them, then no more.
    let _i1 = pool.pick(None, Room::Over(0), Tier::Interactive, None).expect("a free seat");
    let _i2 = pool.pick(None, Room::Over(0), Tier::Interactive, None).expect("the other free seat");
    assert_eq!(pool.pick(None, Room::Over(0), Tier::Interactive, None).err(), Some(PickError::Saturated), "2 + 5 + 1 = 8: full");
    assert_eq!((ra.inflight(), rb.inflight()), (3, 3));
    // The others have requests waiting, which fill their parts at once:
    // on an engine that serves first come, first served, no seat past
    // this instance's part; where it runs interactive requests first, as before.
    drop((_i1, _i2));
    pool.set_others_waiting(3);
    assert_eq!(pool.pick(None, Room::Over(0), Tier::Interactive, None).err(), Some(PickError::Saturated), "parts only");
    // ... unless the request has waited a fleet period: the others had one to fill their parts.
    assert!(pool.pick(None, Room::Patient(0), Tier::Interactive, None).is_ok(), "patient: the unheld seat");
    // ... or at once while that seat is in the others' reserved parts,
    // unused by their interactive requests: their waiting batch does not
    // fill it. The lending is the pool's: 2 seats free in the others'
    // reserved parts are 2 seats lent in all, whichever replicas they are
    // on, not 2 on each. Batch is lent none.
    pool.set_others_reserve_free(2);
    assert_eq!(pool.pick(None, Room::Over(0), Tier::Batch, None).err(), Some(PickError::Saturated), "batch keeps to its part");
    let lent: Vec<ReplicaSlot> =
        (0..2).map(|_| pool.pick(None, Room::Over(0), Tier::Interactive, None).expect("the others' unused reservation")).collect();
    assert_eq!(pool.pick(None, Room::Over(0), Tier::Interactive, None).err(), Some(PickError::Saturated), "2 lent in all");
    assert_eq!(ra.inflight() + rb.inflight(), 4 + 2);
    // A lent seat given back may be lent again.
    let mut lent = lent.into_iter();
    drop(lent.next());
    let again = pool.pick(None, Room::Over(0), Tier::Interactive, None).expect("lent again");
    assert_eq!(pool.pick(None, Room::Over(0), Tier::Interactive, None).err(), Some(PickError::Saturated), "still 2 lent in all");
    // With one seat free to lend across the two replicas, only one is taken.
    drop((again, lent));
    pool.set_others_reserve_free(1);
    let one = pool.pick(None, Room::Over(0), Tier::Interactive, None).expect("one lent");
    assert_eq!(
        pool.pick(None, Room::Over(0), Tier::Interactive, None).err(),
        Some(PickError::Saturated),
        "one seat lent in all, not one a replica"
    );
    assert_eq!(ra.inflight() + rb.inflight(), 4 + 1);
    drop(one);
    pool.set_others_reserve_free(0);
    let prio = two(8, true);
    prio.set_others_waiting(3);
    for r in &prio.replicas {
        r.set_fleet_share(Some((2, 5)));
    }
    let _mine: Vec<ReplicaSlot> = (0..4).map(|_| prio.pick(None, Room::Over(0), Tier::Batch, None).expect("within the part")).collect();
    assert!(prio.pick(None, Room::Over(0), Tier::Interactive, None).is_ok(), "the engine orders its queue: an unheld seat");
}

/// Lent seats on one replica: they are in its own count and in the
/// pool's, and lending counts each once (a seat counted in both lent about half
/// of what the others left free: the one replica of the llama.cpp fleet).
#[test]
fn a_replica_lends_every_seat_the_others_leave_free() {
    let cfg = PoolConfig {
        replicas: vec!["http://127.0.0.1:9".into()],
        max_inflight_per_replica: InflightLimit::Fixed(8),
        ..PoolConfig::default()
    };
    let access = Access::new(&cfg).expect("access");
    let pool = Pool::new(cfg, access, None);
    let r = pool.replicas[0].clone();
    r.set_healthy(true);
    // This instance's part: 2 of the 8; the others hold 3 and have requests waiting.
    r.set_fleet_share(Some((2, 3)));
    pool.set_others_waiting(3);
    let _mine: Vec<ReplicaSlot> = (0..2).map(|_| pool.pick(None, Room::Over(0), Tier::Batch, None).expect("within the part")).collect();
    pool.set_others_reserve_free(3);
    let lent: Vec<ReplicaSlot> =
        (0..3).map(|_| pool.pick(None, Room::Over(0), Tier::Interactive, None).expect("the others' unused reservation")).collect();
    assert_eq!(pool.pick(None, Room::Over(0), Tier::Interactive, None).err(), Some(PickError::Saturated), "3 lent, no more");
    assert_eq!((r.inflight(), pool.lent(), r.seats.lent.load(Ordering::Relaxed)), (5, 3, 3));
    // One given back is lent again, and the counts fall with the slots.
    let mut lent = lent.into_iter();
    drop(lent.next());
    let again = pool.pick(None, Room::Over(0), Tier::Interactive, None).expect("lent again");
    assert_eq!(pool.pick(None, Room::Over(0), Tier::Interactive, None).err(), Some(PickError::Saturated), "still 3 lent");
    drop((again, lent));
    assert_eq!((r.inflight(), pool.lent(), r.seats.lent.load(Ordering::Relaxed)), (2, 0, 0));
}

#[test]
fn the_prefill_count_falls_once_at_the_first_token_or_at_release() {
    let pool = two(8, false);
    let mut s = pool.pick(None, Room::Over(0), Tier::Interactive, None).expect("slot");
    let r = s.replica().clone();
    assert_eq!((r.prefilling(Tier::Interactive), r.inflight()), (1, 1));
    s.prefilled();
    s.prefilled();
    assert_eq!((r.prefilling(Tier::Interactive), r.inflight()), (0, 1));
    drop(s);
    assert_eq!((r.prefilling(Tier::Interactive), r.inflight()), (0, 0));
    // Given back before any token (a refusal, a client gone): counted off once.
    let mut s = pool.pick(None, Room::Over(0), Tier::Batch, None).expect("slot");
    let r = s.replica().clone();
    assert_eq!(r.prefilling(Tier::Batch), 1);
    s.release();
    s.release();
    drop(s);
    assert_eq!((r.prefilling(Tier::Batch), r.inflight()), (0, 0));
}
