//! Busy polling (`server.busy_poll`): while requests are in flight, the
//! gateway's worker threads poll for I/O with a zero timeout instead of
//! sleeping, so a core never goes idle between two events of a stream.
//!
//! Why: on a virtual machine, a vCPU with nothing to run halts, and waking it
//! costs a VM exit, an interrupt sent through the hypervisor and the host
//! scheduling the vCPU again. Every event of a stream arrives at an idle
//! gateway core and pays that, unless the guest polls before halting (Linux's
//! `cpuidle-haltpoll`, whose `guest_halt_poll_ns` is 0 on this project's test
//! machines). HAProxy offers the same trade as its `busy-polling` setting.
//!
//! The overhead benchmark (`loadtest/run overhead/pinned`) measures both
//! settings side by side; `loadtest/results/overhead/pinned/README.md` has
//! the figures: the gap the path adds shrinks, at the price of a core kept busy
//! for as long as streams are open.
//! Only for a gateway with cores of its own: sharing a core, it takes the
//! core from the processes it shares it with.
//!
//! How: one task per worker thread. While a request is in flight it yields
//! in a loop; a worker whose only work is a yielded task polls the I/O
//! driver without blocking (tokio's `park_timeout(0)`), runs what became
//! ready, then the task again. With nothing in flight, the tasks wait on a
//! [`Notify`] and the workers sleep as usual, so an idle gateway costs no
//! CPU. A request holds an [`Active`] from its arrival until its response
//! body ends (it travels in the body with the request's other resources).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::sync::{watch, Notify};
use tokio::task::JoinHandle;

/// Requests in flight, and the spinning tasks' wake-up.
#[derive(Debug, Default)]
pub struct BusyPoll {
    active: AtomicUsize,
    idle: Notify,
    /// Rounds of polling done (counted in batches), for tests and diagnostics.
    spins: AtomicU64,
    /// Polling tasks asleep, waiting for a request.
    asleep: AtomicUsize,
}

/// One request in flight; dropping it ends it.
#[derive(Debug)]
pub struct Active(Arc<BusyPoll>);

pin_project_lite::pin_project! {
    /// A response body that holds its request's [`Active`] until the body
    /// ends or is dropped (the client went away).
    pub struct Held<B> {
        #[pin]
        body: B,
        active: Option<Active>,
    }
}

impl<B> Held<B> {
    pub fn new(body: B, active: Active) -> Self {
        Held { body, active: Some(active) }
    }
}

impl<B: http_body::Body> http_body::Body for Held<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<B::Data>, B::Error>>> {
        let mut this = self.project();
        let polled = this.body.as_mut().poll_frame(cx);
        // The end: nothing more (a body of known length may never be polled
        // for its `None`, so its last frame counts too).
        if matches!(polled, std::task::Poll::Ready(None)) || this.body.is_end_stream() {
            this.active.take();
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

impl Drop for Active {
    fn drop(&mut self) {
        self.0.active.fetch_sub(1, Ordering::Release);
    }
}

impl BusyPoll {
    /// A request arrived: poll until it (and every other) has ended.
    pub fn enter(self: &Arc<Self>) -> Active {
        if self.active.fetch_add(1, Ordering::AcqRel) == 0 {
            self.idle.notify_waiters();
        }
        Active(self.clone())
    }

    /// Requests in flight.
    pub fn active(&self) -> usize {
        self.active.load(Ordering::Acquire)
    }

    /// Rounds of polling done so far.
    pub fn spins(&self) -> u64 {
        self.spins.load(Ordering::Relaxed)
    }

    /// Polling tasks asleep (nothing in flight).
    pub fn asleep(&self) -> usize {
        self.asleep.load(Ordering::Acquire)
    }

    /// Start one polling task per worker thread of the current runtime; they
    /// end when `stop` turns true (or is dropped).
    pub fn start(self: &Arc<Self>, stop: watch::Receiver<bool>) -> Vec<JoinHandle<()>> {
        let workers = tokio::runtime::Handle::current().metrics().num_workers();
        (0..workers.max(1))
            .map(|_| {
                let this = self.clone();
                let stop = stop.clone();
                tokio::spawn(async move { this.run(stop).await })
            })
            .collect()
    }

    async fn run(&self, mut stop: watch::Receiver<bool>) {
        // Shared state is written and the stop signal read once per
        // `CHECK_EVERY` rounds, not on every round: polling workers on
        // different cores would otherwise bounce those cache lines between
        // them without pause.
        const CHECK_EVERY: u64 = 64;
        let mut rounds = 0u64;
        loop {
            if self.active() > 0 {
                rounds += 1;
                if rounds == CHECK_EVERY {
                    self.spins.fetch_add(rounds, Ordering::Relaxed);
                    rounds = 0;
                    if *stop.borrow() {
                        return;
                    }
                }
                // Back of the run queue: every task that is ready runs first,
                // then the worker polls for I/O without sleeping.
                tokio::task::yield_now().await;
                continue;
            }
            self.spins.fetch_add(rounds, Ordering::Relaxed);
            rounds = 0;
            if *stop.borrow() {
                return;
            }
            // Nothing in flight: sleep until a request arrives. Registered
            // before the count is read again, so an arrival in between is
            // not missed.
            let arrived = self.idle.notified();
            tokio::pin!(arrived);
            arrived.as_mut().enable();
            if self.active() > 0 {
                continue;
            }
            self.asleep.fetch_add(1, Ordering::AcqRel);
            let stopped = tokio::select! {
                _ = arrived => false,
                r = stop.changed() => r.is_err(),
            };
            self.asleep.fetch_sub(1, Ordering::AcqRel);
            if stopped {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// Wait until `cond` holds; false after a generous 10 s.
    async fn until(cond: impl Fn() -> bool) -> bool {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while !cond() {
            if tokio::time::Instant::now() > deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        true
    }

    /// Both tasks asleep, and no polling while they are: the count stays put
    /// over many turns of the runtime.
    async fn assert_asleep(busy: &BusyPoll) {
        assert!(until(|| busy.asleep() == 2).await, "the polling tasks did not go to sleep with nothing in flight");
        let spins = busy.spins();
        for _ in 0..1_000 {
            tokio::task::yield_now().await;
        }
        assert_eq!(busy.spins(), spins, "polling with nothing in flight");
        assert_eq!(busy.asleep(), 2);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn polls_only_while_a_request_is_in_flight() {
        let busy = Arc::new(BusyPoll::default());
        let (stop_tx, stop) = watch::channel(false);
        let tasks = busy.start(stop);
        assert_eq!(tasks.len(), 2, "one task per worker thread");
        assert_asleep(&busy).await;

        // A request in flight: both tasks wake and poll.
        let a = busy.enter();
        assert_eq!(busy.active(), 1);
        let before = busy.spins();
        assert!(until(|| busy.asleep() == 0 && busy.spins() > before + 100).await, "no polling while a request is in flight");

        // Two at once; the first ending leaves the second polling.
        let b = busy.enter();
        drop(a);
        assert_eq!(busy.active(), 1);
        let before = busy.spins();
        assert!(until(|| busy.spins() > before + 100).await);
        assert_eq!(busy.asleep(), 0);

        // The last one ends: polling stops.
        drop(b);
        assert_eq!(busy.active(), 0);
        assert_asleep(&busy).await;

        // A request after a sleep wakes them again.
        let c = busy.enter();
        assert!(until(|| busy.asleep() == 0).await, "an arrival did not wake the polling tasks");
        drop(c);
        assert_asleep(&busy).await;

        stop_tx.send(true).ok();
        for t in tasks {
            assert!(tokio::time::timeout(Duration::from_secs(10), t).await.is_ok(), "a polling task did not stop");
        }
    }
}
