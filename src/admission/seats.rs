//! The seat arithmetic of one pool, as a pure view: how many of the slots
//! batch may hold, how many are kept for interactive requests, and how far
//! above the slots an interactive request may go. [`PoolAdmission`] reads
//! its counters into a [`Seats`] and asks it; nothing here touches a lock
//! or an atomic, so every rule is a table test below.
//!
//! The rules are docs/design/seats.md's.
//!
//! [`PoolAdmission`]: super::PoolAdmission

/// How far back the interactive demand the reservation follows looks.
pub(crate) const DEMAND_WINDOW: std::time::Duration = std::time::Duration::from_secs(30);
/// Where the replicas order their queues by tier, the reservation is only
/// the headroom once every replica's limit has been at its engine's slots
/// this long (docs/design/seats.md rule 4).
pub(crate) const AT_SLOTS_HELD: std::time::Duration = std::time::Duration::from_secs(10);
/// Seats the reservation narrows by at most each tick once it may narrow:
/// batch let onto many seats at once starts as many prompts at once, and
/// their prefill makes chat's next first tokens late (seats.md rule 4).
pub(crate) const NARROW_PER_TICK: usize = 1;
/// The reservation covers the interactive demand's recent peak and this
/// much more (a quarter: arrivals are bursty, and the peak is a recent one).
pub(crate) const DEMAND_MARGIN: f64 = 1.25;
/// Slots kept free for interactive requests even after a quiet spell, as a
/// share of the pool's slots (at least one).
const HEADROOM_SHARE: f64 = 0.05;

/// The headroom of `slots` for an interactive peak of `peak`: one seat
/// where the pool preempts and no interactive request came for the
/// demand's window (batch alone: the first interactive request takes it,
/// and the next ones a slot a stream frees or, where none frees in time, a
/// batch stream's), else [`HEADROOM_SHARE`] of them (docs/design/seats.md
/// rule 4).
fn headroom_of(slots: usize, peak: usize, preempts: bool) -> usize {
    if preempts && peak == 0 {
        1
    } else {
        part(slots, HEADROOM_SHARE)
    }
}
/// Seats above a pool's slots that interactive requests of tenants under
/// their fair part may take instead of waiting, as a share of the slots (at
/// least one). Each is given back at the next slot freed (not handed on).
const FAIR_HEADROOM: f64 = 0.1;
/// Seats of their own that short interactive requests (embeddings, rerank,
/// tokenize) take on a pool, whatever its streams hold, instead of waiting
/// behind them, as a share of the slots (at least one): they hold a seat
/// for milliseconds, a stream for seconds, and a replica runs them beside
/// its streams.
const SHORT_SEATS: f64 = 0.1;
/// Slots a tenant at or over its fair part leaves free while other tenants
/// are active, as a share of the pool's slots (at least one).
const FAIR_RESERVE: f64 = 0.1;

/// `share` of `cap` slots, rounded up, at least one.
fn part(cap: usize, share: f64) -> usize {
    ((cap as f64 * share).ceil() as usize).max(1)
}

/// An instance's demand on a pool's slots, in requests (see [`PoolAdmission::demand`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Demand {
    pub(crate) interactive: usize,
    /// Interactive requests holding or waiting for a slot now.
    pub(crate) interactive_now: usize,
    pub(crate) batch: usize,
    pub(crate) waiting: usize,
}

/// A pool's seats at one instant: its slots, its counters, and the
/// published estimates the reservation follows.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Seats {
    /// This instance's slots on healthy replicas.
    pub(crate) cap: usize,
    /// `tiers.interactive.reserved_share`, within 0 to 1.
    pub(crate) share: f64,
    /// Interactive requests holding a slot, and waiting for one.
    pub(crate) interactive_held: usize,
    pub(crate) interactive_waiting: usize,
    /// Batch requests holding a slot.
    pub(crate) batch_held: usize,
    /// Interactive demand's peak over [`DEMAND_WINDOW`].
    pub(crate) demand_peak: usize,
    /// In a fleet: the fleet's word (this instance's part of the
    /// reservation among it); alone, `None`.
    pub(crate) fleet: Option<FleetWord>,
    /// Some interactive class is over its TTFT target: the whole share is kept.
    pub(crate) at_risk: bool,
    /// The pool preempts batch streams for interactive requests
    /// (`pools[].preempt`): after a quiet spell the headroom is one seat.
    pub(crate) preempts: bool,
    /// Where the replicas order their own queues by tier
    /// (`upstream_priority`) and every one's limit has been at its
    /// engine's slots for [`AT_SLOTS_HELD`]: the least the reservation may
    /// narrow to this tick, on its way down to the headroom
    /// ([`NARROW_PER_TICK`] a tick). Alone and while interactive is not at
    /// risk only.
    pub(crate) narrowed: Option<usize>,
}

/// A reservation: the slots kept for interactive requests normally and
/// while interactive is at risk, and the headroom among them. A fleet
/// computes one for all its instances' slots, as one instance holding them
/// all would ([`Reserve::whole`]), and gives each instance its part:
/// each rounding its own part up would keep a seat or more per instance
/// from batch.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Reserve {
    pub(crate) normal: usize,
    pub(crate) at_risk: usize,
    pub(crate) headroom: usize,
}

/// What the fleet tells one instance about a pool each period: the
/// replicas' slots for all instances, the fleet's reservation and this
/// instance's part of it, and what the other instances hold, as last heard.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct FleetWord {
    pub(crate) slots: usize,
    pub(crate) whole: Reserve,
    pub(crate) part: Reserve,
    /// Interactive requests the others hold or queue.
    pub(crate) others_interactive: usize,
    /// Batch requests the others hold.
    pub(crate) others_batch: usize,
    /// The fleet's period: an interactive request that has waited this long
    /// may take a seat no instance holds though others have requests
    /// waiting (they had a period to fill their parts: fleet.md rule 9).
    pub(crate) period: std::time::Duration,
}

impl Reserve {
    /// The reservation of `slots` with `share` reserved at most, for an
    /// interactive peak of `peak` (already the demand's peak, not scaled),
    /// on a pool that `preempts` or not (see [`headroom_of`]).
    pub(crate) fn whole(slots: usize, share: f64, peak: usize, preempts: bool) -> Reserve {
        if share == 0.0 || slots == 0 {
            return Reserve::default();
        }
        let most = Seats::most(slots, share);
        let headroom = headroom_of(slots, peak, preempts);
        Reserve { normal: ((peak as f64 * DEMAND_MARGIN).ceil() as usize + headroom).min(most), at_risk: most, headroom }
    }
}

impl Seats {
    /// Slots kept for interactive requests after a quiet spell (in a fleet,
    /// this instance's part of the fleet's: it may be none).
    pub(crate) fn headroom(&self) -> usize {
        self.fleet.map_or_else(|| headroom_of(self.cap, self.demand_peak, self.preempts), |f| f.part.headroom.min(self.cap))
    }

    /// The most the reservation may be: `share` of the slots, rounded up.
    fn most(slots: usize, share: f64) -> usize {
        slots - (slots as f64 * (1.0 - share)).floor() as usize
    }

    /// The slots reserved for interactive requests: the demand's recent
    /// peak and a quarter more, plus the headroom, up to the share; where
    /// it may narrow ([`Seats::narrowed`]), down to the headroom a seat a
    /// tick (interactive requests past it go above the slots); the whole
    /// share while interactive is at risk. In a fleet,
    /// this instance's part of the fleet's reservation.
    pub(crate) fn reserved(&self) -> usize {
        if self.share == 0.0 || self.cap == 0 {
            return 0;
        }
        if let Some(f) = self.fleet {
            return if self.at_risk { f.part.at_risk } else { f.part.normal }.min(self.cap);
        }
        let whole = Reserve::whole(self.cap, self.share, self.demand_peak, self.preempts);
        if self.at_risk {
            whole.at_risk
        } else if let Some(least) = self.narrowed {
            least.max(whole.headroom).min(whole.normal)
        } else {
            whole.normal
        }
    }

    /// Interactive requests holding or waiting for a slot now, plus the
    /// headroom (0 with no reserved share).
    pub(crate) fn reserved_now(&self) -> usize {
        if self.share == 0.0 || self.cap == 0 {
            return 0;
        }
        (self.interactive_held + self.interactive_waiting + self.headroom()).min(self.cap)
    }

    /// The most slots batch may hold: all but the reserved ones, and at
    /// least one while the share is not the whole pool.
    pub(crate) fn batch_limit(&self) -> usize {
        let reserved = self.reserved();
        if reserved == 0 {
            self.cap
        } else if self.share < 1.0 {
            (self.cap - reserved).max(1)
        } else {
            self.cap - reserved
        }
    }

    /// What a new batch request may bring batch's holding up to: the batch
    /// limit, and never a seat of what interactive requests hold or wait
    /// for now plus the headroom, even past the share. (A burst beyond the
    /// share would otherwise see every seat it frees taken by batch.)
    pub(crate) fn batch_ceiling(&self) -> usize {
        let now = self.reserved_now();
        self.batch_limit().min(if now == 0 { self.cap } else { self.cap.saturating_sub(now).max(1) })
    }

    /// What batch may bring its holding up to here when it may also take
    /// seats no instance of the fleet holds (fleet rule 9): the fleet's
    /// batch stays under the fleet's slots less the larger of the fleet's
    /// reservation and what interactive holds or waits for across the
    /// fleet now (with the fleet's headroom). Alone, or while interactive
    /// requests wait here (a seat freed is theirs), the batch ceiling.
    pub(crate) fn batch_room(&self) -> usize {
        let ceiling = self.batch_ceiling();
        let Some(f) = self.fleet.filter(|_| self.interactive_waiting == 0) else { return ceiling };
        let keep = if self.share == 0.0 {
            0
        } else {
            let reserved = if self.at_risk { f.whole.at_risk } else { f.whole.normal };
            reserved.max(self.interactive_held + f.others_interactive + f.whole.headroom)
        };
        ceiling.max(f.slots.saturating_sub(keep).saturating_sub(f.others_batch))
    }

    /// What a batch request leaves to interactive ones where it picks a replica.
    pub(crate) fn batch_leaves(&self) -> usize {
        self.reserved().max(self.reserved_now())
    }

    /// Batch requests held above the batch limit (it shrank): their slots
    /// are interactive's now.
    pub(crate) fn batch_excess(&self) -> usize {
        self.batch_held.saturating_sub(self.batch_limit())
    }

    /// How far above the slots an interactive request may go when the
    /// replicas order their own queues by tier (`upstream_priority`): the
    /// whole reserved share is interactive's whatever batch holds; in a
    /// fleet, the share of all the replicas' slots less the interactive
    /// requests the others hold or queue. `above`: how many the healthy
    /// replicas already hold above the slots (asked only when needed).
    pub(crate) fn interactive_over_prioritised(&self, above: impl FnOnce() -> usize) -> usize {
        let excess = self.batch_excess();
        let (slots, others) = self.fleet.map_or((self.cap, 0), |f| (f.slots, f.others_interactive));
        let room = Self::most(slots, self.share).saturating_sub(self.interactive_held + others);
        if room == 0 {
            // The share is taken: within the slots (and what batch holds
            // above its limit) only. Counting what is already above the
            // slots here would let every cut of one replica's limit raise
            // what the others may hold: in-flight climbing while limits fall.
            return excess;
        }
        excess.max(room + above())
    }

    /// Seats above the slots a tenant under its fair part may take.
    pub(crate) fn fair_headroom(&self) -> usize {
        part(self.cap, FAIR_HEADROOM)
    }

    /// Short requests a pool runs at once beside its streams.
    pub(crate) fn short_seats(&self) -> usize {
        part(self.cap, SHORT_SEATS)
    }

    /// May a tenant at or over its fair part take a slot now? Only while
    /// the last [`FAIR_RESERVE`] of the slots stay free for the others.
    pub(crate) fn leaves_fair_reserve(&self) -> bool {
        self.interactive_held + self.batch_held + part(self.cap, FAIR_RESERVE) < self.cap
    }
}

#[cfg(test)]
mod tests {
    use super::{FleetWord, Reserve, Seats};

    fn seats(cap: usize, share: f64) -> Seats {
        Seats {
            cap,
            share,
            interactive_held: 0,
            interactive_waiting: 0,
            batch_held: 0,
            demand_peak: 0,
            fleet: None,
            at_risk: false,
            preempts: false,
            narrowed: None,
        }
    }

    /// (what differs from an idle pool, reserved, reserved_now, batch_limit, batch_ceiling)
    #[test]
    fn the_seat_table() {
        type Row = (&'static str, Seats, usize, usize, usize, usize);
        let idle = seats(20, 0.5);
        let rows: [Row; 9] = [
            ("idle: the headroom only", idle, 1, 1, 19, 19),
            ("no share: batch takes all", seats(20, 0.0), 0, 0, 20, 20),
            ("demand 4: 5 reserved and the headroom", Seats { demand_peak: 4, ..idle }, 6, 1, 14, 14),
            ("demand past the share: the share", Seats { demand_peak: 40, ..idle }, 10, 1, 10, 10),
            ("at risk: the whole share", Seats { at_risk: true, ..idle }, 10, 1, 10, 10),
            (
                "a fleet's part: 6, none of its headroom",
                Seats { fleet: Some(FleetWord { part: Reserve { normal: 6, at_risk: 10, headroom: 0 }, ..FleetWord::default() }), ..idle },
                6,
                0,
                14,
                14,
            ),
            ("a burst past the share holds and waits", Seats { interactive_held: 12, interactive_waiting: 3, ..idle }, 1, 16, 19, 4),
            ("all of the share: batch gets none", Seats { at_risk: true, ..seats(4, 1.0) }, 4, 1, 0, 0),
            ("interactive fills the pool: batch keeps one", Seats { interactive_held: 20, ..idle }, 1, 20, 19, 1),
        ];
        for (name, s, reserved, now, limit, ceiling) in rows {
            assert_eq!((s.reserved(), s.reserved_now(), s.batch_limit(), s.batch_ceiling()), (reserved, now, limit, ceiling), "{name}");
        }
    }

    /// Three instances of 3 slots each, sharing 9: alone, each would keep 2
    /// (1 seat of demand's headroom and rounding up); the fleet keeps what
    /// one instance of 9 would, 5 in all, and parts it.
    #[test]
    fn a_fleet_reserves_what_one_instance_of_all_its_slots_would() {
        let alone = Seats { demand_peak: 1, ..seats(3, 0.5) };
        assert_eq!(alone.reserved() * 3, 6);
        let fleet = Reserve::whole(9, 0.5, 3, false);
        assert_eq!(fleet, Reserve { normal: 5, at_risk: 5, headroom: 1 });
        let parts = [
            Reserve { normal: 2, at_risk: 2, headroom: 1 },
            Reserve { normal: 2, at_risk: 2, headroom: 0 },
            Reserve { normal: 1, at_risk: 1, headroom: 0 },
        ];
        let word = |part| Some(FleetWord { slots: 9, whole: fleet, part, ..FleetWord::default() });
        let batch: usize = parts.iter().map(|p| Seats { fleet: word(*p), ..alone }.batch_limit()).sum();
        assert_eq!(batch, 4, "batch holds 9 - 5 across the fleet, not 3");
        // At risk, an instance keeps its part of the fleet's share, never more than its slots.
        let risky = Seats { at_risk: true, fleet: word(Reserve { normal: 1, at_risk: 7, headroom: 0 }), ..alone };
        assert_eq!(risky.reserved(), 3);
        assert_eq!(Reserve::whole(0, 0.5, 3, false), Reserve::default());
        assert_eq!(Reserve::whole(9, 0.0, 3, false), Reserve::default());
    }

    #[test]
    fn headroom_and_fair_parts_are_at_least_one() {
        for (cap, headroom, fair) in [(1, 1, 1), (10, 1, 1), (20, 1, 2), (100, 5, 10), (101, 6, 11)] {
            let s = seats(cap, 0.5);
            assert_eq!((s.headroom(), s.fair_headroom(), s.short_seats()), (headroom, fair, fair), "cap {cap}");
        }
    }

    /// Where the pool preempts, batch alone leaves one seat, not a
    /// twentieth of the slots: the second interactive request after the
    /// quiet spell takes a batch stream's slot if none frees in time. Once
    /// interactive demand is seen, the headroom is the usual one again.
    #[test]
    fn a_preempting_pool_keeps_one_seat_of_headroom_after_a_quiet_spell() {
        let quiet = Seats { preempts: true, ..seats(128, 0.5) };
        assert_eq!((quiet.headroom(), quiet.reserved(), quiet.batch_ceiling()), (1, 1, 127));
        let busy = Seats { demand_peak: 4, ..quiet };
        assert_eq!((busy.headroom(), busy.reserved()), (7, 12));
        let without = seats(128, 0.5);
        assert_eq!((without.headroom(), without.batch_ceiling()), (7, 121), "without preemption: 5 % of the slots");
        assert_eq!(Reserve::whole(128, 0.5, 0, true).headroom, 1, "a fleet's, alike");
        assert_eq!(Reserve::whole(128, 0.5, 3, true).headroom, 7);
    }

    /// Where the replicas order their own queues by tier and run at their
    /// engines' slots, interactive requests past the headroom go above the
    /// slots (rule 10): reserving chat's peak besides would idle what batch
    /// could run. At risk the whole share is kept, and a fleet keeps its part.
    #[test]
    fn at_the_engines_slots_under_priority_only_the_headroom_is_reserved() {
        let busy = Seats { demand_peak: 49, ..seats(128, 0.5) };
        assert_eq!((busy.reserved(), busy.batch_limit()), (64, 64), "chat's peak and a quarter: the whole share");
        let at_slots = Seats { narrowed: Some(0), ..busy };
        assert_eq!((at_slots.reserved(), at_slots.batch_limit()), (7, 121), "the headroom only");
        let on_its_way = Seats { narrowed: Some(40), ..busy };
        assert_eq!((on_its_way.reserved(), on_its_way.batch_limit()), (40, 88), "narrowing a seat a tick: 40 this tick");
        assert_eq!(Seats { narrowed: Some(90), ..busy }.reserved(), 64, "never past the share");
        assert_eq!(Seats { at_risk: true, ..at_slots }.reserved(), 64, "at risk: the whole share");
        assert_eq!(Seats { share: 0.0, ..at_slots }.reserved(), 0, "no share: none");
        let quiet = Seats { demand_peak: 0, preempts: true, ..at_slots };
        assert_eq!(quiet.reserved(), 1, "after a quiet spell where it preempts: one seat");
        let part = Reserve { normal: 20, at_risk: 30, headroom: 2 };
        let fleet = Seats { fleet: Some(FleetWord { part, ..FleetWord::default() }), ..at_slots };
        assert_eq!(fleet.reserved(), 20, "in a fleet, its part of the fleet's reservation");
    }

    #[test]
    fn batch_leaves_the_larger_of_the_reservation_and_what_interactive_holds_now() {
        let s = Seats { demand_peak: 4, ..seats(20, 0.5) };
        assert_eq!(s.batch_leaves(), 6);
        let s = Seats { interactive_held: 9, ..s };
        assert_eq!(s.batch_leaves(), 10);
    }

    #[test]
    fn interactive_over_the_slots_with_upstream_priority() {
        let idle = seats(10, 0.5);
        // Nobody holds interactive seats: the share (5) above what is already above the slots.
        assert_eq!(idle.interactive_over_prioritised(|| 2), 7);
        // The share is taken: no more than what batch holds past its limit, and `above` is not asked.
        let taken = Seats { interactive_held: 5, batch_held: 12, ..idle };
        assert_eq!(taken.interactive_over_prioritised(|| unreachable!("not asked")), 3);
        // In a fleet the share is of all the replicas' slots, less the others' interactive requests.
        let fleet = |others_interactive| Seats { fleet: Some(FleetWord { slots: 40, others_interactive, ..FleetWord::default() }), ..idle };
        assert_eq!(fleet(15).interactive_over_prioritised(|| 0), 5);
        assert_eq!(fleet(20).interactive_over_prioritised(|| 9), 0);
    }

    /// Three instances of 3 slots each sharing 9, the fleet reserving 5:
    /// batch at one instance may take seats the others' idle parts leave,
    /// as long as the fleet's batch stays within 9 - 5.
    #[test]
    fn in_a_fleet_batch_may_take_seats_no_instance_holds_within_the_fleets_batch() {
        let whole = Reserve { normal: 5, at_risk: 7, headroom: 1 };
        let part = Reserve { normal: 2, at_risk: 3, headroom: 1 };
        let word = FleetWord { slots: 9, whole, part, others_interactive: 0, others_batch: 0, period: std::time::Duration::ZERO };
        let one = Seats { fleet: Some(word), ..seats(3, 0.75) };
        assert_eq!(one.batch_ceiling(), 1, "its own part leaves batch one seat");
        assert_eq!(one.batch_room(), 4, "the fleet's batch: 9 - 5");
        type Row = (&'static str, Seats, usize);
        let rows: [Row; 6] = [
            ("the others hold 3 batch", Seats { fleet: Some(FleetWord { others_batch: 3, ..word }), ..one }, 1),
            ("the others hold 5 batch: its own ceiling", Seats { fleet: Some(FleetWord { others_batch: 5, ..word }), ..one }, 1),
            (
                "interactive across the fleet past the reservation",
                Seats { fleet: Some(FleetWord { others_interactive: 5, ..word }), ..one },
                3,
            ),
            ("at risk: the fleet's whole share", Seats { at_risk: true, ..one }, 2),
            ("an interactive request waits here: the ceiling", Seats { interactive_waiting: 1, ..one }, 1),
            ("alone: the ceiling", Seats { fleet: None, ..one }, 2),
        ];
        for (name, s, room) in rows {
            assert_eq!(s.batch_room(), room, "{name}");
        }
    }

    #[test]
    fn a_tenant_over_its_part_leaves_the_fair_reserve() {
        let s = seats(20, 0.5);
        assert!(Seats { interactive_held: 10, batch_held: 7, ..s }.leaves_fair_reserve());
        assert!(!Seats { interactive_held: 10, batch_held: 8, ..s }.leaves_fair_reserve());
    }
}
