//! The TTFT-P99 circuit breaker of one class, and the trigger of context
//! reduction, which follows the same pattern with its own thresholds. The
//! request path only reads ([`Breaker::admit`] is an atomic load, and
//! half-open one lock for a probe permit); transitions are made by the
//! publisher in [`Breaker::tick`] and by the probes' verdicts. The rules are
//! docs/design/breaker.md's.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use crate::config::BreakerConfig;
use crate::telemetry::window::WindowStats;

/// Reduction turns off after the P99 stayed under target this many times `trigger_after`.
pub(crate) const OFF_DWELL_FACTOR: u32 = 3;

/// How many probe requests a half-open breaker admits.
pub(crate) const HALF_OPEN_PROBES: u32 = 5;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BreakerState {
    Closed = 0,
    HalfOpen = 1,
    Open = 2,
}

impl BreakerState {
    fn from_u8(v: u8) -> BreakerState {
        match v {
            1 => BreakerState::HalfOpen,
            2 => BreakerState::Open,
            _ => BreakerState::Closed,
        }
    }
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            BreakerState::Closed => "closed",
            BreakerState::HalfOpen => "half-open",
            BreakerState::Open => "open",
        }
    }
}

/// What the gate says to one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Gate {
    /// Closed: go on.
    Pass,
    /// Half-open: go on as a probe; report its TTFT with [`Breaker::probe_done`].
    Probe(ProbeTicket),
    /// Open (or half-open with every probe permit taken): 429; it half-opens
    /// in `retry_after` (zero: half-open now, with every probe out).
    /// `spread`: its open period, over which the refused should come back
    /// (they arrived over as long).
    Reject { retry_after: Duration, spread: Duration },
}

/// Identifies one half-open probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ProbeTicket {
    epoch: u64,
    id: u64,
}

/// Probes of the current half-open period. Only touched while half-open.
#[derive(Default)]
struct Probes {
    /// Bumped at every half-open: late verdicts of older probes are ignored.
    epoch: u64,
    next_id: u64,
    /// Probes admitted and not yet judged, with when they were admitted;
    /// `None` for one judged only when it ends (a non-streaming request,
    /// which has no first token to wait for).
    outstanding: Vec<(u64, Option<Instant>)>,
    admitted: u32,
    good: u32,
    bad: u32,
}

/// The configuration a breaker runs with (whole `BreakerConfig` plus the
/// class's TTFT target).
#[derive(Debug, Clone)]
pub(crate) struct BreakerParams {
    pub(crate) target: Duration,
    pub(crate) trip_ratio: f64,
    pub(crate) trip_after: Duration,
    pub(crate) min_samples: u64,
    pub(crate) retry_after: Duration,
}

impl BreakerParams {
    pub(crate) fn new(cfg: &BreakerConfig, target: Duration) -> Self {
        BreakerParams {
            target,
            trip_ratio: cfg.trip_ratio,
            trip_after: cfg.trip_after.get(),
            min_samples: cfg.min_samples as u64,
            retry_after: cfg.retry_after.get(),
        }
    }
}

struct Machine {
    params: BreakerParams,
    /// When the P99 was first seen above the trip threshold (closed only).
    above_since: Option<Instant>,
    /// When the breaker last opened.
    opened_at: Option<Instant>,
}

/// One class's breaker.
pub(crate) struct Breaker {
    state: AtomicU8,
    probes: Mutex<Probes>,
    /// When it half-opens, in microseconds after `born` (while open).
    half_opens_at_us: std::sync::atomic::AtomicU64,
    /// `retry_after`, in microseconds (for the request path).
    open_for_us: std::sync::atomic::AtomicU64,
    born: Instant,
    machine: Mutex<Machine>,
}

/// A state change, for the log line and the gauge.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Transition {
    pub(crate) from: BreakerState,
    pub(crate) to: BreakerState,
}

impl Breaker {
    pub(crate) fn new(params: BreakerParams) -> Breaker {
        Breaker {
            state: AtomicU8::new(BreakerState::Closed as u8),
            probes: Mutex::new(Probes::default()),
            half_opens_at_us: std::sync::atomic::AtomicU64::new(0),
            open_for_us: std::sync::atomic::AtomicU64::new(params.retry_after.as_micros() as u64),
            born: Instant::now(),
            machine: Mutex::new(Machine { params, above_since: None, opened_at: None }),
        }
    }

    /// New parameters (a reload); the state is kept.
    pub(crate) fn set_params(&self, params: BreakerParams) {
        self.open_for_us.store(params.retry_after.as_micros() as u64, Ordering::Relaxed);
        if let Ok(mut m) = self.machine.lock() {
            m.params = params;
        }
    }

    pub(crate) fn state(&self) -> BreakerState {
        BreakerState::from_u8(self.state.load(Ordering::Acquire))
    }

    /// Closed, with the P99 above the trip threshold: since when.
    pub(crate) fn armed(&self) -> bool {
        self.machine.lock().map(|m| m.above_since.is_some()).unwrap_or(false) && self.state() == BreakerState::Closed
    }

    /// The gate a new request of this class passes through. Never blocks.
    pub(crate) fn admit(&self) -> Gate {
        match self.state() {
            BreakerState::Closed => Gate::Pass,
            BreakerState::Open => Gate::Reject { retry_after: self.until_half_open(Instant::now()), spread: self.open_for() },
            BreakerState::HalfOpen => {
                let reject = Gate::Reject { retry_after: Duration::ZERO, spread: self.open_for() };
                let Ok(mut p) = self.probes.lock() else { return reject };
                if p.admitted >= HALF_OPEN_PROBES {
                    return reject;
                }
                p.admitted += 1;
                p.next_id += 1;
                let id = p.next_id;
                p.outstanding.push((id, Some(Instant::now())));
                Gate::Probe(ProbeTicket { epoch: p.epoch, id })
            }
        }
    }

    /// How long from `now` until an open breaker half-opens (the
    /// publisher's next tick after that).
    fn until_half_open(&self, now: Instant) -> Duration {
        let at = self.born + Duration::from_micros(self.half_opens_at_us.load(Ordering::Relaxed));
        at.saturating_duration_since(now)
    }

    fn open_for(&self) -> Duration {
        Duration::from_micros(self.open_for_us.load(Ordering::Relaxed))
    }

    /// It opened at `now`: it half-opens `retry_after` later.
    fn opened(&self, m: &mut Machine, now: Instant) {
        m.opened_at = Some(now);
        let at = (now + m.params.retry_after).saturating_duration_since(self.born);
        self.half_opens_at_us.store(at.as_micros() as u64, Ordering::Relaxed);
    }

    /// This probe has no first token to wait for (a non-streaming request):
    /// it is judged when it ends, not when the target passes.
    pub(crate) fn judge_at_end(&self, ticket: ProbeTicket) {
        let Ok(mut p) = self.probes.lock() else { return };
        if p.epoch != ticket.epoch {
            return;
        }
        if let Some(entry) = p.outstanding.iter_mut().find(|(id, _)| *id == ticket.id) {
            entry.1 = None;
        }
    }

    /// A probe finished: `Some(ttft_within_target)`, or `None` when it ended
    /// without telling (the client hung up, or it was refused after the
    /// gate), which gives its place back. A probe already judged (it went
    /// past the target without a first token) or from an earlier half-open
    /// period is ignored.
    pub(crate) fn probe_done(&self, ticket: ProbeTicket, good: Option<bool>) {
        let Ok(mut p) = self.probes.lock() else { return };
        if p.epoch != ticket.epoch {
            return;
        }
        let Some(i) = p.outstanding.iter().position(|(id, _)| *id == ticket.id) else { return };
        p.outstanding.swap_remove(i);
        match good {
            Some(true) => p.good += 1,
            Some(false) => p.bad += 1,
            None => p.admitted = p.admitted.saturating_sub(1),
        }
    }

    /// Advance the state machine from the window's stats at `now`. Called by
    /// the publisher only.
    pub(crate) fn tick(&self, now: Instant, stats: &WindowStats) -> Option<Transition> {
        let Ok(mut m) = self.machine.lock() else { return None };
        let from = self.state();
        let to = match from {
            BreakerState::Closed => {
                let threshold = m.params.target.mul_f64(m.params.trip_ratio);
                if stats.count >= m.params.min_samples && stats.p99 > threshold {
                    let since = *m.above_since.get_or_insert(now);
                    if now.saturating_duration_since(since) >= m.params.trip_after {
                        self.opened(&mut m, now);
                        BreakerState::Open
                    } else {
                        from
                    }
                } else {
                    m.above_since = None;
                    from
                }
            }
            BreakerState::Open => {
                if m.opened_at.is_none_or(|t| now.saturating_duration_since(t) >= m.params.retry_after) {
                    if let Ok(mut p) = self.probes.lock() {
                        let epoch = p.epoch + 1;
                        *p = Probes { epoch, ..Probes::default() };
                    }
                    BreakerState::HalfOpen
                } else {
                    from
                }
            }
            BreakerState::HalfOpen => {
                let (good, bad) = match self.probes.lock() {
                    Ok(mut p) => {
                        // A probe with no first token past the target is already a slow one.
                        let target = m.params.target;
                        let before = p.outstanding.len();
                        p.outstanding.retain(|(_, t)| t.is_none_or(|t| now.saturating_duration_since(t) <= target));
                        p.bad += (before - p.outstanding.len()) as u32;
                        (p.good, p.bad)
                    }
                    Err(_) => (0, 0),
                };
                if bad > 0 {
                    self.opened(&mut m, now);
                    BreakerState::Open
                } else if good >= HALF_OPEN_PROBES {
                    m.above_since = None;
                    BreakerState::Closed
                } else {
                    from
                }
            }
        };
        if to == from {
            return None;
        }
        self.state.store(to as u8, Ordering::Release);
        Some(Transition { from, to })
    }
}

/// Context reduction's trigger for one class: on when the P99 stays above
/// `trigger_ratio` x target for `trigger_after`; off again (hysteresis) when
/// it has stayed at or under the target for [`OFF_DWELL_FACTOR`] x
/// `trigger_after`.
pub(crate) struct ReductionTrigger {
    active: std::sync::atomic::AtomicBool,
    machine: Mutex<TriggerMachine>,
}

#[derive(Debug, Clone)]
pub(crate) struct TriggerParams {
    pub(crate) target: Duration,
    pub(crate) ratio: f64,
    pub(crate) after: Duration,
    pub(crate) min_samples: u64,
}

struct TriggerMachine {
    params: TriggerParams,
    since: Option<Instant>,
    /// When reduction last turned off.
    off_at: Option<Instant>,
}

impl ReductionTrigger {
    pub(crate) fn new(params: TriggerParams) -> Self {
        ReductionTrigger { active: false.into(), machine: Mutex::new(TriggerMachine { params, since: None, off_at: None }) }
    }

    pub(crate) fn set_params(&self, params: TriggerParams) {
        if let Ok(mut m) = self.machine.lock() {
            m.params = params;
        }
    }

    /// Read by the request path.
    pub(crate) fn active(&self) -> bool {
        self.active.load(Ordering::Acquire)
    }

    /// Returns the new state when it changed.
    pub(crate) fn tick(&self, now: Instant, stats: &WindowStats) -> Option<bool> {
        let Ok(mut m) = self.machine.lock() else { return None };
        let active = self.active();
        let toward_change = if active {
            stats.p99 <= m.params.target
        } else {
            stats.count >= m.params.min_samples && stats.p99 > m.params.target.mul_f64(m.params.ratio)
        };
        if !toward_change {
            m.since = None;
            return None;
        }
        let since = *m.since.get_or_insert(now);
        // Off takes three times as long as on: a load that needed reduction
        // comes back the moment it stops, so leaving early only oscillates.
        // For the same reason, pressure soon after turning off turns it back
        // on at once: the load has shown it still needs it.
        let recently_off = m.off_at.is_some_and(|t| now.saturating_duration_since(t) <= m.params.after * OFF_DWELL_FACTOR);
        let dwell = match (active, recently_off) {
            (true, _) => m.params.after * OFF_DWELL_FACTOR,
            (false, true) => Duration::ZERO,
            (false, false) => m.params.after,
        };
        if now.saturating_duration_since(since) < dwell {
            return None;
        }
        m.since = None;
        if active {
            m.off_at = Some(now);
        }
        self.active.store(!active, Ordering::Release);
        Some(!active)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params() -> BreakerParams {
        BreakerParams {
            target: Duration::from_millis(300),
            trip_ratio: 2.0,
            trip_after: Duration::from_secs(30),
            min_samples: 20,
            retry_after: Duration::from_secs(5),
        }
    }

    fn stats(p99_ms: u64, count: u64) -> WindowStats {
        WindowStats { count, p50: Duration::from_millis(p99_ms / 2), p99: Duration::from_millis(p99_ms) }
    }

    /// Tick every 250 ms for `secs` seconds with the same stats; return the
    /// transitions with the seconds at which they happened.
    async fn run(b: &Breaker, secs: f64, s: WindowStats, t0: Instant) -> Vec<(f64, Transition)> {
        let mut out = Vec::new();
        let steps = (secs * 4.0) as u32;
        for _ in 0..steps {
            tokio::time::advance(Duration::from_millis(250)).await;
            let now = Instant::now();
            if let Some(t) = b.tick(now, &s) {
                out.push(((now - t0).as_secs_f64(), t));
            }
        }
        out
    }

    #[tokio::test(start_paused = true)]
    async fn trips_after_trip_after_above_threshold_not_before() {
        let b = Breaker::new(params());
        let t0 = Instant::now();
        // Above 2x target (600 ms) for 29.75 s: still closed.
        assert!(run(&b, 29.75, stats(700, 100), t0).await.is_empty());
        assert_eq!(b.admit(), Gate::Pass);
        // At 30 s past the first tick above: open.
        let tr = run(&b, 0.5, stats(700, 100), t0).await;
        assert_eq!(tr.len(), 1, "{tr:?}");
        assert_eq!(tr[0].1, Transition { from: BreakerState::Closed, to: BreakerState::Open });
        assert!(tr[0].0 >= 30.0 && tr[0].0 <= 30.5, "{tr:?}");
        assert!(matches!(b.admit(), Gate::Reject { .. }));
    }

    #[tokio::test(start_paused = true)]
    async fn a_dip_below_threshold_restarts_the_count() {
        let b = Breaker::new(params());
        let t0 = Instant::now();
        assert!(run(&b, 20.0, stats(700, 100), t0).await.is_empty());
        assert!(run(&b, 0.25, stats(500, 100), t0).await.is_empty());
        assert!(run(&b, 29.5, stats(700, 100), t0).await.is_empty());
        assert_eq!(b.state(), BreakerState::Closed);
        assert_eq!(run(&b, 1.0, stats(700, 100), t0).await.len(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn too_few_samples_never_trip() {
        let b = Breaker::new(params());
        assert!(run(&b, 120.0, stats(5000, 19), Instant::now()).await.is_empty());
        assert_eq!(b.state(), BreakerState::Closed);
    }

    #[tokio::test(start_paused = true)]
    async fn open_half_open_probes_close() {
        let b = Breaker::new(params());
        let t0 = Instant::now();
        run(&b, 30.25, stats(700, 100), t0).await;
        assert_eq!(b.state(), BreakerState::Open);
        // After retry_after: half-open, admits exactly HALF_OPEN_PROBES probes.
        let tr = run(&b, 5.0, stats(700, 100), t0).await;
        assert_eq!(tr.len(), 1);
        assert_eq!(tr[0].1.to, BreakerState::HalfOpen);
        let gates: Vec<Gate> = (0..HALF_OPEN_PROBES + 2).map(|_| b.admit()).collect();
        let tickets: Vec<ProbeTicket> = gates.iter().filter_map(|g| if let Gate::Probe(t) = g { Some(*t) } else { None }).collect();
        assert_eq!(tickets.len(), HALF_OPEN_PROBES as usize);
        let five = Duration::from_secs(5);
        assert_eq!(
            gates[HALF_OPEN_PROBES as usize],
            Gate::Reject { retry_after: Duration::ZERO, spread: five },
            "half-open: the verdict is near"
        );
        // One probe's client hangs up: its place comes back.
        b.probe_done(tickets[0], None);
        let Gate::Probe(again) = b.admit() else { panic!("a probe place came back") };
        // All probes under target: closed.
        for t in tickets[1..].iter().chain([&again]) {
            b.probe_done(*t, Some(true));
        }
        let tr = run(&b, 0.25, stats(700, 100), t0).await;
        assert_eq!(tr[0].1, Transition { from: BreakerState::HalfOpen, to: BreakerState::Closed });
        assert_eq!(b.admit(), Gate::Pass);
    }

    #[tokio::test(start_paused = true)]
    async fn a_slow_probe_reopens() {
        let b = Breaker::new(params());
        let t0 = Instant::now();
        run(&b, 35.5, stats(700, 100), t0).await;
        assert_eq!(b.state(), BreakerState::HalfOpen);
        let (Gate::Probe(p1), Gate::Probe(p2)) = (b.admit(), b.admit()) else { panic!("probes") };
        b.probe_done(p1, Some(true));
        b.probe_done(p2, Some(false));
        let tr = run(&b, 0.25, stats(700, 100), t0).await;
        assert_eq!(tr[0].1, Transition { from: BreakerState::HalfOpen, to: BreakerState::Open });
        assert!(matches!(b.admit(), Gate::Reject { .. }));
        // And half-open again retry_after later, with fresh permits and counts.
        let tr = run(&b, 5.0, stats(700, 100), t0).await;
        assert_eq!(tr[0].1.to, BreakerState::HalfOpen);
        assert!(matches!(b.admit(), Gate::Probe(_)));
        // A verdict from the earlier half-open period is ignored.
        b.probe_done(p2, Some(false));
        assert!(run(&b, 0.25, stats(700, 100), t0).await.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_probe_without_a_first_token_past_the_target_reopens_at_once() {
        let b = Breaker::new(params());
        let t0 = Instant::now();
        run(&b, 35.5, stats(700, 100), t0).await;
        assert_eq!(b.state(), BreakerState::HalfOpen);
        let Gate::Probe(p) = b.admit() else { panic!("probe") };
        // 250 ms: still within the 300 ms target, nothing happens.
        assert!(run(&b, 0.25, stats(700, 100), t0).await.is_empty());
        // 500 ms without a first token: slow, whatever comes later.
        let tr = run(&b, 0.25, stats(700, 100), t0).await;
        assert_eq!(tr[0].1, Transition { from: BreakerState::HalfOpen, to: BreakerState::Open });
        // Its late verdict changes nothing.
        b.probe_done(p, Some(true));
        assert_eq!(b.state(), BreakerState::Open);
    }

    #[tokio::test(start_paused = true)]
    async fn a_probe_judged_at_its_end_is_not_slow_for_passing_the_target() {
        let b = Breaker::new(params());
        let t0 = Instant::now();
        run(&b, 35.5, stats(700, 100), t0).await;
        assert_eq!(b.state(), BreakerState::HalfOpen);
        let Gate::Probe(p) = b.admit() else { panic!("probe") };
        b.judge_at_end(p);
        // Two seconds past the 300 ms target, still running: not judged.
        assert!(run(&b, 2.0, stats(700, 100), t0).await.is_empty());
        b.probe_done(p, Some(false));
        let tr = run(&b, 0.25, stats(700, 100), t0).await;
        assert_eq!(tr[0].1, Transition { from: BreakerState::HalfOpen, to: BreakerState::Open });
    }

    /// An open breaker's refusals say how long until it half-opens, not
    /// its whole `retry_after` each time.
    #[tokio::test(start_paused = true)]
    async fn retry_after_is_the_time_until_it_half_opens() {
        let b = Breaker::new(params());
        let t0 = Instant::now();
        run(&b, 30.25, stats(700, 100), t0).await;
        assert_eq!(b.state(), BreakerState::Open);
        let wait = |b: &Breaker| match b.admit() {
            Gate::Reject { retry_after, spread } => {
                assert_eq!(spread, Duration::from_secs(5), "over one more open period");
                retry_after
            }
            g => panic!("{g:?}"),
        };
        assert_eq!(wait(&b), Duration::from_secs(5), "just opened");
        tokio::time::advance(Duration::from_millis(3500)).await;
        assert_eq!(wait(&b), Duration::from_millis(1500));
        // Half-open at the next tick past it; one slow probe opens it again, for the whole retry_after.
        let tr = run(&b, 2.0, stats(700, 100), t0).await;
        assert_eq!(tr[0].1.to, BreakerState::HalfOpen);
        let Gate::Probe(p) = b.admit() else { panic!("half-open") };
        b.probe_done(p, Some(false));
        run(&b, 0.25, stats(700, 100), t0).await;
        assert_eq!(b.state(), BreakerState::Open);
        assert_eq!(wait(&b), Duration::from_secs(5));
    }

    #[tokio::test(start_paused = true)]
    async fn reduction_on_after_trigger_after_off_with_hysteresis() {
        let r = ReductionTrigger::new(TriggerParams {
            target: Duration::from_millis(300),
            ratio: 2.0,
            after: Duration::from_secs(10),
            min_samples: 20,
        });
        let mut changes = Vec::new();
        let t0 = Instant::now();
        for (p99, secs) in [(700u64, 12u32), (450, 20), (250, 32), (700, 1), (250, 72), (700, 11)] {
            for _ in 0..secs * 4 {
                tokio::time::advance(Duration::from_millis(250)).await;
                if let Some(on) = r.tick(Instant::now(), &stats(p99, 100)) {
                    changes.push(((Instant::now() - t0).as_secs_f64(), on));
                }
            }
        }
        // On 10 s after going above 2x; stays on between 1x and 2x (hysteresis);
        // off 30 s (3 x trigger_after) after going back under 1x; pressure
        // right after (64-65 s) turns it on again at once; off again 30 s
        // under target later (95 s); pressure 40 s after that waits 10 s again.
        let at = |i: usize| changes.get(i).copied().unwrap_or((-1.0, false));
        assert_eq!(changes.len(), 5, "{changes:?}");
        assert!(at(0).1 && (10.0..=10.5).contains(&at(0).0), "{changes:?}");
        assert!(!at(1).1 && (62.0..=62.5).contains(&at(1).0), "{changes:?}");
        assert!(at(2).1 && (64.0..=64.5).contains(&at(2).0), "{changes:?}");
        assert!(!at(3).1 && (95.0..=95.5).contains(&at(3).0), "{changes:?}");
        assert!(at(4).1 && (147.0..=147.5).contains(&at(4).0), "{changes:?}");
    }
}
