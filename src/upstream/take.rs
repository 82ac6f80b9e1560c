//! Taking a seat on a replica: its slots, this instance's part of them in
//! a fleet, and the seats beyond them a request may reach for
//! (docs/design/seats.md, docs/design/fleet.md rules 4 and 9).

use std::sync::atomic::Ordering;

use super::replica::Replica;
use crate::config::Tier;

/// How far a request may reach for a seat on a replica (see [`Replica::try_take`]).
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Reach {
    /// Seats above the replica's slot count (this instance's part in a fleet).
    pub(super) over: usize,
    /// Batch may take seats no instance of the fleet holds (fleet.md rule 9).
    pub(super) unheld: bool,
    /// The engine runs interactive requests first (`upstream_priority`).
    pub(super) prioritised: bool,
    /// The fleet's other instances have requests waiting for the pool, as last heard.
    pub(super) others_wait: bool,
    /// Seats of the other instances' reserved parts that their interactive
    /// requests neither hold nor wait for, as last heard: an interactive
    /// request may take that many past its part at once, as the others'
    /// waiting batch does not fill them (fleet.md rule 9).
    pub(super) lend: usize,
    /// The request can go to no other replica (a stored response's
    /// follow-up): it is held to no free seat.
    pub(super) must: bool,
}

/// Whose seat a request took: within its instance's part (or the
/// replica's slots), or one lent of the other instances' reserved parts
/// ([`Reach::lend`]), which the pool counts until the slot goes back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Seat {
    Own,
    Lent,
}

impl Replica {
    /// Take a slot for a request of `tier` if one is free (`reach.over`:
    /// that many above the slot count). An interactive request may also
    /// take a seat of the replica's limit that no instance of the fleet
    /// holds, beyond this instance's part: parts follow demand a period
    /// late, and an interactive request should not wait while a seat on the
    /// replica stands free because it was another instance's part; on an
    /// engine that serves first come, first served, only while the other
    /// instances have nothing waiting, which would fill their parts at
    /// once. A batch request leaves the batch cut free (this instance's part
    /// of it in a fleet); with `reach.unheld` it may take such a seat too,
    /// less the whole cut. In a fleet, a request takes a seat only while the
    /// replica has one free as last heard, batch always, interactive on an
    /// engine that serves first come, first served (fleet.md rule 9);
    /// `reach.must` (a request that can go nowhere else) is exempt. Says
    /// whether the seat was one lent (past what `reach` without its lending
    /// allows), `None` when none was free.
    pub(super) fn try_take(&self, tier: Tier, reach: Reach) -> Option<Seat> {
        let max = self.seat_cap(tier, reach);
        let own = if reach.lend > 0 { self.seat_cap(tier, Reach { lend: 0, ..reach }) } else { max };
        let mut cur = self.seats.inflight.load(Ordering::SeqCst);
        loop {
            if cur >= max {
                return None;
            }
            match self.seats.inflight.compare_exchange_weak(cur, cur + 1, Ordering::SeqCst, Ordering::SeqCst) {
                Ok(_) => {
                    if let Some(g) = self.gauges.get() {
                        g.inflight.inc();
                    }
                    self.learning.taken(cur + 1);
                    self.readings.scrape.poke();
                    return Some(if cur >= own { Seat::Lent } else { Seat::Own });
                }
                Err(now) => cur = now,
            }
        }
    }

    /// Would [`Replica::try_take`] find a seat now (another request may
    /// take it first)?
    pub(super) fn has_seat(&self, tier: Tier, reach: Reach) -> bool {
        self.seats.inflight.load(Ordering::SeqCst) < self.seat_cap(tier, reach)
    }

    /// The seats a request of `tier` may fill on this replica, its own
    /// among them: [`Replica::try_take`]'s rules.
    fn seat_cap(&self, tier: Tier, reach: Reach) -> usize {
        let mut max = self.slots().saturating_add(reach.over);
        let (slots, limit) = (self.slots(), self.max_inflight());
        // Seats no instance holds are the fleet's limit's, not this
        // instance's own learned one: that one may be past the replica's
        // slots while another instance's holds the fleet (fleet.md rule 4).
        let shared = self.seats.shared_limit();
        let unheld_seats = || shared.saturating_sub(self.seats.others_inflight.load(Ordering::Relaxed));
        match tier {
            // Another instance's part it does not fill is free only while
            // that instance has nothing waiting to fill it with (or once this
            // request waited a fleet period: `others_wait` is then false): on
            // an engine that serves first come, first served, a seat taken
            // twice is a request in the engine's own queue, where chat waits
            // behind batch (fleet.md rule 9).
            Tier::Interactive if reach.prioritised || !reach.others_wait => max = max.max(unheld_seats()),
            // What the pool has left to lend, and the seats lent here
            // already: those are in this replica's count, where the pool's
            // took them off what is left (counted twice, one replica lent about
            // half the seats it was free to).
            Tier::Interactive => max = max.saturating_add(reach.lend).saturating_add(self.seats.lent.load(Ordering::Relaxed)),
            Tier::Batch => {
                let cut = self.seats.batch_cut.load(Ordering::Relaxed);
                if cut > 0 && limit > 0 {
                    max = max.min(slots.saturating_sub((cut * slots).div_ceil(limit)));
                }
                if reach.unheld {
                    max = max.max(unheld_seats().saturating_sub(cut));
                }
            }
        }
        // A part is what this instance may hold, not a seat free on the
        // replica: while another holds seats past its own part (unheld ones
        // it took, or a part that shrank under its streams), a request here
        // waits for the replica to have one free as last heard, or the
        // engine runs past its limit and the request waits inside it, chat
        // too (fleet.md rule 9). Interactive is exempt where the engine runs
        // it first.
        let held_to_free = !reach.must && (tier == Tier::Batch || !reach.prioritised);
        if held_to_free && self.seats.in_fleet() {
            max = max.min(unheld_seats());
        }
        max
    }
}
