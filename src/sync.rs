//! Small shared-state types the rooms use: nothing here knows a request.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use slab::Slab;
use tokio::time::Instant;

/// An `f64` that threads read and write without a lock (its bits in an
/// `AtomicU64`). Every use is a published estimate or setting, read with
/// `Relaxed` ordering: no other memory is ordered by it.
#[derive(Debug, Default)]
pub(crate) struct AtomicF64(AtomicU64);

impl AtomicF64 {
    pub(crate) fn new(v: f64) -> AtomicF64 {
        AtomicF64(AtomicU64::new(v.to_bits()))
    }

    pub(crate) fn load(&self) -> f64 {
        f64::from_bits(self.0.load(Ordering::Relaxed))
    }

    pub(crate) fn store(&self, v: f64) {
        self.0.store(v.to_bits(), Ordering::Relaxed);
    }

    /// Replace the value with `f(old)`, atomically; `f` returns `None` to
    /// leave it as it is. Returns whether it changed.
    pub(crate) fn update(&self, mut f: impl FnMut(f64) -> Option<f64>) -> bool {
        self.0.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |bits| f(f64::from_bits(bits)).map(f64::to_bits)).is_ok()
    }
}

/// A background task's rest while there is nothing for it to do: it
/// sleeps until poked, or for at most a while, instead of ticking. What
/// pokes it (a request's arrival) costs one counter increment and one load.
///
/// No poke is lost: [`Rest::rest`] marks the task resting before it looks
/// at the pokes once more, and [`Rest::poke`] counts before it looks at the
/// mark (both sequentially consistent), so either the task sees the poke's
/// count or the poke sees the mark and wakes it.
#[derive(Default)]
pub(crate) struct Rest {
    resting: AtomicBool,
    pokes: AtomicU64,
    wake: tokio::sync::Notify,
}

impl Rest {
    /// Something happened that the task should see now.
    pub(crate) fn poke(&self) {
        self.pokes.fetch_add(1, Ordering::SeqCst);
        if self.resting.load(Ordering::SeqCst) && self.resting.swap(false, Ordering::SeqCst) {
            self.wake.notify_one();
        }
    }

    /// The pokes so far: pass it to [`Rest::rest`] to rest only if none came since.
    pub(crate) fn pokes(&self) -> u64 {
        self.pokes.load(Ordering::SeqCst)
    }

    /// Rest for at most `most`, or until poked; not at all if a poke came
    /// after `seen` was read or `at_rest` no longer says so. True if it rested.
    pub(crate) async fn rest(&self, seen: u64, most: Duration, at_rest: impl Fn() -> bool) -> bool {
        self.resting.store(true, Ordering::SeqCst);
        if self.pokes.load(Ordering::SeqCst) != seen || !at_rest() {
            self.resting.store(false, Ordering::SeqCst);
            return false;
        }
        tokio::select! {
            _ = self.wake.notified() => {}
            _ = tokio::time::sleep(most) => {}
        }
        self.resting.store(false, Ordering::SeqCst);
        true
    }
}

/// What a [`Watchlist`] looks at on each of its ticks: `false` when it
/// needs no more looking at.
pub(crate) trait Watch: Send + Sync {
    fn watch(&self, now: Instant) -> bool;
}

/// How often a [`Watchlist`] looks at what it holds.
pub(crate) const TICK: Duration = Duration::from_millis(100);

/// Things looked at every [`TICK`] by one task, each added and removed in
/// constant time (what it is for: docs/architecture.md, "Guards travel in
/// the response body"). The task runs while the list holds anything and stops
/// at the first tick that finds it empty.
///
/// It stands in for a task and a timer of each thing's own: adding to it
/// costs a lock and a slot, where spawning a task costs a task's
/// allocation, its scheduling, a timer and its cancelling, for every
/// request. The price is a deadline seen up to one tick late.
#[derive(Default)]
pub(crate) struct Watchlist {
    entries: Mutex<Slab<Arc<dyn Watch>>>,
    /// A task is sweeping (set by the add that starts one, cleared under
    /// the entries' lock by the task that stops).
    sweeping: AtomicBool,
}

/// An entry of a [`Watchlist`]: removed from it when dropped.
pub(crate) struct Watching {
    list: Arc<Watchlist>,
    key: usize,
    /// Which thing it is (its address).
    what: usize,
}

impl Drop for Watching {
    fn drop(&mut self) {
        self.list.remove(self.key, self.what);
    }
}

fn address(w: &Arc<dyn Watch>) -> usize {
    Arc::as_ptr(w) as *const () as usize
}

impl Watchlist {
    /// Look at `what` every tick until it says it is done or the returned
    /// entry is dropped. Starts the sweeping task (on the current tokio
    /// runtime) when none runs.
    pub(crate) fn add(self: &Arc<Self>, what: Arc<dyn Watch>) -> Watching {
        let id = address(&what);
        let key = match self.entries.lock() {
            Ok(mut e) => e.insert(what),
            // A panic while the lock was held: nothing is watched any more.
            Err(_) => usize::MAX,
        };
        if key != usize::MAX && !self.sweeping.swap(true, Ordering::AcqRel) {
            // Its ticks count from now, not from when the task first runs.
            let mut ticks = tokio::time::interval_at(Instant::now() + TICK, TICK);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
            tokio::spawn(self.clone().sweep(ticks));
        }
        Watching { list: self.clone(), key, what: id }
    }

    /// Remove the entry at `key` if it is still `what` (the sweep may have
    /// removed it, and the key gone to another since).
    fn remove(&self, key: usize, what: usize) {
        let removed = {
            let Ok(mut e) = self.entries.lock() else { return };
            e.get(key).is_some_and(|w| address(w) == what).then(|| e.remove(key))
        };
        // Dropped with the lock released: when this was the last hold on
        // the thing (a body the sweep just ended), its drop (the request's
        // accounting, its slot given back) must not hold up the list.
        drop(removed);
    }

    /// How many things are watched now.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.entries.lock().map(|e| e.len()).unwrap_or(0)
    }

    async fn sweep(self: Arc<Self>, mut ticks: tokio::time::Interval) {
        // A runtime shut down with this task in it leaves the list to the
        // next add to sweep.
        let running = Running(&self.sweeping);
        let mut batch = Vec::new();
        loop {
            ticks.tick().await;
            {
                let Ok(e) = self.entries.lock() else { return };
                if e.is_empty() {
                    // Cleared under the lock: an add after it starts a task.
                    self.sweeping.store(false, Ordering::Release);
                    std::mem::forget(running);
                    return;
                }
                // Looked at outside the lock: what a look does (end a
                // request, give back its slot) never waits on the list.
                batch.extend(e.iter().map(|(k, w)| (k, w.clone())));
            }
            let now = Instant::now();
            for (key, what) in batch.drain(..) {
                if !what.watch(now) {
                    self.remove(key, address(&what));
                }
            }
        }
    }
}

/// Clears the sweeping flag when the sweeping task is dropped unfinished.
struct Running<'a>(&'a AtomicBool);

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

/// A count of changes that readers elsewhere want to hear of at once: a
/// reader holding a long poll watches it ([`Beacon::watch`]) and answers
/// when it moves, or at once where it moved since the count the reader
/// last saw ([`Beacon::count`]). Telling takes the count's lock: it is for
/// events, not for every request.
pub(crate) struct Beacon(tokio::sync::watch::Sender<u64>);

impl Default for Beacon {
    fn default() -> Beacon {
        Beacon(tokio::sync::watch::Sender::new(0))
    }
}

impl Beacon {
    /// Something changed that the watchers act on.
    pub(crate) fn tell(&self) {
        self.0.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// The changes told so far (wrapping).
    pub(crate) fn count(&self) -> u64 {
        *self.0.borrow()
    }

    /// A receiver whose `changed()` resolves at the next [`Beacon::tell`].
    pub(crate) fn watch(&self) -> tokio::sync::watch::Receiver<u64> {
        self.0.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    /// Looked at until it has been looked at `until` times.
    struct Counted {
        looks: AtomicUsize,
        until: usize,
    }

    impl Watch for Counted {
        fn watch(&self, _: Instant) -> bool {
            self.looks.fetch_add(1, Ordering::SeqCst) + 1 < self.until
        }
    }

    fn counted(until: usize) -> Arc<Counted> {
        Arc::new(Counted { looks: AtomicUsize::new(0), until })
    }

    /// Let the sweeping task run after the clock moved.
    async fn settle() {
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test(start_paused = true)]
    async fn each_thing_is_looked_at_every_tick_until_it_is_done_and_then_let_go() {
        let list = Arc::new(Watchlist::default());
        let (a, b) = (counted(2), counted(usize::MAX));
        let (_wa, _wb) = (list.add(a.clone()), list.add(b.clone()));
        tokio::time::advance(TICK / 2).await;
        settle().await;
        assert_eq!(a.looks.load(Ordering::SeqCst), 0, "nothing before the first tick");
        for _ in 0..3 {
            tokio::time::advance(TICK).await;
            settle().await;
        }
        assert_eq!(a.looks.load(Ordering::SeqCst), 2, "looked at until it said it was done");
        assert_eq!(b.looks.load(Ordering::SeqCst), 3, "once a tick");
        assert_eq!(list.len(), 1, "the done one is off the list");
    }

    #[tokio::test(start_paused = true)]
    async fn a_dropped_entry_leaves_at_once_and_only_itself() {
        let list = Arc::new(Watchlist::default());
        let (a, b) = (counted(1), counted(usize::MAX));
        let wa = list.add(a.clone());
        // The sweep removes `a` (done at its first look) and `b` takes its slot.
        tokio::time::advance(TICK).await;
        settle().await;
        assert_eq!(list.len(), 0);
        let wb = list.add(b.clone());
        drop(wa);
        assert_eq!(list.len(), 1, "dropping a's entry left b, in the slot a had");
        drop(wb);
        assert_eq!(list.len(), 0);
    }

    /// Reads the list when dropped, as a body's end may (its accounting can
    /// end another request's body, which leaves the list).
    struct ReadsTheListWhenDropped(Arc<Watchlist>, std::sync::mpsc::Sender<usize>);

    impl Watch for ReadsTheListWhenDropped {
        fn watch(&self, _: Instant) -> bool {
            false
        }
    }

    impl Drop for ReadsTheListWhenDropped {
        fn drop(&mut self) {
            let _ = self.1.send(self.0.len());
        }
    }

    /// The last hold on a thing is dropped with the list's lock released,
    /// whether its entry is dropped or the sweep ends it: under the lock, a
    /// drop that touches the list would deadlock the gateway.
    #[tokio::test(start_paused = true)]
    async fn a_thing_is_dropped_outside_the_lists_lock() {
        let list = Arc::new(Watchlist::default());
        let (tx, rx) = std::sync::mpsc::channel();
        // Its entry dropped while the list holds the last hold on it.
        let entry = list.add(Arc::new(ReadsTheListWhenDropped(list.clone(), tx.clone())));
        let dropper = std::thread::spawn(move || drop(entry));
        assert_eq!(rx.recv_timeout(Duration::from_secs(10)), Ok(0), "dropped, and the list read, with the lock free");
        dropper.join().expect("no panic");
        // Ended by the sweep (its look says it is done) while its entry lives.
        let _entry = list.add(Arc::new(ReadsTheListWhenDropped(list.clone(), tx)));
        tokio::time::advance(TICK).await;
        settle().await;
        assert_eq!(rx.try_recv(), Ok(0), "the sweep let it go, and it read the list");
    }

    #[tokio::test(start_paused = true)]
    async fn the_sweeping_task_stops_when_the_list_is_empty_and_starts_again_with_the_next() {
        let list = Arc::new(Watchlist::default());
        drop(list.add(counted(usize::MAX)));
        tokio::time::advance(TICK).await;
        settle().await;
        assert!(!list.sweeping.load(Ordering::SeqCst), "stopped at the tick that found nothing");
        let c = counted(usize::MAX);
        let _w = list.add(c.clone());
        assert!(list.sweeping.load(Ordering::SeqCst));
        tokio::time::advance(TICK).await;
        settle().await;
        assert_eq!(c.looks.load(Ordering::SeqCst), 1, "a new task looks at it");
    }

    #[test]
    fn holds_updates_and_refuses_an_update_that_declines() {
        let a = AtomicF64::new(1.5);
        assert_eq!(a.load(), 1.5);
        a.store(-0.25);
        assert_eq!(a.load(), -0.25);
        assert!(a.update(|v| Some(v * 4.0)));
        assert_eq!(a.load(), -1.0);
        assert!(!a.update(|_| None));
        assert_eq!(a.load(), -1.0);
        assert_eq!(AtomicF64::default().load(), 0.0);
    }

    /// A rest lasts its most, or ends at a poke; a poke that came after the
    /// pokes were read, or a state no longer at rest, means no rest at all.
    #[tokio::test(start_paused = true)]
    async fn a_rest_ends_at_a_poke_or_its_most_and_no_poke_is_lost() {
        let rest = Arc::new(Rest::default());
        // Unpoked: the whole of it.
        let t0 = Instant::now();
        assert!(rest.rest(rest.pokes(), Duration::from_secs(5), || true).await);
        assert_eq!(Instant::now() - t0, Duration::from_secs(5));
        // Poked while resting: at once.
        let t0 = Instant::now();
        let resting = tokio::spawn({
            let rest = rest.clone();
            async move { rest.rest(rest.pokes(), Duration::from_secs(5), || true).await }
        });
        tokio::task::yield_now().await;
        tokio::time::advance(Duration::from_millis(10)).await;
        rest.poke();
        assert!(resting.await.expect("task"));
        assert!(Instant::now() - t0 < Duration::from_secs(1), "a poke did not end the rest");
        // A poke after the pokes were read: no rest.
        let seen = rest.pokes();
        rest.poke();
        let t0 = Instant::now();
        assert!(!rest.rest(seen, Duration::from_secs(5), || true).await);
        assert_eq!(Instant::now(), t0);
        // Not at rest any more: no rest.
        assert!(!rest.rest(rest.pokes(), Duration::from_secs(5), || false).await);
        assert_eq!(Instant::now(), t0);
    }
}
