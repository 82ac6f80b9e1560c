//! The learned limit: how it starts, grows, backs off and holds its bounds.

use super::*;

/// Replicas whose capacity is no fixed number: one that takes a burst on a
/// few prompts a step, one whose capacity moves with its answers.
mod moving;

fn params() -> LimitParams {
    LimitParams { initial: 8, min: 1, max: 512, probe: Probe::Always }
}

/// A replica that runs `capacity` requests at once and queues the rest,
/// whose streams last `service` periods, under a demand that fills
/// whatever limit the gateway allows. Requests above a lowered limit
/// stay until they end (the gateway cannot take them back).
struct Replica {
    capacity: usize,
    service: usize,
    /// Requests the gateway has on it, running first.
    inflight: usize,
    /// Running requests' completions owed, carried between periods.
    carry: f64,
    /// What the gateway reports in transit to the replica's next step.
    in_transit: f64,
    /// The most requests the gateway has to send it (the rest of the
    /// demand waits in the gateway for other seats).
    demand: usize,
}

impl Replica {
    fn period(&mut self, limit: usize) -> Sample {
        let running = self.inflight.min(self.capacity);
        self.carry += running as f64 / self.service as f64;
        let done = (self.carry.floor() as usize).min(self.inflight);
        self.carry -= done as f64;
        self.inflight -= done;
        self.inflight = self.inflight.max(limit.min(self.demand));
        Sample {
            waiting: Some(self.inflight.saturating_sub(self.capacity) as f64),
            running: Some(self.inflight.min(self.capacity) as f64),
            waits_only_when_full: false,
            inflight_peak: self.inflight,
            inflight_now: self.inflight,
            demand: true,
            refused: false,
            first_token: Some(0.3),
            first_token_max: Some(0.5),
            in_transit: self.in_transit,
            batch_now: 0,
        }
    }
}

/// A model of a replica: what one period's sample says when the gateway allows `limit`.
trait Model {
    fn period(&mut self, limit: usize) -> Sample;
}

impl Model for Replica {
    fn period(&mut self, limit: usize) -> Sample {
        Replica::period(self, limit)
    }
}

fn run(c: &mut Controller, r: &mut impl Model, periods: usize) -> Vec<usize> {
    (0..periods)
        .map(|_| {
            c.update(r.period(c.allowed()));
            c.allowed()
        })
        .collect()
}

fn replica(capacity: usize) -> Replica {
    // 250 ms periods, 5 s streams.
    Replica { capacity, service: 20, inflight: 0, carry: 0.0, in_transit: 0.0, demand: usize::MAX }
}

#[test]
fn it_converges_to_the_replicas_capacity_from_below_and_above() {
    for (initial, capacity) in [(8, 64), (8, 200), (400, 48), (1, 3)] {
        let mut c = Controller::new(LimitParams { initial, ..params() });
        let limits = run(&mut c, &mut replica(capacity), 200);
        // After 15 s (60 periods of 250 ms) it stays within one of the capacity.
        let settled = &limits[60..];
        assert!(
            settled.iter().all(|&l| l + 1 >= capacity && l <= capacity + 1),
            "start {initial}, capacity {capacity}: {:?}",
            &limits[..60]
        );
    }
}

/// A fresh limit takes a burst at once and grows fast until the replica
/// first shows a queue, then settles by the usual rules.
#[test]
fn slow_start_takes_a_burst_at_once_then_settles_at_the_capacity() {
    let c = Controller::new(LimitParams { initial: 16, ..params() });
    assert_eq!(c.allowed(), 32, "32 streams on a fresh replica wait for nothing");
    let mut c = Controller::new(LimitParams { initial: 16, ..params() });
    let mut r = replica(200);
    let limits = run(&mut c, &mut r, 200);
    // 32, 64, 128, 256: past 200 within four periods (one second).
    assert!(limits[..4].iter().any(|&l| l >= 200), "{:?}", &limits[..8]);
    assert!(!c.slow_start(), "the queue past 200 ended it");
    assert!(limits[60..].iter().all(|&l| (199..=201).contains(&l)), "{:?}", &limits[..60]);
    // A limit that does not bind does not grow.
    let mut idle = Controller::new(LimitParams { initial: 16, ..params() });
    let quiet = Sample { waiting: Some(0.0), running: Some(2.0), inflight_peak: 2, inflight_now: 2, ..Sample::default() };
    for _ in 0..20 {
        idle.update(quiet);
    }
    assert_eq!(idle.allowed(), 32);
}

/// A burst larger than the slow-start limit doubles it at once, a few
/// times a period, while the replica queues nothing; never after slow
/// start, nor past the bound.
#[test]
fn in_slow_start_a_burst_doubles_the_limit_at_once_a_few_times_a_period() {
    let mut c = Controller::new(LimitParams { initial: 16, ..params() });
    let grown: Vec<usize> = std::iter::from_fn(|| c.grow_on_demand().then(|| c.allowed())).take(10).collect();
    assert_eq!(grown, vec![64, 128, 256], "three doublings before the next period");
    let quiet = Sample { waiting: Some(0.0), running: Some(200.0), inflight_peak: 200, inflight_now: 200, ..Sample::default() };
    c.update(quiet);
    assert!(c.grow_on_demand(), "a new period allows more");
    // The replica queues: slow start is over, and so is growth on demand.
    let queued = Sample { waiting: Some(50.0), running: Some(200.0), inflight_peak: 250, inflight_now: 250, ..Sample::default() };
    c.update(queued);
    c.update(queued);
    assert!(!c.slow_start());
    assert!(!c.grow_on_demand());
    // The bound holds.
    let mut small = Controller::new(LimitParams { initial: 16, min: 1, max: 40, probe: Probe::Always });
    while small.grow_on_demand() {}
    assert_eq!(small.allowed(), 40);
}

#[test]
fn it_does_not_oscillate_on_a_steady_load() {
    let mut c = Controller::new(params());
    let limits = run(&mut c, &mut replica(64), 400);
    let settled = &limits[60..];
    let (lo, hi) = (settled.iter().min().copied().unwrap_or(0), settled.iter().max().copied().unwrap_or(0));
    assert!(hi - lo <= 1, "band {lo}..={hi}");
    // Time above capacity (the replica queues one) is a small share.
    let above = settled.iter().filter(|&&l| l > 64).count();
    assert!(above * 4 <= settled.len(), "{above} of {} periods above capacity", settled.len());
}

/// With requests in transit (a third of one per engine step), the one
/// request the probe keeps waiting in the replica reads as in transit. The
/// ceiling must still be renewed by it, or it expires after 30-60 s and the
/// limit climbs past the replica's capacity, where chat's first tokens wait.
#[test]
fn the_probes_waiting_request_renews_the_ceiling_though_requests_are_in_transit() {
    let mut c = Controller::new(params());
    let mut r = Replica { in_transit: 0.3, ..replica(64) };
    let limits = run(&mut c, &mut r, 1200);
    let settled = &limits[60..];
    assert!(settled.iter().all(|&l| (63..=65).contains(&l)), "5 minutes within one of the capacity: {:?}", settled);
}

/// Batch held to its share fills the replica nearly, not wholly (62 of
/// 64), so for minutes no sample shows it full with one waiting; now and
/// then chat fills it. The ceiling learned at the last fill must hold
/// meanwhile: forgotten, the limit grows while batch nearly fills it, and
/// the next fill sends past the replica's capacity, where chat waits.
#[test]
fn a_ceiling_holds_while_the_replica_is_not_filled_and_grows_once_it_runs_more() {
    let mut c = Controller::new(params());
    let mut r = Replica { in_transit: 0.3, ..replica(64) };
    run(&mut c, &mut r, 60);
    let mut sent = Vec::new();
    for _ in 0..4 {
        r.demand = 62;
        run(&mut c, &mut r, 360);
        r.demand = usize::MAX;
        for _ in 0..20 {
            c.update(r.period(c.allowed()));
            sent.push(r.inflight);
        }
    }
    assert!(sent.iter().all(|&n| n <= 66), "each fill sends at most the probe past the 64 it runs: {sent:?}");
    // The replica grows: running the probe's request clears the ceiling.
    r.capacity = 96;
    let up = run(&mut c, &mut r, 240);
    assert!(up[200..].iter().all(|&l| (95..=97).contains(&l)), "{up:?}");
}

#[test]
fn it_backs_off_on_a_growing_waiting_queue_and_follows_a_lower_capacity() {
    let mut c = Controller::new(params());
    let mut r = replica(128);
    run(&mut c, &mut r, 120);
    assert!(c.limit() >= 127);
    // Prompts get twice as long: the replica now runs half as many.
    r.capacity = 64;
    let after = run(&mut c, &mut r, 80);
    assert!(after[..8].iter().any(|&l| l < 127), "it backs off within 2 s: {after:?}");
    assert!(after[..12].iter().any(|&l| l <= 65), "it reaches the new capacity within 3 s, though streams last 5 s: {after:?}");
    assert!(after.iter().all(|&l| l >= 63), "it never goes below the new capacity while the backlog drains: {after:?}");
    assert!(after[40..].iter().all(|&l| (63..=65).contains(&l)), "settled at the new capacity within 10 s: {after:?}");
    // Capacity comes back: the limit follows it up.
    r.capacity = 128;
    let up = run(&mut c, &mut r, 120);
    assert!(up[60..].iter().all(|&l| (127..=129).contains(&l)), "{up:?}");
}

#[test]
fn a_queue_seen_now_and_then_caps_it_one_above_what_the_replica_ran() {
    // A replica that runs 64 and whose queue shows only in every other
    // scrape (its steps and the scrapes out of phase): never two samples
    // in a row, so the queue alone never cuts the limit.
    let mut c = Controller::new(LimitParams { initial: 60, ..params() });
    let mut limits = Vec::new();
    for i in 0..400 {
        let l = c.limit();
        let over = l.saturating_sub(64) as f64;
        let shown = if i % 2 == 0 { over } else { 0.0 };
        let s = Sample {
            waiting: Some(shown),
            running: Some(l.min(64) as f64),
            inflight_peak: l,
            inflight_now: l,
            demand: true,
            ..Sample::default()
        };
        limits.push(c.update(s));
    }
    assert!(limits[100..].iter().all(|&l| l <= 65), "at most one above the 64 the replica ran: {:?}", &limits[..100]);
    assert!(limits[100..].iter().all(|&l| l >= 63), "{:?}", &limits[100..]);
    // The replica runs more (shorter prompts): the ceiling goes and the limit follows.
    let mut c2 = c.clone();
    for _ in 0..200 {
        let l = c2.limit();
        let s = Sample {
            waiting: Some(l.saturating_sub(100) as f64),
            running: Some(l.min(100) as f64),
            inflight_peak: l,
            inflight_now: l,
            demand: true,
            ..Sample::default()
        };
        c2.update(s);
    }
    assert!(c2.limit() >= 99, "{}", c2.limit());
    // A replica of 96 held full by bursts of 8: every other sample
    // catches a burst in transit (8 waiting, 8 fewer running), which the
    // next sample shows taken on. That is no queue: the limit stays.
    let mut c3 = Controller::new(LimitParams { initial: 96, ..params() });
    let mut lows = Vec::new();
    for i in 0..200 {
        let l = c3.limit();
        let transit = i % 2 == 0;
        let s = Sample {
            waiting: Some(if transit { 8.0 } else { 0.0 }),
            running: Some(l.min(96).saturating_sub(if transit { 8 } else { 0 }) as f64),
            inflight_peak: l,
            inflight_now: l,
            demand: true,
            ..Sample::default()
        };
        lows.push(c3.update(s));
    }
    assert!(lows.iter().all(|&l| l >= 95), "bursts in transit do not cap it: {lows:?}");
}

#[test]
fn where_the_pool_preempts_it_stays_at_the_ceiling_not_one_above() {
    // An engine with 8 hard slots (llama.cpp's server): a request past
    // them waits inside it, where a chat request cannot be seen queuing.
    let limits = |probe| {
        let mut c = Controller::new(LimitParams { initial: 16, probe, ..params() });
        run(&mut c, &mut replica(8), 400)[200..].to_vec()
    };
    let probing = limits(Probe::Always);
    assert!(probing.iter().all(|&l| (8..=9).contains(&l)) && probing.contains(&9), "{probing:?}");
    let at_slots = limits(Probe::Never);
    assert!(at_slots.iter().filter(|&&l| l == 8).count() >= at_slots.len() * 9 / 10, "{at_slots:?}");
    // Above the slots only for a look once the ceiling is forgotten (30 s or more).
    assert!(at_slots.iter().filter(|&&l| l > 8).count() <= at_slots.len() / 20, "{at_slots:?}");
    assert!(at_slots.iter().all(|&l| (7..=10).contains(&l)), "{at_slots:?}");
}

#[test]
fn a_preempting_pool_in_front_of_a_priority_engine_probes_while_batch_is_alone() {
    // Batch alone (no interactive first token for a window): one above the
    // ceiling, so a slot the engine frees is taken at once from its queue.
    // Interactive first tokens again: back to the ceiling within a window.
    let mut c = Controller::new(LimitParams { initial: 16, probe: Probe::WhileBatchAlone, ..params() });
    let mut r = replica(8);
    let mut step = |c: &mut Controller, interactive: bool| {
        let mut s = r.period(c.allowed());
        if !interactive {
            s.first_token = None;
            s.first_token_max = None;
        }
        c.update(s);
        c.allowed()
    };
    let alone: Vec<usize> = (0..400).map(|_| step(&mut c, false)).collect();
    assert!(alone[200..].iter().all(|&l| (8..=9).contains(&l)) && alone[200..].contains(&9), "{alone:?}");
    let with_chat: Vec<usize> = (0..400).map(|_| step(&mut c, true)).collect();
    let at_slots = &with_chat[200..];
    assert!(at_slots.iter().filter(|&&l| l == 8).count() >= at_slots.len() * 9 / 10, "{with_chat:?}");
}

#[test]
fn requests_in_transit_to_the_next_engine_step_are_no_queue() {
    // A replica that runs 56 of a limit of 65 (it has room), sent a
    // third of a request per engine step: most scrapes see none waiting,
    // some one, now and then several in a row. Known to be in transit,
    // that is no queue and the limit stays; taken for a queue, it is cut
    // to what the replica ran.
    for (in_transit, kept) in [(0.3, true), (0.0, false)] {
        let mut c = Controller::new(LimitParams { initial: 65, ..params() });
        let mut limits = Vec::new();
        for i in 0..40 {
            let s = Sample {
                waiting: Some(if i % 8 < 3 { 1.0 } else { 0.0 }),
                running: Some(55.0),
                inflight_peak: 56,
                inflight_now: 56,
                in_transit,
                ..Sample::default()
            };
            limits.push(c.update(s));
        }
        assert_eq!(limits.iter().all(|&l| l == 65), kept, "in transit {in_transit}: {limits:?}");
    }
    // A real queue beyond what is in transit still cuts it.
    let mut c = Controller::new(LimitParams { initial: 65, ..params() });
    for _ in 0..2 {
        c.update(Sample {
            waiting: Some(6.0),
            running: Some(59.0),
            inflight_peak: 65,
            inflight_now: 65,
            in_transit: 0.3,
            ..Sample::default()
        });
    }
    assert!(c.limit() <= 60, "{}", c.limit());
}

#[test]
fn late_first_tokens_under_load_make_batch_leave_seats_and_the_limit_holds() {
    let mut c = Controller::new(LimitParams { initial: 60, ..params() });
    let at = |share, batch_now| Sample {
        waiting: Some(0.0),
        // Not binding: the limit has no reason to grow either.
        inflight_peak: 50,
        inflight_now: 50,
        first_token: Some(share),
        batch_now,
        ..Sample::default()
    };
    // The best first token so far sets what "late under load" is.
    assert_eq!(c.update(at(0.4, 30)), 60);
    assert_eq!(c.batch_cut(), 0);
    // Over target and over twice the best, batch held here: batch leaves
    // a tenth of the limit; the limit (interactive's seats) does not move.
    assert_eq!(c.update(at(1.5, 30)), 60);
    assert_eq!(c.batch_cut(), 6);
    // Held for a few periods, then a tenth more while first tokens stay late.
    for _ in 0..HOLD_AFTER_DECREASE {
        assert_eq!(c.update(at(1.5, 30)), 60);
        assert_eq!(c.batch_cut(), 6);
    }
    let mut cuts = Vec::new();
    for _ in 0..40 {
        assert_eq!(c.update(at(1.5, 30)), 60);
        cuts.push(c.batch_cut());
    }
    assert_eq!(cuts[0], 12);
    assert_eq!(cuts.last().copied(), Some(30), "at most half the limit: {cuts:?}");
    // On target again: a seat back each period after the hold.
    let back: Vec<_> = (0..HOLD_AFTER_DECREASE as usize + 40).map(|_| (c.update(at(0.5, 30)), c.batch_cut()).1).collect();
    assert!(back.windows(2).all(|w| w[1] + 1 >= w[0] && w[1] <= w[0]), "{back:?}");
    assert_eq!(back.last().copied(), Some(0));
    // Late with no batch held here: only the limit itself can make room.
    assert_eq!(c.update(at(1.5, 0)), 54);
    assert_eq!(c.batch_cut(), 0);
}

#[test]
fn refusals_cut_it_hard_and_a_slow_replica_or_no_demand_stops_growth() {
    let mut c = Controller::new(LimitParams { initial: 100, ..params() });
    let l = c.update(Sample { refused: true, inflight_peak: 100, ..Sample::default() });
    assert_eq!(l, 70);
    // Held for a while, then grows again while it binds and nothing queues.
    for _ in 0..HOLD_AFTER_REFUSAL {
        assert_eq!(c.update(Sample { waiting: Some(0.0), inflight_peak: 70, ..Sample::default() }), 70);
    }
    assert!(c.update(Sample { waiting: Some(0.0), inflight_peak: 70, ..Sample::default() }) > 70);
    let now = c.limit();
    // Interactive first tokens over their target: no growth.
    let late = |share| Sample { waiting: Some(0.0), inflight_peak: now, first_token: Some(share), ..Sample::default() };
    assert!(c.update(late(0.6)) > now, "on target: it grows");
    let now = c.limit();
    assert_eq!(c.update(late(1.1)), now, "over target but near its best (long prompts): it holds");
    let one_late =
        Sample { waiting: Some(0.0), inflight_peak: now, first_token: Some(0.4), first_token_max: Some(1.3), ..Sample::default() };
    assert_eq!(c.update(one_late), now, "one of the period's first tokens over its target: no growth");
    // Over target and over twice its best: load; cut by a tenth.
    assert_eq!(c.update(late(1.5)), (now as f64 * 0.9).floor() as usize);
    // Demand below the limit: no growth either (past the hold after the cut).
    let now = c.limit();
    for _ in 0..HOLD_AFTER_DECREASE + 4 {
        assert_eq!(c.update(Sample { waiting: Some(0.0), inflight_peak: now / 2, first_token: Some(0.5), ..Sample::default() }), now);
    }
    // Within a tenth of the limit: growth only when requests wait for slots.
    let mut c = Controller::new(LimitParams { initial: 50, ..params() });
    let near = |demand| Sample { waiting: Some(0.0), inflight_peak: 46, demand, first_token: Some(0.5), ..Sample::default() };
    assert_eq!(c.update(near(false)), 50, "no one waits: 46 of 50 is not binding");
    assert!(c.update(near(true)) > 50, "requests wait: it grows");
    // Bounds hold.
    let mut c = Controller::new(LimitParams { initial: 8, min: 4, max: 10, probe: Probe::Always });
    assert_eq!(run(&mut c, &mut replica(1000), 50).last().copied(), Some(10));
    assert_eq!(run(&mut c, &mut replica(1), 200).last().copied(), Some(4));
}

#[test]
fn below_the_cap_it_is_not_forgotten_and_past_a_forgotten_one_it_grows_one_at_a_time() {
    // A preempting pool (no probe) forgets the cap only after windows of
    // periods that used all of it without a queue: batch alone holding all
    // but the headroom's seat says nothing of the replica. The cap
    // forgotten there let the limit go 8 -> 10 -> 14 past llama.cpp's 8
    // slots in half a second once chat came, and three chat requests
    // waited 430-615 ms inside the engine.
    let mut c = Controller::new(LimitParams { initial: 16, probe: Probe::Never, ..params() });
    let mut r = replica(8);
    run(&mut c, &mut r, 200);
    assert_eq!((c.limit(), c.ceiling()), (8, Some(8.0)));
    r.demand = 7;
    let quiet = run(&mut c, &mut r, 3 * CEILING_SAMPLES as usize);
    assert_eq!(c.ceiling(), Some(8.0), "kept below it");
    r.demand = usize::MAX;
    let busy = run(&mut c, &mut r, 40);
    assert!(quiet.iter().all(|&l| l == 8), "at the slots: {quiet:?}");
    // Used whole again, it may look one past the slots once a window of
    // that passes without a queue, and comes back.
    assert!(busy.iter().all(|&l| l <= 9), "{busy:?}");
    // Used whole for windows without a queue (the replica could now run
    // more, and does not show it): forgotten, then looked past a seat at a
    // time, as near a knee, not by its square root.
    let mut c = Controller::new(LimitParams { initial: 8, probe: Probe::Never, ..params() });
    c.ceiling = [Some(8.0), None];
    c.slow_start = false;
    let mut r = replica(12);
    let grown = run(&mut c, &mut r, 3 * CEILING_SAMPLES as usize);
    let first = grown.iter().position(|&l| l > 8).expect("it grows once forgotten");
    assert!(first + 1 >= CEILING_SAMPLES as usize, "not before a window at the cap: {first}");
    assert_eq!(grown[first], 9, "a seat at a time: {grown:?}");
    assert!(grown.iter().all(|&l| l <= 13), "{grown:?}");
}

#[test]
fn slots_the_engine_declares_bound_slow_start_growth_and_a_burst() {
    // 16 to start (slow start offers 32) on an engine that declares 8.
    let mut c = Controller::new(LimitParams { initial: 16, ..params() });
    assert_eq!(c.allowed(), 32);
    c.declare(Some(8));
    assert_eq!((c.limit(), c.allowed()), (8, 8), "within the 8 slots at once");
    assert!(!c.grow_on_demand() || c.allowed() <= 8);
    let limits = run(&mut c, &mut replica(8), 80);
    assert!(limits.iter().all(|&l| l <= 8), "{limits:?}");
    assert_eq!(limits.last(), Some(&8), "and at them while the load fills them: {limits:?}");
    // More slots (a restarted server): the limit may grow to them, not past.
    c.declare(Some(12));
    let limits = run(&mut c, &mut replica(12), 200);
    assert!(limits.iter().all(|&l| l <= 12), "{limits:?}");
    assert_eq!(limits.last(), Some(&12), "{limits:?}");
    // A floor the operator set stays the floor; zero slots are no word.
    let mut c = Controller::new(LimitParams { initial: 16, min: 4, ..params() });
    c.declare(Some(2));
    assert_eq!(c.allowed(), 4);
    let mut c = Controller::new(LimitParams { initial: 16, ..params() });
    c.declare(Some(0));
    assert_eq!(c.allowed(), 32);
}

/// Past the slow start and far from any knee, a limit that binds grows by
/// its square root. A replica that runs all its slots with one request
/// waiting, within what is in transit, and took none on since the sample
/// before, is most likely at them: the limit looks past them a seat at a
/// time (a sample later, a queue beyond what is in transit cuts it back).
/// One that took requests on is not at its slots, and the square root holds.
#[test]
fn a_replica_at_its_slots_with_requests_in_transit_is_looked_past_a_seat_at_a_time() {
    for (running_before, grown) in [(64.0, 65), (60.0, 72)] {
        let mut c = Controller::new(LimitParams { initial: 64, ..params() });
        c.slow_start = false;
        c.running = Some(running_before);
        let s =
            Sample { waiting: Some(1.0), running: Some(64.0), inflight_peak: 64, inflight_now: 64, in_transit: 1.5, ..Sample::default() };
        assert_eq!(c.update(s), grown, "running {running_before} at the sample before");
    }
}

/// Three gateways in front of llama.cpp's 8 hard slots (the pool preempts,
/// so no probe): the fleet holds what the limit allows, and now and then a
/// peer's request the others have not heard of yet puts one more on the
/// replica (counts a period stale), so a sample sees one more there than
/// the gateway counts, or one waiting, for a period or two. `external`
/// requests of another client run there all the time.
struct Stale {
    slots: usize,
    external: usize,
    every: usize,
    period: usize,
}

impl Stale {
    /// A sample of a slot-bound engine where the gateway counts `ours`.
    fn at(ours: usize) -> Sample {
        Sample {
            waits_only_when_full: true,
            inflight_peak: ours,
            inflight_now: ours,
            demand: true,
            first_token: Some(0.3),
            first_token_max: Some(0.5),
            ..Sample::default()
        }
    }
}

impl Model for Stale {
    fn period(&mut self, limit: usize) -> Sample {
        self.period += 1;
        let ours = limit.min(self.slots);
        let unheard = usize::from(self.period % self.every < 2);
        let there = ours + unheard + self.external;
        Sample { waiting: Some(there.saturating_sub(self.slots) as f64), running: Some(there.min(self.slots) as f64), ..Stale::at(ours) }
    }
}

/// A sample's share reads a seat low whenever a peer's request is not
/// heard of yet; read that way, the queue it makes set a ceiling of 7 on 8
/// slots that held for minutes (`limits-llamacpp/fleet`: one instance's
/// limit at 7 for 77 of 95 s, and the fleet's with it, as a replica's
/// limit is the smallest any instance learned). Averaged, the share is the
/// fleet's whole, and the limit stays at the slots. Another client's
/// request there all the time is no staleness: the limit leaves its seat.
#[test]
fn a_peers_request_not_heard_of_yet_does_not_cap_the_fleet_below_the_slots() {
    let params = LimitParams { initial: 8, probe: Probe::Never, ..params() };
    let mut c = Controller::new(params);
    c.declare(Some(8));
    let limits = run(&mut c, &mut Stale { slots: 8, external: 0, every: 20, period: 0 }, 480);
    let at_slots = limits[40..].iter().filter(|&&l| l == 8).count();
    assert!(at_slots >= (limits.len() - 40) * 95 / 100, "at the 8 slots nearly always: {limits:?}");

    let mut c = Controller::new(params);
    c.declare(Some(8));
    let limits = run(&mut c, &mut Stale { slots: 8, external: 1, every: 20, period: 0 }, 480);
    let left = limits[40..].iter().filter(|&&l| l <= 7).count();
    assert!(left >= (limits.len() - 40) * 9 / 10, "the other client's seat left to it: {limits:?}");

    // A fleet's first samples, before the others' counts are heard: the
    // replica runs and queues 9 of which this instance counts 2.
    let mut c = Controller::new(params);
    c.declare(Some(8));
    let first = Sample { waiting: Some(1.0), running: Some(8.0), inflight_now: 2, inflight_peak: 2, ..Stale::at(8) };
    let mut limits: Vec<usize> = (0..2).map(|_| c.update(first)).collect();
    limits.extend(run(&mut c, &mut Stale { slots: 8, external: 0, every: 1000, period: 2 }, 40));
    assert!(limits.iter().all(|&l| l >= 7), "{limits:?}");
    assert!(limits[20..].iter().all(|&l| l == 8), "back at the slots within 5 s: {limits:?}");
}

/// llama.cpp's server queues a request only while every slot is busy, but
/// a scrape caught as a slot passes from a finished request to a waiting
/// one reads one low: 7 running and 1 waiting on its 8 slots. Read as a
/// capacity of 7, it set a ceiling that, with no probe (the pool
/// preempts), only the replica running 8 could clear, which the limit of 7
/// no longer let it: one instance's limit, and the fleet's with it, sat at
/// 7 for the rest of a `limits-llamacpp/fleet` run (92 s).
#[test]
fn a_slot_caught_passing_to_a_waiting_request_is_no_capacity_below_the_declared_slots() {
    let mut c = Controller::new(LimitParams { initial: 8, probe: Probe::Never, ..params() });
    c.declare(Some(8));
    let at = |running: f64, waiting: f64, ours: usize| Sample { waiting: Some(waiting), running: Some(running), ..Stale::at(ours) };
    let mut limits = Vec::new();
    for period in 0..480 {
        let l = c.allowed();
        let s = if period % 40 < 2 { at(7.0, 1.0, l) } else { at(l.min(8) as f64, 0.0, l) };
        c.update(s);
        limits.push(c.allowed());
    }
    let at_slots = limits[40..].iter().filter(|&&l| l == 8).count();
    assert!(at_slots >= (limits.len() - 40) * 95 / 100, "at the 8 slots: {limits:?}");
}
