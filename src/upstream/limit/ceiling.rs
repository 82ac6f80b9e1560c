//! The ceiling a queue shows (what the replica runs at most now, for us)
//! and the share of the replica's requests that are ours: rules 5 and 6
//! of docs/design/learned-limits.md.

use super::*;

impl Controller {
    /// A queue, even one sample's, says what the replica runs at most now
    /// (a request caught between its arrival and the engine's next step
    /// shows as one waiting with one fewer running: that sample says less,
    /// and the window keeps the largest). Running more than that: capacity grew.
    pub(super) fn read_ceiling(&mut self, s: &Sample, waiting: f64, taking_on: bool) {
        // Without a probe only time at the cap can find growth, so only
        // periods that used the whole cap count toward forgetting it: below
        // it (batch alone holding all but the headroom's seat) a minute
        // says nothing of the replica, and the cap forgotten there let the
        // limit past llama.cpp's 8 slots as soon as chat came.
        let probing = self.probe() >= 1.0;
        let counts = probing || self.ceiling().is_none_or(|c| s.inflight_peak as f64 >= c);
        self.samples += u32::from(counts);
        if counts && self.samples % CEILING_SAMPLES == 0 {
            // With a probe, a replica that grew runs the probe's request,
            // which clears the ceiling below: a window that saw nothing
            // keeps the older one rather than let the limit grow blind.
            // Without one (the pool preempts), only time can find growth.
            let kept = if probing { self.ceiling[1].or(self.ceiling[0]) } else { self.ceiling[1] };
            // A ceiling forgotten is still the last place a queue showed:
            // the limit looks past it a seat at a time, as near a knee. By
            // its square root it went from 8 to 10 and 14 in half a second
            // past llama.cpp's 8 slots, and chat waited inside the engine.
            if let (None, Some(c)) = (kept, self.ceiling()) {
                self.knee = Some(c);
            }
            self.ceiling = [kept, None];
        }
        let Some(running) = self.running(s) else { return };
        let ours = self.read_share(s.inflight_now, running + waiting);
        let mine = (running * ours).round();
        // Where a request waits only while every slot is busy and the
        // engine declared its slots (llama.cpp's server), its capacity is
        // those slots, and ours our share of them: a ceiling below that was
        // read off a share not yet settled (a fleet's first samples, before
        // the others' counts are heard), and the limit it holds would keep
        // the replica from ever running more to clear it.
        let whole = match self.declared {
            Some(slots) if s.waits_only_when_full => (slots as f64 * ours).round(),
            _ => mine,
        };
        if self.ceiling().is_some_and(|c| mine.max(whole) > c) {
            self.ceiling = [None, None];
        }
        // A queue counts once the next sample shows the replica took no more
        // on: one it then took (a burst in transit, a ramp) says nothing of
        // its capacity. Judged on what the replica runs for everyone too:
        // our share of it moves with the others' counts, a period stale in
        // a fleet (rule 6).
        if let Some((p, all)) = self.pending.take() {
            if mine <= p && !taking_on {
                self.ceiling[1] = Some(self.ceiling[1].map_or(p, |c| c.max(p)));
                self.capacities.push_back((self.periods, all));
            }
        }
        if waiting >= 1.0 && mine > 0.0 {
            self.pending = Some((mine, running));
        }
        self.moving_cut(ours);
        // The replica runs the ceiling and one still waits: the ceiling
        // holds. That one is most often the probe's own request, which the
        // transit estimate may take for one in transit (so the queue above
        // never shows it); unrenewed, the ceiling would expire and the
        // limit grow past the replica's capacity.
        if let Some(c) = self.ceiling().filter(|&c| mine >= c && s.waiting.unwrap_or(0.0) >= 1.0) {
            self.ceiling[1] = Some(c);
        }
    }

    /// What the replica runs, as scraped; where a request waits there only
    /// while every slot is busy (llama.cpp's server) and the engine
    /// declared its slots, all of them while anything waits: a scrape
    /// caught as a slot passed from a finished request to a waiting one
    /// reads one low (7 running, 1 waiting on 8 slots), and without a probe
    /// a ceiling read there held the limit a seat under the slots for as
    /// long as queues renewed it (rule 6).
    pub(super) fn running(&self, s: &Sample) -> Option<f64> {
        let full = s.waits_only_when_full && s.waiting.is_some_and(|w| w >= 1.0);
        match (s.running, self.declared) {
            (Some(r), Some(slots)) if full => Some(r.max(slots as f64)),
            (r, _) => r,
        }
    }

    /// Our share of the `total` requests the replica runs and queues,
    /// `inflight` of them ours as counted now, averaged over
    /// [`SHARE_SAMPLES`] and read at most one. It starts at one (the only
    /// client until samples say otherwise): a fleet's first samples, before
    /// the others' counts are heard, read a third of it or less, and taken
    /// as the start they cut a limit of 8 slots to 3 for 6-18 s.
    fn read_share(&mut self, inflight: usize, total: f64) -> f64 {
        if total > 0.0 {
            // A request caught on its way (sent, not yet counted there)
            // reads above one; bounded, so one moment does not outweigh
            // the rest.
            let now = (inflight as f64 / total).min(SHARE_READ_MOST);
            self.share += (now - self.share) / SHARE_SAMPLES;
        }
        self.share.min(1.0)
    }
}
