//! Seats beyond an instance's own slots: the reserved share above them
//! with priority in the engine, the seats no instance of a fleet holds, a
//! limit cut below what is held, and short requests' seats of their own.

use super::*;

#[tokio::test(start_paused = true)]
async fn with_upstream_priority_the_reserved_share_is_interactives_whatever_batch_holds() {
    for priority in [false, true] {
        let pool = pool_with(20, tiers(0.25, 100, 100), priority);
        let mut held = Vec::new();
        for _ in 0..19 {
            held.push(take(&pool, Tier::Batch).await);
        }
        held.push(take(&pool, Tier::Interactive).await);
        // The share is 5 slots of 20; batch holds 19 (its limit).
        let mut more = 0;
        while let Ok(l) = pool.try_lease(Tier::Interactive) {
            held.push(l);
            more += 1;
        }
        assert_eq!(more, if priority { 4 } else { 0 }, "priority {priority}: interactive up to its share of 5, above the slots");
        if priority {
            // In a fleet of 100 slots the share is 25: the others' 10
            // interactive requests and these 5 leave room for 10 more.
            let whole = pool.fleet_reservation(100, 0);
            let word = |others_interactive| FleetWord {
                slots: 100,
                whole,
                part: pool.fleet_reservation(20, 0),
                others_interactive,
                others_batch: 0,
                period: Duration::ZERO,
            };
            pool.set_fleet(Some(word(10)));
            let mut fleet_more = 0;
            while let Ok(l) = pool.try_lease(Tier::Interactive) {
                held.push(l);
                fleet_more += 1;
            }
            assert_eq!(fleet_more, 10, "the fleet's share, less what the others hold");
            pool.set_fleet(Some(word(40)));
            assert!(pool.try_lease(Tier::Interactive).is_err(), "the others hold more than the share: none");
        }
    }
}

/// One replica of 9 seats shared by three instances, this one's part 3,
/// the replica running interactive requests first (`upstream_priority`):
/// batch here takes the seats the others' idle parts leave, within the
/// fleet's batch (9 less the fleet's reservation of 5), and within the
/// seats the others do not hold; interactive keeps this instance's part.
/// Without priority in the engine, batch keeps to its own part.
#[tokio::test(start_paused = true)]
async fn in_a_fleet_batch_takes_seats_no_instance_holds_within_the_fleets_batch() {
    let fcfs = pool(9, tiers(0.5, 10, 10));
    let whole = fcfs.fleet_reservation(9, 3);
    let part = crate::admission::seats::Reserve { normal: 2, at_risk: 2, headroom: 1 };
    fcfs.pool().replicas[0].set_fleet_share(Some((3, 0)));
    fcfs.set_fleet(Some(FleetWord { slots: 9, whole, part, others_interactive: 0, others_batch: 0, period: Duration::ZERO }));
    let own: Vec<_> = std::iter::from_fn(|| fcfs.try_lease(Tier::Batch).ok()).take(10).collect();
    assert_eq!(own.len(), 1, "first come, first served: batch keeps to its part less its reserved part");
    let pool = pool_with(9, tiers(0.5, 10, 10), true);
    let replica = pool.pool().replicas[0].clone();
    let whole = pool.fleet_reservation(9, 3);
    assert_eq!(whole.normal, 5);
    let part = crate::admission::seats::Reserve { normal: 2, at_risk: 2, headroom: 1 };
    let word = |others_batch| FleetWord { slots: 9, whole, part, others_interactive: 0, others_batch, period: Duration::ZERO };
    let mut batch = Vec::new();
    for (others_hold, others_batch, takes) in [(0, 0, 4), (6, 0, 3), (2, 2, 2)] {
        batch.clear();
        replica.set_fleet_share(Some((3, others_hold)));
        pool.set_fleet(Some(word(others_batch)));
        while let Ok(l) = pool.try_lease(Tier::Batch) {
            batch.push(l);
        }
        assert_eq!(batch.len(), takes, "others hold {others_hold} ({others_batch} batch)");
    }
    // Batch holds 2 here, past its own ceiling of 1: interactive still has
    // this instance's reserved part, and up to the replica's seats the
    // others do not hold (7 of 9).
    let interactive: Vec<_> = std::iter::from_fn(|| pool.try_lease(Tier::Interactive).ok()).take(10).collect();
    assert_eq!(interactive.len(), 5);
    // Alone again: batch keeps to its ceiling.
    drop((batch, interactive));
    replica.set_fleet_share(None);
    pool.set_fleet(None);
    let alone: Vec<_> = std::iter::from_fn(|| pool.try_lease(Tier::Batch).ok()).take(10).collect();
    assert_eq!(alone.len(), pool.batch_limit());
}

/// The seats no instance holds are the fleet's limit's, the smallest any
/// instance learned (fleet.md rule 4), not this instance's own: with its
/// own at 9, the fleet's at 6 and the others holding 3, batch past its
/// part stops at the 3 seats left, where its own limit would leave it the
/// fleet's batch of 4 and run the replica one past the fleet's limit.
#[tokio::test(start_paused = true)]
async fn in_a_fleet_the_seats_no_instance_holds_are_the_fleets_limits_not_its_own() {
    let pool = pool_with(9, tiers(0.5, 10, 10), true);
    let replica = pool.pool().replicas[0].clone();
    let whole = pool.fleet_reservation(9, 3);
    let part = crate::admission::seats::Reserve { normal: 2, at_risk: 2, headroom: 1 };
    pool.set_fleet(Some(FleetWord { slots: 9, whole, part, others_interactive: 0, others_batch: 0, period: Duration::ZERO }));
    replica.set_fleet_share(Some((3, 3)));
    let takes = |pool: &Arc<PoolAdmission>| std::iter::from_fn(|| pool.try_lease(Tier::Batch).ok()).take(10).collect::<Vec<_>>();
    assert_eq!(takes(&pool).len(), 4, "no fleet limit heard yet: its own 9, less the others' 3, within the fleet's batch");
    replica.set_fleet_limit(6);
    assert_eq!(takes(&pool).len(), 3, "the fleet's 6, less the others' 3");
}

/// On an engine that serves first come, first served, three instances
/// share a replica of 8: this one's part is 2, the others hold 5, one seat
/// is nobody's. While the others have requests waiting (which fill their
/// parts at once), a chat request past this part waits; once it has waited
/// a fleet period, the seat the others left unfilled for that period is its.
#[tokio::test(start_paused = true)]
async fn in_a_fleet_a_chat_request_that_waited_a_period_takes_the_seat_the_waiting_others_left() {
    let adm = pool(8, tiers(0.0, 10, 10));
    let replica = adm.pool().replicas[0].clone();
    replica.set_fleet_share(Some((2, 5)));
    adm.pool().set_others_waiting(3);
    let period = Duration::from_millis(100);
    adm.set_fleet(Some(FleetWord { slots: 8, period, ..FleetWord::default() }));
    let _own = [take(&adm, Tier::Interactive).await, take(&adm, Tier::Interactive).await];
    let waiter = queued(&adm, Tier::Interactive).await;
    // The fleet's next period comes before this one has waited a period: it waits.
    tokio::time::advance(Duration::from_millis(60)).await;
    adm.dispatch();
    settle().await;
    assert!(!waiter.is_finished(), "the others' waiting requests may fill their parts");
    assert_eq!(replica.inflight(), 2);
    // The period after: the seat is still nobody's, and it is this request's.
    tokio::time::advance(Duration::from_millis(60)).await;
    adm.dispatch();
    settle().await;
    assert!(waiter.is_finished(), "a fleet period waited");
    let granted = waiter.await.expect("task").expect("granted");
    assert!(granted.waited >= period);
    assert_eq!(replica.inflight(), 3, "2 + 5 + 1: the replica's 8");
    // No further: the replica is full as last heard.
    let next = queued(&adm, Tier::Interactive).await;
    tokio::time::advance(Duration::from_millis(150)).await;
    adm.dispatch();
    settle().await;
    assert!(!next.is_finished(), "no seat past the replica's limit");
    next.abort();
}

#[tokio::test(start_paused = true)]
async fn interactive_beyond_its_share_stays_within_the_slots_when_one_replicas_limit_falls() {
    let adm = replicas_with(2, 8, tiers(0.25, 10, 10), true);
    let pool = adm.pool();
    // Interactive only, every slot held: far past its reserved quarter.
    let mut held = Vec::new();
    for _ in 0..16 {
        held.push(adm.try_lease(Tier::Interactive).expect("a slot"));
    }
    assert!(adm.try_lease(Tier::Interactive).is_err(), "full");
    // One replica's limit falls to 2 (as a learned limit is cut), then the other's.
    for r in &pool.replicas {
        r.set_limit(2);
        assert!(adm.try_lease(Tier::Interactive).is_err(), "no replica takes more while the limits fall");
    }
    assert_eq!(pool.replicas.iter().map(|r| r.inflight()).sum::<usize>(), 16);
    // As streams end, the replicas come down to their new limits.
    held.truncate(4);
    assert!(adm.try_lease(Tier::Interactive).is_err(), "4 held on 2 x 2 slots");
    held.truncate(3);
    assert!(adm.try_lease(Tier::Interactive).is_ok(), "a slot free again");
}

/// Short requests have seats of their own (2 of a pool of 20 slots): with
/// every slot held by streams and the replica's limit just cut far below
/// what it holds, two take a seat at once; a third waits, and is judged by
/// its wait alone, not by the streams' time to a first token; a seat given
/// back takes the next one.
#[tokio::test(start_paused = true)]
async fn short_requests_take_seats_of_their_own_whatever_the_streams_hold() {
    let mut t = tiers(0.25, 10, 10);
    t.interactive.shed_late = true;
    let adm = pool(20, t);
    // The streams' first tokens come at the target: a chat request that would wait is late at once.
    for _ in 0..500 {
        adm.pool().replicas[0].record_first_token(Duration::from_millis(400), Duration::from_millis(400));
    }
    let streams: Vec<_> = std::iter::from_fn(|| adm.try_lease(Tier::Interactive).ok()).take(40).collect();
    assert_eq!(streams.len(), 20);
    // Cut to 15: 2 short seats (a tenth, rounded up); the 20 streams are 3 past 15 + 2.
    adm.pool().replicas[0].set_limit(15);
    let short = Claim { short: true, ttft: Some(Duration::from_millis(400)), ..claim(1) };
    let now = |c: Claim| {
        let p = adm.clone();
        async move { p.admit(Tier::Interactive, 0, c, None).await }
    };
    let a = now(short).await.expect("a short request's own seat");
    let _b = now(short).await.expect("the second of 2");
    let third = queued_as(&adm, short).await;
    assert_eq!(adm.depth(Tier::Interactive), 1, "past its seats it waits, judged by its wait alone");
    drop(a);
    settle().await;
    assert!(third.is_finished(), "a short seat given back goes to the next short request");
    assert!(third.await.expect("task").is_ok());
    // A chat request would wait for a stream's slot: with the streams' first
    // tokens at the target it cannot make it, and is refused at once.
    let chat = now(Claim { ttft: Some(Duration::from_millis(400)), ..claim(1) }).await;
    assert!(matches!(chat, Err(Refusal::Late { .. })), "{chat:?}");
    drop(streams);
}

/// A pool of one healthy replica whose limit is learned (the defaults:
/// 16 to start, in slow start).
fn learned(tiers: TiersConfig) -> Arc<PoolAdmission> {
    let cfg = PoolConfig { replicas: vec!["http://127.0.0.1:9".into()], ..PoolConfig::default() };
    assert_eq!(cfg.max_inflight_per_replica, crate::config::InflightLimit::Auto, "the default learns");
    let access = crate::upstream::Access::new(&cfg).expect("access");
    let pool = Arc::new(Pool::new(cfg, access, None));
    pool.replicas[0].set_healthy(true);
    let metrics = Metrics::new(&Config::default());
    pool.activate(&metrics);
    Arc::new(PoolAdmission::new(pool, tiers, &metrics))
}

#[tokio::test(start_paused = true)]
async fn a_fresh_learned_limit_takes_a_burst_of_200_without_queueing_it() {
    let pool = learned(tiers(0.25, 256, 256));
    assert_eq!(pool.pool().replicas[0].max_inflight(), 32, "slow start: twice the initial 16");
    let mut held = Vec::new();
    for i in 0..200 {
        let tier = if i % 4 == 0 { Tier::Batch } else { Tier::Interactive };
        held.push(pool.try_lease(tier).unwrap_or_else(|e| panic!("request {i} would queue: {e:?}")));
    }
    assert_eq!(pool.pool().replicas[0].max_inflight(), 256, "three doublings at once, no more before the next period");
    assert_eq!((pool.depth(Tier::Interactive), pool.depth(Tier::Batch)), (0, 0));
    // In a fleet the replica is shared: its limit waits for the period.
    let fleet = learned(tiers(0.25, 256, 256));
    fleet.pool().replicas[0].set_fleet_share(Some((16, 32)));
    let mut taken = 0;
    while let Ok(l) = fleet.try_lease(Tier::Interactive) {
        held.push(l);
        taken += 1;
    }
    assert!(taken < 40, "{taken} taken in a fleet");
}
