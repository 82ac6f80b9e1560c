//! Graceful shutdown of open connections: at shutdown each connection is
//! told to finish the requests it has and close, and the server waits until
//! all have closed (within its grace).
//!
//! A connection's future is polled at every event of every stream it
//! carries, so what it checks on each poll is one atomic load and one
//! comparison of wakers; the list of connections is locked only when a
//! connection opens, first runs, moves to another task, or closes. (A
//! `watch` channel's receiver, polled alongside, cost 300 instructions for
//! each streamed event: a lock to re-register its waker every time.)

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

use hyper_util::server::graceful::GracefulConnection;
use slab::Slab;
use tokio::sync::Notify;

/// The open connections, to be drained at shutdown.
#[derive(Clone, Default)]
pub(super) struct Drain {
    inner: Arc<Inner>,
}

#[derive(Default)]
struct Inner {
    closing: AtomicBool,
    /// Each open connection's task waker (a no-op one until it first runs).
    open: Mutex<Slab<Waker>>,
    /// Told when the last connection closes.
    emptied: Notify,
}

impl Inner {
    fn open(&self) -> MutexGuard<'_, Slab<Waker>> {
        // The list stays whole whatever panicked while it was held.
        self.open.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Drain {
    /// A place for a connection about to be served: counted from now, so a
    /// shutdown waits for it even before it first runs.
    pub(super) fn enter(&self) -> Entry {
        let key = self.inner.open().insert(Waker::noop().clone());
        Entry { inner: self.inner.clone(), key, waker: None }
    }

    /// Tell every connection to close once its requests are answered, and
    /// wait until all have closed.
    pub(super) async fn shutdown(&self) {
        self.inner.closing.store(true, Ordering::SeqCst);
        let wakers: Vec<Waker> = self.inner.open().iter().map(|(_, w)| w.clone()).collect();
        wakers.into_iter().for_each(Waker::wake);
        loop {
            let emptied = self.inner.emptied.notified();
            if self.inner.open().is_empty() {
                return;
            }
            emptied.await;
        }
    }

    #[cfg(test)]
    fn open_count(&self) -> usize {
        self.inner.open().len()
    }
}

/// One connection's place in the list, left when dropped.
pub(super) struct Entry {
    inner: Arc<Inner>,
    key: usize,
    /// The waker last stored in the list.
    waker: Option<Waker>,
}

impl Entry {
    /// Serve `conn`, closing it gracefully once shutdown begins.
    pub(super) fn watch<C: GracefulConnection>(self, conn: C) -> Draining<C> {
        Draining { conn, entry: self, told: false }
    }

    /// Whether shutdown has begun, the current task's waker stored first
    /// where it is not already (so a shutdown that begins after the check
    /// wakes this task).
    fn closing(&mut self, cx: &Context<'_>) -> bool {
        if self.inner.closing.load(Ordering::Acquire) {
            return true;
        }
        if self.waker.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
            return false;
        }
        self.inner.open()[self.key] = cx.waker().clone();
        self.waker = Some(cx.waker().clone());
        self.inner.closing.load(Ordering::Acquire)
    }
}

impl Drop for Entry {
    fn drop(&mut self) {
        let mut open = self.inner.open();
        open.remove(self.key);
        if open.is_empty() {
            self.inner.emptied.notify_waiters();
        }
    }
}

pin_project_lite::pin_project! {
    /// A connection being served; told to close gracefully at shutdown.
    pub(super) struct Draining<C> {
        #[pin]
        conn: C,
        entry: Entry,
        told: bool,
    }
}

impl<C: GracefulConnection> Future for Draining<C> {
    type Output = C::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<C::Output> {
        let mut this = self.project();
        if !*this.told && this.entry.closing(cx) {
            *this.told = true;
            this.conn.as_mut().graceful_shutdown();
        }
        this.conn.poll(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::task::Wake;

    #[derive(Default)]
    struct Count(std::sync::atomic::AtomicUsize);
    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// A shutdown wakes a connection that waits, whatever task polled it
    /// last, and waits for every place taken, run or not, to be left.
    #[tokio::test]
    async fn shutdown_wakes_the_last_waker_and_waits_for_every_connection() {
        let drain = Drain::default();
        let (mut a, b) = (drain.enter(), drain.enter());
        assert_eq!(drain.open_count(), 2);
        let (first, second) = (Arc::new(Count::default()), Arc::new(Count::default()));
        for w in [&first, &second] {
            let waker = Waker::from(w.clone());
            assert!(!a.closing(&Context::from_waker(&waker)));
        }
        let stop = tokio::spawn({
            let drain = drain.clone();
            async move { drain.shutdown().await }
        });
        // The shutdown has woken `a`'s latest waker, not the one it replaced.
        while second.0.load(Ordering::SeqCst) == 0 {
            tokio::task::yield_now().await;
        }
        assert_eq!(first.0.load(Ordering::SeqCst), 0);
        assert!(a.closing(&Context::from_waker(&Waker::from(second.clone()))));
        drop(a);
        tokio::task::yield_now().await;
        assert!(!stop.is_finished(), "a place never run is still waited for");
        drop(b);
        stop.await.expect("shutdown ends once every connection closed");
        assert_eq!(drain.open_count(), 0);
    }
}
