//! One connection to a replica and the exchange on it: the request written,
//! the answer's head read, then its body, all driven by the task that uses
//! the answer (the task that writes to the client). What the bytes mean is
//! [`super::wire`]'s; the rules: docs/design/replica-connections.md.
//!
//! Nothing is handed between tasks or through channels: a poll of the
//! answer's body reads the socket, decodes what it read and returns it, so
//! the socket's readiness wakes the one task that writes the event on, and
//! an event already in the read buffer goes out in the same poll. A
//! connection holds its socket, its read buffer (sized by [`ReadSize`],
//! taken back when it empties) and, while a request goes out, what is left
//! of it: nothing else lives as long as an open stream.

use std::io::IoSlice;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::{Buf, Bytes, BytesMut};
use http::{Method, Response};
use http_body::{Body, SizeHint};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

use super::outgoing::Outgoing;
use super::payload::SendBody;
use super::wire::{self, Decoded, Framing, WireError};

/// How a connection's read buffer is sized.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ReadSize {
    /// This many bytes at a time, for a connection that carries streams:
    /// a stream's head and events are small, and it holds its connection
    /// for minutes.
    Exact(usize),
    /// Starting here and doubling while reads fill it (to
    /// [`MAX_ADAPTIVE`]): a whole answer arrives in a few reads.
    Adaptive(usize),
}

thread_local! {
    /// A stream's connection's reads while it holds no bytes of its own
    /// ([`Link::read_scratch`]), one per worker thread.
    static SCRATCH: std::cell::RefCell<Scratch> = std::cell::RefCell::new(Scratch::default());
}

/// A worker thread's buffers for streams' reads: `read`, never handed on,
/// reused by every read; `out`, where the events read are copied and split
/// off as frames (a slice of a shared block: no allocation of their own,
/// and a block is reused once the frames cut from it are written, or a new
/// one of [`OUT_BLOCK`] taken while they are not).
#[derive(Default)]
struct Scratch {
    read: BytesMut,
    out: BytesMut,
}

/// The blocks a thread's events are copied into. A frame keeps its block
/// alive until it is written: a client that stops reading holds a block
/// for each frame queued for it (hyper queues up to 16), so blocks are
/// small.
const OUT_BLOCK: usize = 2048;

/// The most an adaptive read buffer grows to.
const MAX_ADAPTIVE: usize = 256 * 1024;

/// The largest read size at which a connection for whole answers keeps its
/// buffer while idle: an embeddings answer's (1,024 floats grow it to
/// 16 KiB). After a larger answer (a replica's `/metrics`, read by the load
/// scrape) the buffer is let go, and the reads start from the first size.
const KEPT_IDLE: usize = 16 * 1024;

/// The first read size of a connection for whole answers.
pub(super) const FIRST_ADAPTIVE: usize = 8192;

/// Where a connection is in its exchange.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// No request on it: it may take one.
    Idle,
    /// A request went out (or is going out); its answer's head is awaited.
    Head,
    /// The answer's body, delimited so.
    Body(Framing),
    /// The answer was read whole.
    Done,
    /// It failed, or cannot carry another request: it is closed once dropped.
    Broken,
}

/// What is left of a request on its way out.
struct Out {
    /// The request's head, and how much of it is written. A `Vec` of its
    /// own: made `Bytes`, one shorter than its allocation takes another.
    head: Vec<u8>,
    head_at: usize,
    body: SendBody,
    /// The body's bytes now being written.
    chunk: Bytes,
    /// The body has ended: what is written is flushed, and it is sent.
    ended: bool,
}

/// A connection to a replica, boxed once when it is opened, so that
/// handing it from the idle list to a request, through its answer and back
/// moves a pointer.
pub(super) struct Link {
    io: Stream,
    buf: BytesMut,
    size: ReadSize,
    state: State,
    /// The request's method, which says whether its answer has a body.
    method: Method,
    out: Option<Out>,
    /// The answer lets the connection carry another request.
    keep_alive: bool,
}

impl Link {
    pub(super) fn new(io: Stream, size: ReadSize) -> Box<Link> {
        Box::new(Link { io, buf: BytesMut::new(), size, state: State::Idle, method: Method::GET, out: None, keep_alive: true })
    }

    /// Whether an idle connection is still open: a replica that closed it
    /// has left an end of file that one read sees at once (the waker is
    /// replaced at the next real poll). Anything else read there (bytes
    /// nobody asked for) makes it unusable too.
    pub(super) fn alive(&mut self, cx: &mut Context<'_>) -> bool {
        if self.state != State::Idle || !self.buf.is_empty() {
            return false;
        }
        let mut probe = [0u8; 1];
        match Pin::new(&mut self.io).poll_read(cx, &mut ReadBuf::new(&mut probe)) {
            Poll::Pending => true,
            Poll::Ready(_) => {
                self.state = State::Broken;
                false
            }
        }
    }

    /// The answer was read whole and the connection may take another request.
    pub(super) fn reusable(&self) -> bool {
        matches!(self.state, State::Done | State::Idle) && self.keep_alive && self.out.is_none() && self.buf.is_empty()
    }

    /// Made ready for its next request (kept idle). A connection for
    /// streams lets its read buffer go; one for whole answers keeps it for
    /// the next (it is taken back whole once the answer's bytes are
    /// written) unless it grew past [`KEPT_IDLE`].
    pub(super) fn rest(&mut self) {
        self.state = State::Idle;
        match &mut self.size {
            ReadSize::Exact(_) => self.buf = BytesMut::new(),
            ReadSize::Adaptive(size) if *size > KEPT_IDLE => {
                self.buf = BytesMut::new();
                *size = FIRST_ADAPTIVE;
            }
            ReadSize::Adaptive(_) => {}
        }
    }

    /// Begin sending `req` (its target in origin form, `Host` written):
    /// written as the exchange is polled.
    pub(super) fn start(&mut self, req: Outgoing) {
        let hint = req.body().size_hint();
        let (method, head, body) = req.finish(hint.exact().unwrap_or_else(|| hint.lower()));
        self.method = method;
        // Bytes in memory go out with the head; an upload as it comes.
        let (chunk, body) = match body {
            SendBody::Bytes(b) => (b.unwrap_or_default(), SendBody::Bytes(None)),
            upload => (Bytes::new(), upload),
        };
        self.out = Some(Out { head, head_at: 0, body, chunk, ended: false });
        self.state = State::Head;
        self.keep_alive = true;
    }

    /// Write what can be written of the request: ready once it is all
    /// out (flushed), pending while the socket or the body's next bytes
    /// are not ready.
    fn send(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), WireError>> {
        while let Some(out) = self.out.as_mut() {
            if out.head_at < out.head.len() {
                // The head and the body's first bytes in one write.
                let head = &out.head[out.head_at..];
                let bufs = [IoSlice::new(head), IoSlice::new(&out.chunk)];
                let n = wrote(ready!(Pin::new(&mut self.io).poll_write_vectored(cx, &bufs)))?;
                let from_head = n.min(head.len());
                out.head_at += from_head;
                out.chunk.advance(n - from_head);
            } else if !out.chunk.is_empty() {
                let n = wrote(ready!(Pin::new(&mut self.io).poll_write(cx, &out.chunk)))?;
                out.chunk.advance(n);
            } else if out.ended {
                ready!(Pin::new(&mut self.io).poll_flush(cx)).map_err(WireError::Io)?;
                self.out = None;
            } else {
                match ready!(Pin::new(&mut out.body).poll_frame(cx)) {
                    Some(Ok(frame)) => out.chunk = frame.into_data().unwrap_or_default(),
                    Some(Err(e)) => return Poll::Ready(Err(WireError::Body(e.to_string()))),
                    None => out.ended = true,
                }
            }
        }
        Poll::Ready(Ok(()))
    }

    /// Go on sending the request, as far as it can go now; a failure
    /// leaves the connection broken.
    fn send_some(&mut self, cx: &mut Context<'_>) -> Result<(), WireError> {
        if self.out.is_none() {
            return Ok(());
        }
        match self.send(cx) {
            Poll::Ready(Err(e)) => {
                self.state = State::Broken;
                self.out = None;
                Err(e)
            }
            _ => Ok(()),
        }
    }

    /// Read more into the buffer: the bytes read, 0 at the end of file.
    fn fill(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Result<usize>> {
        // Taken back whole when what was read has all been handed on. A
        // stream reads into what is left down to a quarter; a whole answer
        // starts with a whole size's room, the buffer taken back in place
        // once the last answer's bytes are gone (read into the room left
        // behind it, an answer was split over two buffers, and a new one
        // was allocated for every other answer).
        let (next, least) = match self.size {
            ReadSize::Exact(n) => (n, n / 4),
            ReadSize::Adaptive(n) => (n, n),
        };
        if self.buf.capacity() - self.buf.len() < least {
            self.buf.reserve(next);
        }
        let room = self.buf.capacity() - self.buf.len();
        let n = match tokio_util::io::poll_read_buf(Pin::new(&mut self.io), cx, &mut self.buf) {
            Poll::Ready(r) => r?,
            Poll::Pending => {
                // A stream waits for its next event (a second, for a slow
                // generation) holding no read buffer when it has handed on
                // all it read.
                if self.buf.is_empty() && matches!(self.size, ReadSize::Exact(_)) {
                    self.buf = BytesMut::new();
                }
                return Poll::Pending;
            }
        };
        // A whole answer's room is at least its size (above), so a read
        // that filled it says the answers are larger.
        if let ReadSize::Adaptive(size) = &mut self.size {
            if n == room && *size < MAX_ADAPTIVE {
                *size *= 2;
            }
        }
        Poll::Ready(Ok(n))
    }

    /// Drive the exchange until the answer's head has come.
    pub(super) fn poll_head(&mut self, cx: &mut Context<'_>) -> Poll<Result<Response<()>, WireError>> {
        let r = self.head(cx);
        if let Poll::Ready(Err(_)) = r {
            self.state = State::Broken;
        }
        r
    }

    fn head(&mut self, cx: &mut Context<'_>) -> Poll<Result<Response<()>, WireError>> {
        self.send_some(cx)?;
        loop {
            if let Some(head) = wire::parse_head(&mut self.buf, &self.method)? {
                self.keep_alive = head.keep_alive;
                self.state = head.framing.map_or(State::Done, State::Body);
                return Poll::Ready(Ok(head.response));
            }
            let was_empty = self.buf.is_empty();
            match ready!(self.fill(cx)) {
                Ok(0) if was_empty => return Poll::Ready(Err(WireError::Closed)),
                Ok(0) => return Poll::Ready(Err(WireError::Incomplete)),
                Ok(_) => {}
                Err(e) => return Poll::Ready(Err(WireError::Io(e))),
            }
        }
    }

    /// The answer's body's next bytes; `None` at its end. The request's
    /// rest (an upload the replica answered before reading it all) goes
    /// on out meanwhile.
    pub(super) fn poll_data(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Bytes, WireError>>> {
        let r = self.data(cx);
        if let Poll::Ready(Some(Err(_))) = r {
            self.state = State::Broken;
        }
        r
    }

    fn data(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Bytes, WireError>>> {
        if let Err(e) = self.send_some(cx) {
            return Poll::Ready(Some(Err(e)));
        }
        loop {
            let State::Body(framing) = &mut self.state else { return Poll::Ready(None) };
            match wire::decode(&mut self.buf, framing) {
                Ok(Decoded::Data(n)) => {
                    if *framing == Framing::Length(0) {
                        self.state = State::Done;
                    }
                    return Poll::Ready(Some(Ok(self.take(n))));
                }
                Ok(Decoded::End) => {
                    self.state = State::Done;
                    return Poll::Ready(None);
                }
                Ok(Decoded::More) => {}
                Err(e) => return Poll::Ready(Some(Err(e))),
            }
            let close_delimited = *framing == Framing::Close;
            let read = if matches!(self.size, ReadSize::Exact(_)) && self.buf.is_empty() {
                // Emptied (the head, a chunk a read left unfinished): let go.
                self.buf = BytesMut::new();
                match ready!(self.read_scratch(cx)) {
                    Ok(Some(data)) => {
                        if self.state == State::Body(Framing::Length(0)) {
                            self.state = State::Done;
                        }
                        if data.is_empty() {
                            continue;
                        }
                        return Poll::Ready(Some(Ok(data)));
                    }
                    Ok(None) => Ok(0),
                    Err(e) => return Poll::Ready(Some(Err(e))),
                }
            } else {
                ready!(self.fill(cx))
            };
            match read {
                Ok(0) if close_delimited => {
                    self.keep_alive = false;
                    self.state = State::Done;
                    return Poll::Ready(None);
                }
                Ok(0) => return Poll::Ready(Some(Err(WireError::Incomplete))),
                Ok(_) => {}
                Err(e) => return Poll::Ready(Some(Err(WireError::Io(e)))),
            }
        }
    }

    /// A stream's read while it holds no bytes of its own: into this
    /// thread's scratch buffer, every piece of the body in it copied out
    /// at once as one frame (empty: the read held only framing), what is
    /// left (part of a chunk's framing) kept as the connection's own until
    /// it completes. `None`: the end of file. So a stream holds no read
    /// buffer between its events, and an event costs no allocation of its
    /// own (see [`Scratch`]).
    fn read_scratch(&mut self, cx: &mut Context<'_>) -> Poll<Result<Option<Bytes>, WireError>> {
        let ReadSize::Exact(size) = self.size else { return Poll::Ready(Ok(Some(Bytes::new()))) };
        SCRATCH.with(|scratch| {
            // Never borrowed twice: a poll does not re-enter.
            let Scratch { read, out } = &mut *scratch.borrow_mut();
            read.clear();
            if read.capacity() < size {
                read.reserve(size);
            }
            let n = ready!(tokio_util::io::poll_read_buf(Pin::new(&mut self.io), cx, read)).map_err(WireError::Io)?;
            if n == 0 {
                return Poll::Ready(Ok(None));
            }
            let State::Body(framing) = &mut self.state else { return Poll::Ready(Ok(Some(Bytes::new()))) };
            // At most what was read is body: room for it, in this block or the next.
            if out.capacity() < read.len() {
                out.reserve(read.len().max(OUT_BLOCK));
            }
            while let Decoded::Data(k) = wire::decode(read, framing)? {
                out.extend_from_slice(&read[..k]);
                read.advance(k);
            }
            self.buf.extend_from_slice(read);
            Poll::Ready(Ok(Some(out.split().freeze())))
        })
    }

    /// The buffer's first `n` bytes, taken out. A stream's are copied
    /// (what completes a chunk a read left unfinished), so that nothing
    /// handed on keeps the buffer alive and it is freed while the stream
    /// waits for its next event; a whole answer's are handed on as they
    /// lie in the buffer.
    fn take(&mut self, n: usize) -> Bytes {
        match self.size {
            ReadSize::Exact(_) => {
                let data = Bytes::copy_from_slice(&self.buf[..n]);
                self.buf.advance(n);
                data
            }
            ReadSize::Adaptive(_) => self.buf.split_to(n).freeze(),
        }
    }

    /// The read buffer's capacity: what the connection holds between reads.
    #[cfg(test)]
    pub(super) fn holds(&self) -> usize {
        self.buf.capacity()
    }

    /// Where the read buffer's room starts (tests: which buffer is read into).
    #[cfg(test)]
    pub(super) fn buffer_at(&self) -> usize {
        self.buf.as_ptr() as usize
    }

    /// The body has been read to its end (or has none).
    pub(super) fn body_ended(&self) -> bool {
        matches!(self.state, State::Done)
    }

    /// What is known of the body's length from here.
    pub(super) fn size_hint(&self) -> SizeHint {
        match self.state {
            State::Done => SizeHint::with_exact(0),
            State::Body(Framing::Length(n)) => SizeHint::with_exact(n),
            _ => SizeHint::default(),
        }
    }
}

/// A write's bytes, or why none: a write of none is an error.
fn wrote(r: std::io::Result<usize>) -> Result<usize, WireError> {
    match r {
        Ok(0) => Err(WireError::Io(std::io::ErrorKind::WriteZero.into())),
        Ok(n) => Ok(n),
        Err(e) => Err(WireError::Io(e)),
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
            Io::Plain(s) => crate::flat::poll_write_flat(Pin::new(s), cx, bufs),
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
