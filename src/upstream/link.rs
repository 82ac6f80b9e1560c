//! One connection to a replica, driven by the task that uses it: the
//! request waiting for its answer's head, then the response body.
//!
//! hyper's client connection hands what it decodes to the answer (the head's
//! one-shot channel, then the body's one-slot channel), and the two ends wake
//! each other: decoding a chunk wakes the body, taking it wakes the
//! connection. Here one task polls both ends, one after the other, in the
//! same poll, so those wakes can only tell it what it is about to see: each
//! would schedule the task once more, to find nothing new. That was a second
//! poll of the whole response path (the client's connection, the body, the
//! replica's connection) for every streamed event, and often a wake-up of a
//! second worker thread to run it.
//!
//! [`Link::drive_then`] polls both ends under a waker that knows when its
//! task is inside that poll. A wake then is noted, not passed on: when the
//! poll is about to return `Pending` it looks again itself (twice at most,
//! then the wake goes to the task: a yield asked for); when it returns
//! a frame, its caller polls again before it waits (what the wake was for is
//! kept where it happened: a socket's readiness, a channel's item). A wake
//! at any other time (the replica's socket became readable) goes to the task
//! at once, as any wake does.
//!
//! A link whose poll returned `Pending` stays quiet until one of those wakes:
//! polled again before it (hyper's server polls a body twice more after
//! each frame it writes), it answers `Pending` at once, since everything it
//! waits on was asked to wake it and none has. That was two passes per
//! streamed event through the replica's connection and the body's channel
//! that could find nothing.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

use futures_util::task::AtomicWaker;
use hyper::client::conn::http1::{Connection, SendRequest};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

use super::payload::SendBody;

type Conn = Connection<TokioIo<Stream>, SendBody>;

/// A connection: hyper's sending half and the connection it drives,
/// boxed once when it is opened, so that handing it from the idle list to a
/// request, through the response and back moves a pointer rather than
/// hyper's state (about 700 bytes, copied at every hand-over).
pub(super) struct Link {
    pub(super) tx: SendRequest<SendBody>,
    conn: Conn,
    in_poll: Arc<InPoll>,
    /// `in_poll` as a waker, made once.
    waker: Waker,
}

impl Link {
    pub(super) fn new(tx: SendRequest<SendBody>, conn: Conn) -> Box<Link> {
        let in_poll = Arc::new(InPoll { state: AtomicU8::new(IDLE), task: AtomicWaker::new() });
        let waker = Waker::from(in_poll.clone());
        Box::new(Link { tx, conn, in_poll, waker })
    }

    /// Drive the connection alone (read, decode, write what is queued):
    /// false once it has ended (closed, or failed), when it is not used
    /// again. For the idle list's checks, with a waker that does nothing.
    pub(super) fn drive(&mut self, cx: &mut Context<'_>) -> bool {
        // Whoever takes it next looks at it first: it is not quiet for them.
        self.in_poll.state.store(IDLE, Ordering::Release);
        Pin::new(&mut self.conn).poll(cx).is_pending()
    }

    /// Drive the connection, then poll `take` (what the connection feeds:
    /// the answer's head, or its body), in this one poll of `cx`'s task (see
    /// the module docs): whether the connection is still open, and what
    /// `take` gave.
    pub(super) fn drive_then<T>(&mut self, cx: &mut Context<'_>, mut take: impl FnMut(&mut Context<'_>) -> Poll<T>) -> (bool, Poll<T>) {
        self.in_poll.task.register(cx.waker());
        // Nothing woke the link since it last returned `Pending`: it would
        // again (every source it waits on was asked to wake it). hyper's
        // server polls a body again after each frame it writes, twice,
        // and this answers those polls without going through the replica's
        // connection and the body's channel.
        // (A wake after this look finds the link quiet, makes it idle and
        // wakes the task, whose next poll looks.)
        if self.in_poll.state.load(Ordering::Acquire) == QUIET {
            return (true, Poll::Pending);
        }
        self.in_poll.state.store(POLLING, Ordering::Release);
        let mut inner = Context::from_waker(&self.waker);
        for _ in 0..LOOKS {
            let open = Pin::new(&mut self.conn).poll(&mut inner).is_pending();
            let got = take(&mut inner);
            if got.is_ready() || !open {
                // The caller polls again before it waits (or the connection
                // is gone): a wake noted now has nothing left to tell.
                self.in_poll.state.store(IDLE, Ordering::Release);
                return (open, got);
            }
            if self.in_poll.leave() {
                return (open, got);
            }
            // Woken while polling: something changed after it was looked at.
        }
        // Woken at every look: something asks the task to yield (hyper's
        // connection hands the thread back after a run of work by waking
        // its task at once). The task is woken, as any wake does, and polls
        // again after the others.
        self.in_poll.state.store(IDLE, Ordering::Release);
        cx.waker().wake_by_ref();
        (true, Poll::Pending)
    }
}

/// [`Link::drive_then`] on a connection that may have ended (`None`), which
/// is dropped when it ends; with none, `take` alone is polled.
pub(super) fn poll_through<T>(
    link: &mut Option<Box<Link>>,
    cx: &mut Context<'_>,
    mut take: impl FnMut(&mut Context<'_>) -> Poll<T>,
) -> Poll<T> {
    let Some(l) = link.as_mut() else { return take(cx) };
    let (open, got) = l.drive_then(cx, take);
    if !open {
        *link = None;
    }
    got
}

/// How many times one poll looks again after a wake during it before it
/// leaves the wake to the task: the handing over of a chunk needs one.
const LOOKS: usize = 3;

/// Not being polled (and the last poll gave something, or it was woken since).
const IDLE: u8 = 0;
const POLLING: u8 = 1;
/// Polling, and woken since the poll began.
const WOKEN: u8 = 2;
/// Not being polled, and not woken since its last poll returned `Pending`.
const QUIET: u8 = 3;

/// A link's waker: notes a wake while its task polls the link, passes one on
/// to the task otherwise.
struct InPoll {
    state: AtomicU8,
    /// The task that polled the link last.
    task: AtomicWaker,
}

impl InPoll {
    /// End a poll that returns `Pending`: false when a wake came during it
    /// (the poll goes on, looking again). Left quiet: until a wake, polling
    /// again would find nothing.
    fn leave(&self) -> bool {
        match self.state.compare_exchange(POLLING, QUIET, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => true,
            Err(_) => {
                self.state.store(POLLING, Ordering::Release);
                false
            }
        }
    }
}

impl Wake for InPoll {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        // Polling: noted (the poll looks again). Already noted: nothing.
        // Not polling: the task is woken (and a quiet link is no longer).
        // Retried when the state moved under it, so that a wake always
        // lands in one of the two.
        let mut now = self.state.load(Ordering::Acquire);
        loop {
            let to = match now {
                POLLING => WOKEN,
                QUIET => IDLE,
                WOKEN => return,
                _ => break,
            };
            match self.state.compare_exchange(now, to, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) if to == WOKEN => return,
                Ok(_) => break,
                Err(moved) => now = moved,
            }
        }
        self.task.wake();
    }
}

/// A connection to a replica: plain TCP, or TLS over it (`https://`).
pub(crate) struct Stream {
    io: Io,
    /// The replica stopped taking what is written (it answered and closed,
    /// say, before reading all of an upload): what follows is dropped, so
    /// its answer is still read (see [`Stream::poll_write`]).
    write_failed: bool,
}

enum Io {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::client::TlsStream<TcpStream>>),
}

impl Stream {
    pub(crate) fn plain(tcp: TcpStream) -> Stream {
        Stream { io: Io::Plain(tcp), write_failed: false }
    }

    pub(crate) fn tls(tls: tokio_rustls::client::TlsStream<TcpStream>) -> Stream {
        Stream { io: Io::Tls(Box::new(tls)), write_failed: false }
    }

    /// A write that failed because the replica closed or reset the
    /// connection is taken as written, and so is every later one: a
    /// replica may answer a request before reading all of its body (a 404
    /// for an upload) and close, and its answer, already in this
    /// connection's receive buffer, must still be read rather than lost to
    /// the write's error. A replica that answered nothing leaves the read
    /// its error (or end) to report, as before.
    fn wrote(&mut self, r: Poll<std::io::Result<usize>>, len: usize) -> Poll<std::io::Result<usize>> {
        match r {
            Poll::Ready(Err(e))
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::BrokenPipe | std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::ConnectionAborted
                ) =>
            {
                self.write_failed = true;
                Poll::Ready(Ok(len))
            }
            other => other,
        }
    }
}

impl AsyncRead for Stream {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        match &mut self.get_mut().io {
            Io::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        if this.write_failed {
            return Poll::Ready(Ok(buf.len()));
        }
        let r = match &mut this.io {
            Io::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        };
        this.wrote(r, buf.len())
    }
    fn poll_write_vectored(self: Pin<&mut Self>, cx: &mut Context<'_>, bufs: &[std::io::IoSlice<'_>]) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        let len = bufs.iter().map(|b| b.len()).sum();
        if this.write_failed {
            return Poll::Ready(Ok(len));
        }
        let r = match &mut this.io {
            Io::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        };
        this.wrote(r, len)
    }
    fn is_write_vectored(&self) -> bool {
        match &self.io {
            Io::Plain(s) => s.is_write_vectored(),
            Io::Tls(s) => s.is_write_vectored(),
        }
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        if this.write_failed {
            return Poll::Ready(Ok(()));
        }
        match &mut this.io {
            Io::Plain(s) => Pin::new(s).poll_flush(cx),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        if this.write_failed {
            return Poll::Ready(Ok(()));
        }
        match &mut this.io {
            Io::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    struct Count(AtomicUsize);

    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// A wake while the task polls is noted (the poll looks again) and
    /// reaches no one; a wake after the poll reaches the task.
    #[test]
    fn a_wake_during_a_poll_is_noted_and_one_after_it_reaches_the_task() {
        let task = Arc::new(Count(AtomicUsize::new(0)));
        let in_poll = Arc::new(InPoll { state: AtomicU8::new(IDLE), task: AtomicWaker::new() });
        let waker = Waker::from(in_poll.clone());
        in_poll.task.register(&Waker::from(task.clone()));
        in_poll.state.store(POLLING, Ordering::Release);
        waker.wake_by_ref();
        waker.wake_by_ref();
        assert_eq!(task.0.load(Ordering::SeqCst), 0, "woken while polling: noted, not passed on");
        assert!(!in_poll.leave(), "woken during the poll: it looks again");
        assert!(in_poll.leave(), "nothing since: it ends");
        waker.wake_by_ref();
        assert_eq!(task.0.load(Ordering::SeqCst), 1, "woken after the poll: the task is woken");
    }
}
