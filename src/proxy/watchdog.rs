//! The watchdog: an observed body's deadlines are checked whether or not
//! anyone polls the body, by the gateway's watch list (docs/architecture.md,
//! "Guards travel in the response body").

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use tokio::time::Instant;

use super::observe::ObservedBody;
use crate::error::BoxError;
use crate::sync::{Watch, Watching, Watchlist};
use crate::telemetry::Outcome;

impl<B> ObservedBody<B> {
    /// The watchdog's check at `now`: end the request if a deadline passed
    /// (a timeout, or a client that took nothing for the send timeout);
    /// otherwise when to look again. `None`: nothing left to watch.
    fn watch(&mut self, now: Instant) -> Option<Instant> {
        if self.done {
            return None;
        }
        self.ask_if_due(now);
        let due = self.next_deadline(self.last_event);
        if now >= due {
            if !self.on_timeout() {
                // Continued on another replica: the poller picks it up.
                if let Some(w) = self.waker.take() {
                    w.wake();
                }
                return Some(self.next_deadline(self.last_event));
            }
        } else if let Some(t) = self.handed_over.filter(|t| now >= *t + self.timeouts.send) {
            let what = format!("slogate: the client took no data for {:?} (server.send_timeout)", now - t);
            tracing::warn!(request_id = self.tracker.request_id.to_str().unwrap_or(""), class = %self.tracker.class().name, model = %self.tracker.model(), "{what}; cancelling the request");
            self.inner = None;
            self.trailer = None;
            self.tracker.finish(Outcome::cancelled);
            self.done = true;
        } else {
            return Some(self.handed_over.map_or(due, |t| due.min(t + self.timeouts.send)));
        }
        // Ended here, not in a poll: the replica's request is cancelled (its
        // body dropped), the slot given back and the request accounted for
        // now; a client still reading gets the trailer.
        self.inner = None;
        self.tracker.close();
        if let Some(w) = self.waker.take() {
            w.wake();
        }
        None
    }
}

/// An observed body whose deadlines fire whether or not anyone polls it.
/// A client that stops reading (a full TCP window, an HTTP/2 stream with
/// no window) stops the server from polling the body; without this, its
/// first-token, idle and total deadlines would never be checked and its
/// replica slot never given back. The body is on the gateway's
/// [`Watchlist`] while it lives: looked at every tick (a deadline is seen
/// up to [`crate::sync::TICK`] late when nothing polls the body; a polled
/// body keeps its deadlines to the moment).
pub(crate) struct Watched<B> {
    // Off the list first (fields drop in order), so that the body itself
    // is dropped here, not under the list's lock.
    _watching: Watching,
    core: Arc<std::sync::Mutex<ObservedBody<B>>>,
}

impl<B> Watch for std::sync::Mutex<ObservedBody<B>>
where
    B: Send,
{
    fn watch(&self, now: Instant) -> bool {
        match self.try_lock() {
            Ok(mut body) => body.watch(now).is_some(),
            // Being polled: looked at on the next tick.
            Err(std::sync::TryLockError::WouldBlock) => true,
            Err(std::sync::TryLockError::Poisoned(_)) => false,
        }
    }
}

impl<B> Watched<B>
where
    B: Send + 'static,
{
    pub(crate) fn new(body: ObservedBody<B>, list: &Arc<Watchlist>) -> Self {
        let core = Arc::new(std::sync::Mutex::new(body));
        let _watching = list.add(core.clone());
        Watched { _watching, core }
    }
}

impl<B> Body for Watched<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let Ok(mut body) = self.core.lock() else { return Poll::Ready(Some(Err("observed body poisoned".into()))) };
        let polled = Pin::new(&mut *body).poll_frame(cx);
        match &polled {
            // A data frame's arrival was just stamped (`last_event`): no second clock read.
            Poll::Ready(Some(Ok(f))) if f.is_data() => body.handed_over = Some(body.last_event),
            Poll::Ready(Some(Ok(_))) => body.handed_over = Some(Instant::now()),
            Poll::Pending => {
                body.handed_over = None;
                if !body.waker.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                    body.waker = Some(cx.waker().clone());
                }
            }
            _ => body.handed_over = None,
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.core.lock().map(|b| b.is_end_stream()).unwrap_or(true)
    }

    fn size_hint(&self) -> SizeHint {
        self.core.lock().map(|b| b.size_hint()).unwrap_or_default()
    }
}
