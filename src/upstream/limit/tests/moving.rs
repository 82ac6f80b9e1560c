//! Replicas whose capacity is no fixed number.

use super::*;

/// A replica that takes on at most `admit` waiting requests a period (its
/// engine's token budget per step, spent on their prompts): a burst waits
/// in it while it fills its `capacity` slots, a queue that is no sign of
/// the capacity. The gateway sends it up to `demand` requests.
struct Ramping {
    capacity: usize,
    admit: usize,
    service: usize,
    demand: usize,
    inflight: usize,
    running: usize,
    carry: f64,
}

impl Ramping {
    fn new(capacity: usize, admit: usize) -> Ramping {
        Ramping { capacity, admit, service: 20, demand: usize::MAX, inflight: 0, running: 0, carry: 0.0 }
    }

    fn period(&mut self, limit: usize) -> Sample {
        self.carry += self.running as f64 / self.service as f64;
        let done = (self.carry.floor() as usize).min(self.running);
        self.carry -= done as f64;
        self.running -= done;
        self.inflight = (self.inflight - done).max(limit.min(self.demand));
        self.running = self.inflight.min(self.capacity).min(self.running.saturating_add(self.admit));
        Sample {
            waiting: Some((self.inflight - self.running) as f64),
            running: Some(self.running as f64),
            inflight_peak: self.inflight,
            inflight_now: self.inflight,
            demand: self.demand > 0,
            first_token: Some(0.3),
            first_token_max: Some(0.5),
            ..Sample::default()
        }
    }
}

impl Model for Ramping {
    fn period(&mut self, limit: usize) -> Sample {
        Ramping::period(self, limit)
    }
}

#[test]
fn a_burst_the_replica_takes_on_a_few_prompts_a_step_is_no_sign_of_its_capacity() {
    // 64 slots, learned; then nothing for 10 s, and a burst of 64 that the
    // replica takes on 6 a period: they wait in it for a few seconds while
    // it runs 6, 12, 18, ... of them. Read as a queue at capacity, that cut
    // the limit to what the replica ran then (64, 32, 18, and 9 s to climb
    // back).
    let mut c = Controller::new(LimitParams { initial: 64, ..params() });
    let mut r = Ramping::new(64, usize::MAX);
    let learned = run(&mut c, &mut r, 80);
    assert!(learned[40..].iter().all(|&l| (63..=65).contains(&l)), "learned 64: {learned:?}");
    r.demand = 0;
    run(&mut c, &mut r, 40);
    // The last streams end.
    (r.inflight, r.running, r.carry) = (0, 0, 0.0);
    run(&mut c, &mut r, 4);
    (r.demand, r.admit) = (usize::MAX, 6);
    let burst = run(&mut c, &mut r, 60);
    assert!(burst.iter().all(|&l| l >= 63), "the queue of a burst being taken on cut it: {burst:?}");

    // In a fleet our share of what the replica runs counts the other
    // instances' requests as last heard, a period stale: while the replica
    // took a burst on (8 running, then 12), the share read low (15 of the
    // 23 there) and made a ceiling of 8, and the limit went to half.
    let mut c = Controller::new(LimitParams { initial: 32, ..params() });
    let at = |running: f64, waiting: f64, ours: usize| Sample {
        waiting: Some(waiting),
        running: Some(running),
        inflight_peak: ours,
        inflight_now: ours,
        demand: true,
        ..Sample::default()
    };
    c.update(at(4.0, 0.0, 4));
    c.update(at(8.0, 3.0, 11));
    c.update(at(12.0, 11.0, 15));
    assert_eq!(c.ceiling(), None, "a ceiling read while the replica took more on");
    assert!(c.limit() >= 32, "{}", c.limit());

    // Where a request waits only while every slot is busy (llama.cpp's
    // server), a slot that freed between two samples was refilled at once:
    // the queue is one at capacity however the running count moved.
    let mut c = Controller::new(LimitParams { initial: 12, probe: Probe::Never, ..params() });
    let full = |running: f64, waiting: f64| Sample { waits_only_when_full: true, ..at(running, waiting, 12) };
    c.update(full(7.0, 4.0));
    c.update(full(8.0, 4.0));
    assert_eq!(c.limit(), 8, "the queue at the 8 slots cut the limit to them");
    c.update(full(8.0, 4.0));
    assert_eq!(c.ceiling(), Some(8.0), "and made them its ceiling");
}

/// A replica bound by its KV cache: how many requests it runs moves with
/// how far their answers have run, here through `capacities`, a period
/// each. `interactive`: interactive first tokens come (else batch alone).
struct Moving {
    r: Replica,
    capacities: Vec<usize>,
    at: usize,
    interactive: bool,
}

impl Model for Moving {
    fn period(&mut self, limit: usize) -> Sample {
        self.r.capacity = self.capacities[self.at % self.capacities.len()];
        self.at += 1;
        let s = self.r.period(limit);
        if self.interactive {
            s
        } else {
            Sample { first_token: None, first_token_max: None, ..s }
        }
    }
}

#[test]
fn where_the_capacity_moves_batch_leaves_interactive_the_seats_it_moves_by() {
    // 51 to 64 requests fit, a few more or fewer each period: the ceiling
    // (the most it ran with a queue) is above what it runs most of the time.
    let capacities = vec![57, 55, 56, 54, 52, 53, 51, 53, 55, 58, 60, 62, 64, 61, 59, 60, 57, 58, 56, 54, 55, 53, 56, 58, 57, 59];
    let moving = |interactive| Moving { r: replica(64), capacities: capacities.clone(), at: 0, interactive };
    let mut c = Controller::new(LimitParams { initial: 64, probe: Probe::WhileBatchAlone, ..params() });
    let mut r = moving(true);
    let mut cuts = Vec::new();
    for _ in 0..240 {
        c.update(r.period(c.allowed()));
        cuts.push(c.batch_cut());
    }
    let late = &cuts[120..];
    assert!(late.iter().all(|&cut| (2..=c.limit() / 2).contains(&cut)), "batch leaves the spread's seats: {cuts:?}");
    assert_eq!(cuts[..MOVING_READINGS].iter().max(), Some(&0), "not before enough queues were read: {cuts:?}");

    // The same replica with batch alone: nobody to leave seats for.
    let mut c = Controller::new(LimitParams { initial: 64, probe: Probe::WhileBatchAlone, ..params() });
    let mut r = moving(false);
    let cuts: Vec<usize> = (0..240).map(|_| (c.update(r.period(c.allowed())), c.batch_cut()).1).collect();
    assert_eq!(cuts.iter().max(), Some(&0), "{cuts:?}");

    // A capacity that stays put (bound by its slots), a queue now and then
    // read one low (a request caught between its arrival and the next
    // step): no cut.
    let mut c = Controller::new(LimitParams { initial: 64, probe: Probe::WhileBatchAlone, ..params() });
    let mut r = Moving { capacities: vec![64, 64, 64, 63], ..moving(true) };
    let cuts: Vec<usize> = (0..240).map(|_| (c.update(r.period(c.allowed())), c.batch_cut()).1).collect();
    assert_eq!(cuts.iter().max(), Some(&0), "{cuts:?}");
}
