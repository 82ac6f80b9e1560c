//! A request body on its way to a replica: bytes in memory, or an upload
//! still arriving from its client ([`Upload`]: a multipart form the gateway
//! read only as far as it routes on, the rest passed on as it comes).
//!
//! An upload can be sent once. A retry that finds it untouched (the
//! connection failed before any of it was read) sends it whole; one that
//! finds part of it gone fails with [`UploadFailure::Resend`], as the
//! caller's bytes are not kept. A form read whole before it could be routed
//! is kept, in the frames it came in ([`Upload::in_memory`]), and every
//! attempt sends it all. The rules are docs/access.md's (1 and 2).

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use super::client_body::ClientBody;
use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use std::time::Duration;

use tokio::time::Sleep;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// What a replica is sent.
#[derive(Debug, Clone)]
pub(crate) enum SendBody {
    Bytes(Option<Bytes>),
    /// Boxed: the request travels by value (from its building through the
    /// send to its connection), and with an upload's state inline every
    /// request would carry its size.
    Upload(Box<Upload>),
}

impl From<Upload> for SendBody {
    fn from(u: Upload) -> Self {
        SendBody::Upload(Box::new(u))
    }
}

impl From<Bytes> for SendBody {
    fn from(b: Bytes) -> Self {
        SendBody::Bytes(Some(b))
    }
}

impl Body for SendBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.get_mut() {
            SendBody::Bytes(b) => Poll::Ready(b.take().filter(|b| !b.is_empty()).map(|b| Ok(Frame::data(b)))),
            SendBody::Upload(u) => u.poll_next(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            SendBody::Bytes(b) => b.as_ref().is_none_or(Bytes::is_empty),
            SendBody::Upload(u) => u.len == 0,
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            SendBody::Bytes(b) => SizeHint::with_exact(b.as_ref().map_or(0, |b| b.len() as u64)),
            SendBody::Upload(u) => SizeHint::with_exact(u.len),
        }
    }
}

/// What reads an upload's rest as it passes (the form's reader): it may
/// refuse the upload at any byte, and the upload's last bytes go on only
/// once it has accepted the whole, so a replica never completes a request
/// whose body it refused.
pub(crate) trait UploadCheck: Send + Sync {
    /// The next bytes of the rest; `Err`: why the upload is refused.
    fn feed(&mut self, data: &[u8]) -> Result<(), String>;
    /// The upload ended here; `Err`: why it is refused.
    fn end(&mut self) -> Result<(), String>;
}

/// Why an upload did not reach its replica whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum UploadFailure {
    /// The client did not send the rest before the body read timeout.
    Timeout,
    /// The client's connection failed, or it sent another length than it declared.
    Read,
    /// An attempt on a replica that failed had taken part of it.
    Resend,
    /// Its check refused it (the reason: [`Upload::refusal`]).
    Refused,
}

impl UploadFailure {
    fn message(self) -> &'static str {
        match self {
            UploadFailure::Timeout => "the client did not send the rest of the upload in time",
            UploadFailure::Read => "the rest of the upload could not be read from the client",
            UploadFailure::Resend => "part of the upload went to a replica that failed; it is not kept, so it cannot be sent again",
            UploadFailure::Refused => "the upload was refused",
        }
    }
}

/// The part of an upload not yet sent: what was read while routing, then
/// the client's body.
struct Rest {
    read: VecDeque<Bytes>,
    body: Option<ClientBody>,
    /// Bytes still to come from `body`.
    left: u64,
    /// How long the rest may take, from the first time a replica reads it
    /// (time in the admission queue does not count).
    within: Duration,
    timeout: Option<Pin<Box<Sleep>>>,
    /// Reads the rest as it passes.
    check: Option<Box<dyn UploadCheck>>,
}

/// The state all attempts share.
struct Shared {
    /// The unsent upload, while no attempt holds it.
    rest: Option<Rest>,
    failure: Option<UploadFailure>,
    /// Why the check refused it.
    refusal: Option<String>,
}

/// A multipart upload of `len` bytes (its declared `Content-Length`), sent
/// as it arrives. Cloned for each attempt; the first to be read takes it.
pub(crate) struct Upload {
    len: u64,
    /// Read whole before routing, kept as it came (in the frames it was
    /// read in, never joined): every attempt sends it all.
    kept: Option<Arc<[Bytes]>>,
    shared: Arc<Mutex<Shared>>,
    /// Taken by this attempt.
    held: Option<Rest>,
    /// This attempt passed on bytes: the upload is no longer whole.
    started: bool,
}

impl std::fmt::Debug for Upload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Upload").field("len", &self.len).field("started", &self.started).finish()
    }
}

impl Clone for Upload {
    /// Another attempt at the same upload (it takes it when read, if still whole).
    fn clone(&self) -> Self {
        Upload { len: self.len, kept: self.kept.clone(), shared: self.shared.clone(), held: None, started: false }
    }
}

impl Upload {
    /// `read`: the bytes already read (routing needed them), `body` the
    /// rest, `len` the whole upload's declared length; the rest is due
    /// `within` (the body read timeout) of a replica's first read of it.
    /// `check` reads the rest as it passes (`read` it has read already).
    pub(crate) fn new(read: Vec<Bytes>, body: ClientBody, len: u64, within: Duration, check: Option<Box<dyn UploadCheck>>) -> Upload {
        let already: u64 = read.iter().map(|b| b.len() as u64).sum();
        let rest = Rest { read: read.into(), body: Some(body), left: len.saturating_sub(already), within, timeout: None, check };
        let shared = Shared { rest: Some(rest), failure: None, refusal: None };
        Upload { len, kept: None, shared: Arc::new(Mutex::new(shared)), held: None, started: false }
    }

    /// A body read whole, in the frames it arrived in (`parts`): sent as
    /// they are, without joining them into one buffer first (a copy of the
    /// whole, and for a large upload fresh pages for all of it), and sent
    /// whole again by a retry.
    pub(crate) fn in_memory(parts: Vec<Bytes>) -> Upload {
        let len = parts.iter().map(|b| b.len() as u64).sum();
        Upload {
            len,
            kept: Some(parts.into()),
            shared: Arc::new(Mutex::new(Shared { rest: None, failure: None, refusal: None })),
            held: None,
            started: false,
        }
    }

    /// Its declared length.
    pub(crate) fn len(&self) -> u64 {
        self.len
    }

    /// Why it did not reach a replica whole, if it did not.
    pub(crate) fn failure(&self) -> Option<UploadFailure> {
        self.lock().failure
    }

    /// Why its check refused it, if it did.
    pub(crate) fn refusal(&self) -> Option<String> {
        self.lock().refusal.clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Shared> {
        self.shared.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn fail(&mut self, why: UploadFailure) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        self.held = None;
        self.lock().failure.get_or_insert(why);
        Poll::Ready(Some(Err(why.message().into())))
    }

    fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        if self.held.is_none() {
            if self.started {
                return Poll::Ready(None);
            }
            if let Some(kept) = &self.kept {
                let read = kept.iter().cloned().collect();
                self.held = Some(Rest { read, body: None, left: 0, within: Duration::ZERO, timeout: None, check: None });
            }
        }
        if self.held.is_none() {
            let taken = self.lock().rest.take();
            match taken {
                Some(rest) => self.held = Some(rest),
                None => return self.fail(UploadFailure::Resend),
            }
        }
        let Some(rest) = self.held.as_mut() else { return Poll::Ready(None) };
        if let Some(b) = rest.read.pop_front() {
            self.started = true;
            return Poll::Ready(Some(Ok(Frame::data(b))));
        }
        let Some(body) = rest.body.as_mut() else { return Poll::Ready(None) };
        let within = rest.within;
        let timeout = rest.timeout.get_or_insert_with(|| Box::pin(tokio::time::sleep(within)));
        loop {
            match Pin::new(&mut *body).poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => {
                    let Ok(data) = frame.into_data() else { continue };
                    if data.len() as u64 > rest.left {
                        return self.fail(UploadFailure::Read);
                    }
                    rest.left -= data.len() as u64;
                    // Read before it goes on; the last bytes only once the whole is accepted.
                    if let Some(check) = rest.check.as_mut() {
                        let verdict = check.feed(&data).and_then(|()| if rest.left == 0 { check.end() } else { Ok(()) });
                        if let Err(why) = verdict {
                            self.lock().refusal.get_or_insert(why);
                            return self.fail(UploadFailure::Refused);
                        }
                    }
                    self.started = true;
                    return Poll::Ready(Some(Ok(Frame::data(data))));
                }
                Poll::Ready(Some(Err(_))) => return self.fail(UploadFailure::Read),
                Poll::Ready(None) if rest.left > 0 => return self.fail(UploadFailure::Read),
                Poll::Ready(None) => {
                    rest.body = None;
                    return Poll::Ready(None);
                }
                Poll::Pending => {
                    return match timeout.as_mut().poll(cx) {
                        Poll::Ready(()) => self.fail(UploadFailure::Timeout),
                        Poll::Pending => Poll::Pending,
                    };
                }
            }
        }
    }
}

impl Drop for Upload {
    /// An attempt that took the upload and passed none of it on leaves it
    /// whole for the next.
    fn drop(&mut self) {
        if let (Some(rest), false, None) = (self.held.take(), self.started, &self.kept) {
            self.lock().rest = Some(rest);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    /// An upload of which `read` was read while routing, whose client then
    /// sends `rest` (on a real connection: `Incoming` is a hyper server's
    /// body) under a declared length of `len` (then it ends, or with
    /// `stall` sends nothing more and stays), due within `within`.
    async fn upload(
        read: &[&'static str],
        rest: Vec<&'static str>,
        len: u64,
        stall: bool,
        within: std::time::Duration,
    ) -> (Upload, tokio::task::JoinHandle<()>) {
        use futures_util::StreamExt;
        let (tx, rx) = tokio::sync::oneshot::channel();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let server = tokio::spawn(async move {
            let (io, _) = listener.accept().await.expect("accept");
            let tx = std::sync::Mutex::new(Some(tx));
            let svc = hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| {
                let tx = tx.lock().expect("lock").take();
                async move {
                    if let Some(tx) = tx {
                        let _ = tx.send(req.into_body());
                    }
                    // Held open until the test ends.
                    std::future::pending::<()>().await;
                    Ok::<_, std::convert::Infallible>(http::Response::new(http_body_util::Empty::<Bytes>::new()))
                }
            });
            let _ = hyper::server::conn::http1::Builder::new().serve_connection(hyper_util::rt::TokioIo::new(io), svc).await;
        });
        let client = tokio::spawn(async move {
            let io = tokio::net::TcpStream::connect(addr).await.expect("connect");
            let (mut send, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(io)).await.expect("handshake");
            tokio::spawn(conn);
            let frames =
                futures_util::stream::iter(rest.into_iter().map(|s| Ok::<_, std::convert::Infallible>(Frame::data(Bytes::from(s)))));
            let body = if stall {
                http_body_util::StreamBody::new(frames.chain(futures_util::stream::pending()).boxed())
            } else {
                http_body_util::StreamBody::new(frames.boxed())
            };
            let req = http::Request::post("/").header("content-length", len.to_string()).body(body).expect("request");
            let _ = send.send_request(req).await;
        });
        let body = rx.await.expect("the body");
        let read: Vec<Bytes> = read.iter().map(|s| Bytes::from(*s)).collect();
        let whole = len + read_len(&read);
        drop(server);
        (Upload::new(read, ClientBody::Hyper(body), whole, within, None), client)
    }

    fn read_len(read: &[Bytes]) -> u64 {
        read.iter().map(|b| b.len() as u64).sum()
    }

    #[tokio::test]
    async fn an_upload_is_what_was_read_then_the_rest_as_it_comes_with_its_length() {
        let (u, _client) = upload(&["--b\r\nmodel", "=w\r\n"], vec!["file ", "bytes"], 10, false, std::time::Duration::from_secs(30)).await;
        let body = SendBody::from(u.clone());
        assert_eq!(body.size_hint().exact(), Some(24));
        let got = body.collect().await.expect("whole").to_bytes();
        assert_eq!(&got[..], b"--b\r\nmodel=w\r\nfile bytes");
        assert_eq!(u.failure(), None);
    }

    #[tokio::test]
    async fn an_attempt_that_passed_nothing_on_leaves_it_whole_and_one_that_did_does_not() {
        let (u, _client) = upload(&["head "], vec!["tail"], 4, false, std::time::Duration::from_secs(30)).await;
        // An attempt dropped before its body was read (the connection failed).
        drop(SendBody::from(u.clone()));
        let mut first = SendBody::from(u.clone());
        let frame = first.frame().await.expect("a frame").expect("data");
        assert_eq!(frame.into_data().ok().as_deref(), Some(&b"head "[..]));
        drop(first);
        // The next attempt cannot send it again: it says why.
        let again = SendBody::from(u.clone()).collect().await;
        assert!(again.is_err());
        assert_eq!(u.failure(), Some(UploadFailure::Resend));
    }

    #[tokio::test]
    async fn a_body_kept_in_its_frames_goes_whole_to_every_attempt() {
        let u = Upload::in_memory(vec![Bytes::from_static(b"--b\r\n"), Bytes::from_static(b"file"), Bytes::from_static(b"\r\n--b--")]);
        assert_eq!(SendBody::from(u.clone()).size_hint().exact(), Some(16));
        // An attempt that sent part of it, then failed.
        let mut first = SendBody::from(u.clone());
        let frame = first.frame().await.expect("a frame").expect("data");
        assert_eq!(frame.into_data().ok().as_deref(), Some(&b"--b\r\n"[..]), "the frames as they came, not joined");
        drop(first);
        for _ in 0..2 {
            let again = SendBody::from(u.clone()).collect().await.expect("sent again whole").to_bytes();
            assert_eq!(&again[..], b"--b\r\nfile\r\n--b--");
        }
        assert_eq!(u.failure(), None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_client_that_stops_sending_fails_the_upload_at_the_read_timeout() {
        // Declares 100 bytes, sends 4, then nothing.
        let (u, _client) = upload(&[], vec!["tail"], 100, true, std::time::Duration::from_secs(30)).await;
        let got = SendBody::from(u.clone()).collect().await;
        assert!(got.is_err());
        assert_eq!(u.failure(), Some(UploadFailure::Timeout));
    }
}
