//! Learned in-flight limits (`max_inflight_per_replica: auto`): per replica,
//! the largest in-flight count that keeps the replica's own waiting queue
//! empty. Each period the controller reads a sample, classifies the period
//! (refused, queued, over the ceiling, loaded, hold, free) and acts; its
//! numbers are the named constants below, each with its reason. The rules
//! are docs/design/learned-limits.md's.

use std::collections::VecDeque;

/// Bounds and start of a learned limit (`pools[].learned_limit`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct LimitParams {
    pub(crate) initial: usize,
    pub(crate) min: usize,
    pub(crate) max: usize,
    /// Whether the limit goes one above the ceiling (see [`Probe`]).
    pub(crate) probe: Probe,
}

/// How far above the ceiling (what the replica ran while requests waited
/// in it) a limit goes (docs/design/learned-limits.md, rule 6).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Probe {
    /// One above: a slot the replica frees is taken at once from its own queue.
    Always,
    /// At the ceiling: the pool preempts in front of an engine that serves
    /// first come, first served.
    Never,
    /// At the ceiling, but one above while no interactive first token came
    /// for a window ([`CEILING_SAMPLES`]): the pool preempts in front of an
    /// engine that orders its own queue by priority, where the probe's
    /// request never waits ahead of an interactive one, so batch alone
    /// keeps every slot busy.
    WhileBatchAlone,
}

/// What one control period saw of a replica.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Sample {
    /// The replica's own waiting queue; `None` when it could not be scraped.
    pub(crate) waiting: Option<f64>,
    /// The requests the replica runs (`vllm:num_requests_running`), when scraped.
    pub(crate) running: Option<f64>,
    /// Its queue says it is full, however `running` moved (see
    /// [`Load::waits_only_when_full`](super::replica::Load)).
    pub(crate) waits_only_when_full: bool,
    /// The most requests the gateway had on the replica in the period.
    pub(crate) inflight_peak: usize,
    /// The requests the gateway has on the replica now.
    pub(crate) inflight_now: usize,
    /// Requests wait in the gateway for the pool's slots.
    pub(crate) demand: bool,
    /// The replica answered 429 or 503 in the period.
    pub(crate) refused: bool,
    /// Interactive requests' time from dispatch to first token over their
    /// class's TTFT target, the period's mean (1.0 = on target).
    pub(crate) first_token: Option<f64>,
    /// The same, the period's latest (largest share).
    pub(crate) first_token_max: Option<f64>,
    /// The requests the gateway sends the replica in one of its engine
    /// steps, on average (0 when not known): about that many are in its
    /// waiting queue between their arrival and its next step, whatever its load.
    pub(crate) in_transit: f64,
    /// Batch requests the gateway has on the replica now.
    pub(crate) batch_now: usize,
}

/// Samples the limit is held after it went down.
const HOLD_AFTER_DECREASE: u32 = 4;
/// Samples it is held after the replica refused work: longer, it said so itself.
const HOLD_AFTER_REFUSAL: u32 = 8;
/// The longest wait between probes above a known capacity (8 s at 250 ms).
const MAX_PROBE_HOLD: u32 = 32;
/// A refusal (429, 503) takes the limit to this part of itself: back off hard.
const REFUSAL_CUT: f64 = 0.7;
/// A queue takes the limit down by at most a quarter at once...
const QUEUE_CUT_FLOOR: f64 = 0.75;
/// ...and no decrease takes it below half of itself, whatever the replica runs.
const DECREASE_FLOOR: f64 = 0.5;
/// Late first tokens with only interactive requests here: a tenth fewer of them.
const LOAD_CUT: f64 = 0.9;
/// First tokens are late because of load when the period's mean share is
/// over this many times its own recent best (long prompts alone are not).
const LOADED_OVER_BEST: f64 = 2.0;
/// The best first-token share creeps up this much a period, so it follows
/// prompts that stay longer.
const BEST_CREEP: f64 = 1.01;
/// Batch leaves this part of the limit more to interactive at each late period...
const BATCH_CUT_STEP: f64 = 0.1;
/// ...up to this part of it.
const BATCH_CUT_MAX: f64 = 0.5;
/// With requests waiting for slots, the limit binds at this part of it
/// (the interactive headroom keeps batch alone a little under it).
const BINDS_WITH_DEMAND: f64 = 0.9;
/// A queue again within this many of the last knee is the same capacity found again.
const SAME_KNEE: f64 = 2.0;
/// Past the knee by this factor (and two more), capacity grew: forget the knee.
const KNEE_FORGOTTEN: f64 = 1.25;
/// Requests in transit count as queued beyond their mean plus this many
/// standard deviations (a Poisson count).
const TRANSIT_SIGMAS: f64 = 2.0;
/// In slow start (no sign of the replica's capacity seen yet) the replica
/// takes this many times the limit, so a burst does not wait for the next
/// period, and the limit grows by this factor each period it binds.
const SLOW_START: f64 = 2.0;
/// In slow start, requests that find every slot taken double the limit at
/// once this many times between two periods (the replica takes up to
/// `SLOW_START * 2^3` times the limit of the last period before its next
/// sample says whether anything queued).
const DEMAND_DOUBLINGS: u32 = 3;

/// What one period says, once its sample is read.
#[derive(Debug, Clone, Copy)]
struct Period {
    /// Waiting beyond requests in transit, now and the sample before.
    waiting: f64,
    prev: f64,
    /// A queue in both: one that stayed.
    queued: f64,
    /// Requests sent under a higher limit that have not ended yet.
    backlog: f64,
    /// An interactive first token over its target in the period.
    slow: bool,
    /// ...and the period's mean over twice its recent best: load.
    loaded: bool,
    /// The replica runs more than at the sample before: it is taking its
    /// queue on (a burst's prompts admitted a few per step, as the engine's
    /// token budget for a step allows), so the queue is no sign of its
    /// capacity.
    taking_on: bool,
}

/// What the controller does about a period.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Verdict {
    /// The replica refused work.
    Refused,
    /// A queue that stayed, beyond any backlog: past capacity.
    Queued,
    /// A queue now, and the limit more than one above the ceiling `c`.
    OverCeiling(f64),
    /// First tokens late because of load, only interactive here.
    Loaded,
    /// Draining a backlog, or holding after a cut.
    Hold,
    /// Nothing against it: grow if the limit binds.
    Free,
}

/// One replica's learned limit.
#[derive(Debug, Clone)]
pub(crate) struct Controller {
    params: LimitParams,
    limit: f64,
    /// The limit at which a queue last appeared.
    knee: Option<f64>,
    hold: u32,
    /// The hold after a decrease: doubled each time a probe above the
    /// capacity finds the same knee again (up to [`MAX_PROBE_HOLD`]).
    probe_hold: u32,
    /// The previous sample's waiting queue.
    waiting: f64,
    /// The previous sample's running count, when scraped.
    running: Option<f64>,
    /// The lowest first-token share seen lately (it creeps up 1 % a period,
    /// so it follows prompts that stay longer).
    best_first_token: Option<f64>,
    /// The most the replica ran for us in a sample where anything waited,
    /// over this and the previous [`CEILING_SAMPLES`] (with a probe, the
    /// last window that saw one): what it runs at most now. The limit goes
    /// at most one above it (a probe); the replica running more than it
    /// clears it.
    ceiling: [Option<f64>; 2],
    samples: u32,
    /// The running count of the previous sample (our part, and all of it),
    /// when something waited in it.
    pending: Option<(f64, f64)>,
    /// What the replica ran (every client's requests) at each queue that
    /// counted lately, with the period it came in: how far its capacity
    /// moves (see [`Controller::moving_cut`]).
    capacities: VecDeque<(u32, f64)>,
    /// Seats batch leaves to interactive requests because the replica's
    /// capacity moves under the limit (see [`Controller::moving_cut`]).
    moving_cut: f64,
    /// Periods since the controller started (wraps).
    periods: u32,
    /// Seats of the limit batch leaves to interactive requests, because
    /// their first tokens came late under load (see [`Controller::batch_cut`]).
    batch_cut: f64,
    /// Samples before the batch cut may grow again.
    batch_hold: u32,
    /// No sign of the replica's capacity yet (a queue, a refusal, late
    /// first tokens under load): the limit grows fast (see [`SLOW_START`]).
    slow_start: bool,
    /// Doublings on demand since the last period (see [`Controller::grow_on_demand`]).
    demand_doublings: u32,
    /// Samples since the last with an interactive first token.
    since_interactive: u32,
    /// The requests the engine says it runs at once (llama.cpp's server's
    /// `total_slots`), when it says: the limit's bound, below `params.max`.
    declared: Option<usize>,
    /// Our share of the requests the replica runs and queues, averaged
    /// over [`SHARE_SAMPLES`] (not capped at one; see [`Controller::read_share`]).
    share: f64,
}

/// A ceiling's window (30 s at 250 ms): one seen is remembered this long at
/// least; without a probe, at most twice this long unless renewed.
const CEILING_SAMPLES: u32 = 120;
/// The queues that count toward how far a replica's capacity moves: those
/// of the last window ([`CEILING_SAMPLES`]), and at least this many of
/// them before the spread says anything.
const MOVING_READINGS: usize = 8;
/// A capacity read at a queue is one low when a request was caught between
/// its arrival and the engine's next step: a spread up to this is no move.
const MOVING_NOISE: f64 = 1.0;
/// Our share of the replica's requests is averaged over about this many
/// samples (2 s at 250 ms): in a fleet the others' counts are a period
/// stale and a scrape is a moment older than the counts, so one sample's
/// share reads a seat low whenever a peer's request is not heard of yet,
/// where another client's requests lower it sample after sample (rule 6).
const SHARE_SAMPLES: f64 = 8.0;
/// The most one sample's share counts for.
const SHARE_READ_MOST: f64 = 2.0;

impl Controller {
    pub(crate) fn new(params: LimitParams) -> Controller {
        let limit = params.initial.clamp(params.min, params.max) as f64;
        Controller {
            params,
            limit,
            knee: None,
            hold: 0,
            probe_hold: HOLD_AFTER_DECREASE,
            waiting: 0.0,
            running: None,
            best_first_token: None,
            ceiling: [None, None],
            samples: 0,
            pending: None,
            capacities: VecDeque::new(),
            moving_cut: 0.0,
            periods: 0,
            batch_cut: 0.0,
            batch_hold: 0,
            slow_start: true,
            demand_doublings: 0,
            since_interactive: CEILING_SAMPLES,
            declared: None,
            share: 1.0,
        }
    }

    /// The most the limit may be: `params.max`, or the slots the engine
    /// declares where fewer (never below `params.min`).
    fn max(&self) -> usize {
        self.declared.map_or(self.params.max, |d| d.min(self.params.max)).max(self.params.min)
    }

    /// The engine declared how many requests it runs at once (`None`: it
    /// did not say): the limit, and what slow start offers, stay within
    /// them (docs/design/learned-limits.md, rule 16).
    pub(crate) fn declare(&mut self, slots: Option<usize>) {
        self.declared = slots.filter(|&n| n > 0);
        self.limit = self.limit.clamp(self.params.min as f64, self.max() as f64);
    }

    /// The slots the engine declared, if it did.
    pub(crate) fn declared(&self) -> Option<usize> {
        self.declared
    }

    /// How far above the ceiling the limit goes now (see [`Probe`]).
    fn probe(&self) -> f64 {
        match self.params.probe {
            Probe::Always => 1.0,
            Probe::WhileBatchAlone if self.since_interactive >= CEILING_SAMPLES => 1.0,
            Probe::Never | Probe::WhileBatchAlone => 0.0,
        }
    }

    /// A request found every slot taken: in slow start, with nothing queued
    /// at the replica at the last period, the limit doubles now rather than
    /// at the next period, at most [`DEMAND_DOUBLINGS`] times between two
    /// periods (the next one judges what the burst did). True if it grew.
    pub(crate) fn grow_on_demand(&mut self) -> bool {
        let max = self.max() as f64;
        if !self.slow_start || self.waiting > 0.0 || self.demand_doublings >= DEMAND_DOUBLINGS || self.limit >= max {
            return false;
        }
        self.demand_doublings += 1;
        self.limit = (self.limit * SLOW_START).min(max);
        true
    }

    /// The slots the replica offers now: the limit, or in slow start
    /// [`SLOW_START`] times it (within the bounds).
    pub(crate) fn allowed(&self) -> usize {
        let n = if self.slow_start { (self.limit * SLOW_START).floor() as usize } else { self.limit() };
        n.clamp(self.params.min, self.max())
    }

    /// Still in slow start?
    #[cfg(test)]
    pub(crate) fn slow_start(&self) -> bool {
        self.slow_start
    }

    /// Seats of the limit batch requests leave to interactive ones (0 to
    /// half the limit): a tenth more each time interactive first tokens come
    /// late under load, one back each period they are on target.
    pub(crate) fn batch_cut(&self) -> usize {
        (self.batch_cut.max(self.moving_cut).ceil() as usize).min(self.limit() / 2)
    }

    /// Seats batch leaves to interactive requests while the replica's
    /// capacity moves (rule 7): the most it ran at a queue lately, less
    /// the median of those readings, this gateway's part of it; none while
    /// no interactive first token came for a window (batch alone). An
    /// engine bound by its KV cache runs fewer requests as their answers
    /// grow, so the ceiling (the most it ran) is above what it runs most of
    /// the time, and an interactive request on a seat batch took up to it
    /// waits inside the engine for a request to end.
    fn moving_cut(&mut self, ours: f64) {
        let since = self.periods.wrapping_sub(CEILING_SAMPLES);
        while self.capacities.front().is_some_and(|&(at, _)| at.wrapping_sub(since) > CEILING_SAMPLES) {
            self.capacities.pop_front();
        }
        self.moving_cut = 0.0;
        if self.capacities.len() < MOVING_READINGS || self.since_interactive >= CEILING_SAMPLES {
            return;
        }
        let mut ran: Vec<f64> = self.capacities.iter().map(|&(_, r)| r).collect();
        ran.sort_by(f64::total_cmp);
        let (median, most) = (ran[ran.len() / 2], ran[ran.len() - 1]);
        if most - median > MOVING_NOISE {
            self.moving_cut = ((most - median) * ours).floor();
        }
    }

    pub(crate) fn limit(&self) -> usize {
        (self.limit.floor() as usize).clamp(self.params.min, self.max())
    }

    /// The most the replica ran for us lately while anything waited.
    fn ceiling(&self) -> Option<f64> {
        match self.ceiling {
            [Some(a), Some(b)] => Some(a.max(b)),
            [a, b] => a.or(b),
        }
    }

    pub(crate) fn set_params(&mut self, params: LimitParams) {
        self.params = params;
        self.limit = self.limit.clamp(params.min as f64, self.max() as f64);
    }

    /// Take one period's sample; the limit after it: read the sample,
    /// classify the period, act on it.
    pub(crate) fn update(&mut self, s: Sample) -> usize {
        self.demand_doublings = 0;
        self.periods = self.periods.wrapping_add(1);
        self.since_interactive = if s.first_token.is_some() { 0 } else { self.since_interactive.saturating_add(1) };
        let p = self.read(&s);
        let batch_makes_room = self.move_batch_cut(&p, &s);
        let verdict = self.classify(&p, &s, batch_makes_room);
        self.act(verdict, &p, &s);
        self.limit = self.limit.clamp(self.params.min as f64, self.max() as f64);
        self.limit()
    }

    /// Read a sample: the queue beyond requests in transit, the backlog,
    /// the best first-token share, and the ceiling a queue shows.
    fn read(&mut self, s: &Sample) -> Period {
        // Requests caught between their arrival and the engine's next step
        // are no queue: a queue counts beyond what arrives in one step.
        let transit = (s.in_transit + TRANSIT_SIGMAS * s.in_transit.sqrt()).floor();
        let waiting = (s.waiting.unwrap_or(0.0) - transit).max(0.0);
        let prev = std::mem::replace(&mut self.waiting, waiting);
        let before = std::mem::replace(&mut self.running, s.running);
        // A replica taking a burst on (rule 5); before any sample nothing
        // ran here. Never where a request waits only while every slot is
        // busy (llama.cpp's server): its queue is one at capacity.
        let taking_on = !s.waits_only_when_full && s.running.is_some_and(|now| now > before.unwrap_or(0.0));
        let backlog = s.inflight_now.saturating_sub(self.limit()) as f64;
        let best = self.best_first_token.map(|b| b * BEST_CREEP);
        self.best_first_token = match (best, s.first_token) {
            (Some(b), Some(t)) => Some(b.min(t)),
            (b, t) => b.or(t),
        };
        self.read_ceiling(s, waiting, taking_on);
        // Interactive targets are P99s: one first token over its target in a
        // period is already a sign.
        let slow = s.first_token_max.or(s.first_token).is_some_and(|t| t > 1.0);
        let loaded = slow && s.first_token.zip(best).is_some_and(|(t, b)| t > LOADED_OVER_BEST * b);
        Period { waiting, prev, queued: waiting.min(prev), backlog, slow, loaded, taking_on }
    }

    /// Interactive first tokens late because of load, batch held here:
    /// batch leaves a tenth more of the limit to interactive (once per
    /// hold); a seat back each period they are on target. Returns whether
    /// batch made room this period.
    fn move_batch_cut(&mut self, p: &Period, s: &Sample) -> bool {
        let makes_room = p.loaded && s.batch_now > 0 && !s.refused;
        if makes_room && self.batch_hold == 0 {
            self.batch_cut = (self.batch_cut + (self.limit * BATCH_CUT_STEP).max(1.0)).min(self.limit * BATCH_CUT_MAX);
            self.batch_hold = HOLD_AFTER_DECREASE;
        } else {
            self.batch_hold = self.batch_hold.saturating_sub(1);
            if self.batch_hold == 0 && !p.slow {
                self.batch_cut = (self.batch_cut - 1.0).max(0.0);
            }
        }
        makes_room
    }

    fn classify(&self, p: &Period, s: &Sample, batch_makes_room: bool) -> Verdict {
        if s.refused {
            Verdict::Refused
        } else if p.queued >= p.backlog + 1.0 && !p.taking_on {
            Verdict::Queued
        } else if let Some(c) = self.ceiling().filter(|c| p.waiting >= p.backlog + 1.0 && self.limit > c + self.probe()) {
            Verdict::OverCeiling(c)
        } else if p.loaded && !batch_makes_room && self.hold == 0 {
            Verdict::Loaded
        } else if p.queued >= 1.0 || self.hold > 0 {
            Verdict::Hold
        } else {
            Verdict::Free
        }
    }

    fn act(&mut self, v: Verdict, p: &Period, s: &Sample) {
        let min = self.params.min as f64;
        if !matches!(v, Verdict::Free | Verdict::Hold) || p.waiting >= 1.0 || p.loaded {
            // The replica showed where its capacity is: from here on the
            // limit moves by the rules below, not by doubling. A queue it
            // is still taking on counts here (not as a cut): it has not
            // started what it has, and doubling again would put a second
            // burst behind the first.
            self.slow_start = false;
        }
        match v {
            Verdict::Refused => {
                self.knee = Some(self.limit);
                self.limit = (self.limit * REFUSAL_CUT).max(min);
                self.hold = HOLD_AFTER_REFUSAL;
            }
            Verdict::Queued => {
                let again = self.knee.is_some_and(|k| (k - self.limit).abs() <= SAME_KNEE);
                self.probe_hold = if again { (self.probe_hold * 2).min(MAX_PROBE_HOLD) } else { HOLD_AFTER_DECREASE };
                self.knee = Some(self.limit);
                // With a queue, what the replica runs is its capacity now; our
                // part of it is our share of its requests (all of it when the
                // gateway is its only client). The queue's size beyond the
                // backlog says how far over it the limit is, less the requests
                // there that are not ours as counted now: in a fleet, a peer's
                // request not heard of yet waits past the others' limit, not
                // past ours (another client's shows in the share instead).
                let running = self.running(s);
                let unheard = running.map_or(0.0, |r| (r + p.waiting - s.inflight_now as f64).max(0.0));
                let over = (p.queued - p.backlog - unheard).max(0.0).floor();
                let by_queue = (self.limit - over).max(self.limit * QUEUE_CUT_FLOOR);
                let target = match running {
                    Some(r) => (r * self.share.min(1.0)).round().min(by_queue),
                    None => by_queue,
                };
                self.limit = target.max(self.limit * DECREASE_FLOOR).max(min);
                self.hold = self.probe_hold;
            }
            Verdict::OverCeiling(c) => {
                // Back to one above what the replica ran while something waited.
                self.knee = Some(self.limit);
                self.limit = (c + self.probe()).max(self.limit * DECREASE_FLOOR).max(min);
                self.hold = self.probe_hold;
            }
            Verdict::Loaded => {
                self.knee = Some(self.limit);
                self.limit = (self.limit * LOAD_CUT).max(min);
                self.hold = HOLD_AFTER_DECREASE;
            }
            Verdict::Hold => self.hold = self.hold.saturating_sub(1),
            Verdict::Free => self.grow(p, s),
        }
    }

    /// The limit binds (the gateway had that many requests on the replica,
    /// or requests wait for slots and it had nearly that many) and nothing
    /// queued now or the sample before: one more near the knee, the square
    /// root of the limit far from it, never past one above the ceiling.
    fn grow(&mut self, p: &Period, s: &Sample) {
        let peak = s.inflight_peak as f64 + 1.0;
        let binds = peak >= self.limit || (s.demand && peak >= self.limit * BINDS_WITH_DEMAND);
        if !(binds && p.waiting == 0.0 && p.prev == 0.0 && !p.slow) {
            return;
        }
        let near_knee = self.knee.is_some_and(|k| self.limit + self.limit.sqrt() >= k);
        // Requests wait in the replica (within what is in transit) and it
        // took none of them on since the sample before: most likely it runs
        // all its slots (rule 9).
        let at_slots = s.waiting.is_some_and(|w| w >= 1.0) && !p.taking_on;
        self.limit = if self.slow_start {
            self.limit * SLOW_START
        } else if near_knee || at_slots {
            self.limit + 1.0
        } else {
            self.limit + self.limit.sqrt().max(1.0)
        };
        if let Some(c) = self.ceiling() {
            self.limit = self.limit.min(c + self.probe());
        }
        if self.knee.is_some_and(|k| self.limit > k * KNEE_FORGOTTEN + 2.0) {
            self.knee = None;
        }
    }
}

/// What a sample says of the replica's capacity and our share of it.
mod ceiling;

#[cfg(test)]
mod tests;
