//! Multipart form bodies (`multipart/form-data`: audio transcription and
//! translation uploads). The form is read only as far as its `model` and
//! `stream` fields, by multer's parser fed frame by frame as the body
//! arrives; what was read and the rest go upstream as the caller sent them
//! (the rest as it arrives, when the caller declared its length).
//! The rules are docs/access.md's (endpoints) and
//! docs/design/measurement.md's.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

use bytes::Bytes;
use http_body::Body;
use http_body_util::BodyExt;

use super::body::{Head, Model};
use crate::error::{BoxError, GatewayError};

/// The longest `model` or `stream` value read from a form.
const FIELD_LIMIT: u64 = 1024;

/// Is `content_type` a multipart form? Its boundary, if so.
pub(super) fn boundary(content_type: Option<&str>) -> Option<Result<String, GatewayError>> {
    let ct = content_type?;
    const FORM: &str = "multipart/form-data";
    if !ct.trim_start().get(..FORM.len()).is_some_and(|p| p.eq_ignore_ascii_case(FORM)) {
        return None;
    }
    Some(multer::parse_boundary(ct).map_err(|e| malformed(&e.to_string())))
}

fn malformed(why: &str) -> GatewayError {
    GatewayError::InvalidRequest { message: format!("the multipart form cannot be read: {why}"), param: None }
}

/// How far into a form its `model` is looked for as the body arrives: a
/// client that writes its fields first (as the OpenAI SDKs do) has them in
/// the first few hundred bytes. A form whose `model` comes later (after
/// the file) is read whole and parsed aside, at a lower priority than the
/// streams ([`super::aside`]), rather than scanned frame by frame on the
/// threads that carry them.
pub(super) const PARSE_AHEAD: u64 = 64 * 1024;

/// A form read as far as routing needs.
pub(super) struct FormRead<B> {
    /// `None`: no `model` within the first `ahead` bytes.
    pub(super) head: Option<Head>,
    /// The bytes read, as received.
    pub(super) read: Vec<Bytes>,
    /// The rest of the body, when routing needed less than all of it.
    pub(super) rest: Option<B>,
}

/// Read the form in `body` (its `boundary`) as far as its `model` field
/// and, before its file, its `stream` field (`true` streams): up to the
/// first file part after `model`, else to its end; no further than `ahead`
/// bytes (past them with no `model`, the head is `None`). 400 when it is
/// malformed, 413 past `limit` bytes.
pub(super) async fn read_head<B>(body: B, boundary: &str, limit: u64, ahead: u64) -> Result<FormRead<B>, GatewayError>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    let feed = Arc::new(Mutex::new(Feed::default()));
    let parsed = feed.clone();
    // The parser's input: what the reader has fed it. Empty, it waits: the
    // reader then reads the next frame and polls the parser again.
    let input = futures_util::stream::poll_fn(move |_| {
        let mut f = parsed.lock().unwrap_or_else(|p| p.into_inner());
        match f.chunks.pop_front() {
            Some(b) => Poll::Ready(Some(Ok::<Bytes, std::convert::Infallible>(b))),
            None if f.ended => Poll::Ready(None),
            None => Poll::Pending,
        }
    });
    let constraints =
        multer::Constraints::new().size_limit(multer::SizeLimit::new().for_field("model", FIELD_LIMIT).for_field("stream", FIELD_LIMIT));
    let mut form = multer::Multipart::with_constraints(input, boundary, constraints);
    let mut reader = Reader { body, read: Vec::new(), total: 0, limit, ahead, feed, ended: false };
    let (mut model, mut stream, mut stopped) = (Model::Missing, false, false);
    loop {
        let field = match reader.drive(form.next_field(), true).await? {
            Some(Ok(Some(field))) => field,
            Some(Ok(None)) => break,
            Some(Err(e)) => return Err(malformed(&e.to_string())),
            // Past `ahead`: with `model` known, routing needs no more.
            None => {
                stopped = true;
                break;
            }
        };
        let text = |t: Option<Result<String, multer::Error>>| match t {
            Some(Ok(t)) => Ok(t),
            Some(Err(e)) => Err(malformed(&e.to_string())),
            None => Err(malformed("it ended early")),
        };
        match field.name() {
            Some("model") => model = Model::Name(text(reader.drive(field.text(), false).await?)?),
            Some("stream") => stream = text(reader.drive(field.text(), false).await?)?.trim().eq_ignore_ascii_case("true"),
            // The file, with `model` known: routing needs no more.
            _ if field.file_name().is_some() && matches!(model, Model::Name(_)) => break,
            // Anything else: skipped by the next call.
            _ => {}
        }
    }
    let Reader { body, read, ended, .. } = reader;
    let head = match model {
        Model::Missing if stopped => None,
        model => Some(Head::form(model, stream)),
    };
    Ok(FormRead { head, read, rest: (!ended).then_some(body) })
}

/// The routed-on fields of a whole form in memory (`parts`, the frames it
/// came in; its `boundary`): `model`, and `stream`. 400 when it is
/// malformed. The parser takes the frames one at a time, so the copy it
/// keeps is a frame's, never the whole form's.
pub(super) fn head_of(parts: &[Bytes], boundary: &str) -> Result<Head, GatewayError> {
    let frames = parts.iter().map(|b| Ok::<_, std::convert::Infallible>(http_body::Frame::data(b.clone())));
    let body = http_body_util::StreamBody::new(futures_util::stream::iter(frames));
    // In memory, the reader never waits: driven to its end without a runtime.
    let read = pin!(read_head(body, boundary, u64::MAX, u64::MAX)).poll(&mut Context::from_waker(Waker::noop()));
    match read {
        Poll::Ready(r) => Ok(r?.head.unwrap_or_else(|| Head::form(Model::Missing, false))),
        Poll::Pending => Err(malformed("it ended early")),
    }
}

/// What the reader has read and the parser not yet taken.
#[derive(Default)]
struct Feed {
    chunks: VecDeque<Bytes>,
    ended: bool,
}

struct Reader<B> {
    body: B,
    read: Vec<Bytes>,
    total: u64,
    limit: u64,
    ahead: u64,
    feed: Arc<Mutex<Feed>>,
    ended: bool,
}

impl<B> Reader<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    /// Poll the parser's `f` until it is done, reading a frame of the body
    /// each time it waits for more; `None` when it would read past `ahead`
    /// (only where `may_stop`).
    async fn drive<F: Future>(&mut self, f: F, may_stop: bool) -> Result<Option<F::Output>, GatewayError> {
        let mut f = pin!(f);
        loop {
            if let Poll::Ready(v) = f.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
                return Ok(Some(v));
            }
            if self.ended {
                return Err(malformed("it ended early"));
            }
            if may_stop && self.total >= self.ahead {
                return Ok(None);
            }
            self.feed().await?;
        }
    }

    async fn feed(&mut self) -> Result<(), GatewayError> {
        let data = match self.body.frame().await {
            Some(Ok(frame)) => match frame.into_data() {
                Ok(d) => d,
                Err(_) => return Ok(()),
            },
            Some(Err(e)) => return Err(GatewayError::BodyRead(e.into())),
            None => {
                self.ended = true;
                self.feed.lock().unwrap_or_else(|p| p.into_inner()).ended = true;
                return Ok(());
            }
        };
        self.total += data.len() as u64;
        if self.total > self.limit {
            return Err(GatewayError::PayloadTooLarge { limit: self.limit });
        }
        self.read.push(data.clone());
        self.feed.lock().unwrap_or_else(|p| p.into_inner()).chunks.push_back(data);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::StreamBody;

    type Chunks = StreamBody<futures_util::stream::Iter<std::vec::IntoIter<Result<http_body::Frame<Bytes>, std::convert::Infallible>>>>;

    fn form(parts: &[(&str, &str)]) -> Bytes {
        let mut b = String::new();
        for (name, value) in parts {
            if *name == "file" {
                b.push_str(&format!("--XyZ\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.wav\"\r\nContent-Type: audio/wav\r\n\r\n{value}\r\n"));
            } else {
                b.push_str(&format!("--XyZ\r\nContent-Disposition: form-data; name=\"{name}\"\r\n\r\n{value}\r\n"));
            }
        }
        b.push_str("--XyZ--\r\n");
        Bytes::from(b)
    }

    /// `bytes` as a body arriving in frames of `frame` bytes.
    fn arriving(bytes: &Bytes, frame: usize) -> Chunks {
        let frames: Vec<_> = bytes.chunks(frame).map(|c| Ok(http_body::Frame::data(Bytes::copy_from_slice(c)))).collect();
        StreamBody::new(futures_util::stream::iter(frames))
    }

    async fn head(bytes: Bytes, frame: usize) -> Result<(Head, usize, bool), GatewayError> {
        let r = read_head(arriving(&bytes, frame), "XyZ", 1 << 20, PARSE_AHEAD).await?;
        let read: usize = r.read.iter().map(Bytes::len).sum();
        Ok((r.head.expect("a head within the parse-ahead"), read, r.rest.is_some()))
    }

    #[tokio::test]
    async fn the_model_and_stream_fields_are_read_wherever_they_are_in_any_frames() {
        for frame in [1, 7, 64, 4096] {
            let whole = form(&[("file", "RIFF....WAVEfmt "), ("model", "whisper-1"), ("stream", "true")]);
            let (h, read, _) = head(whole.clone(), frame).await.expect("a form");
            assert_eq!((h.model.clone(), h.stream), (Model::Name("whisper-1".into()), true), "frames of {frame}");
            // (to the closing boundary: the CR LF after it may be left)
            assert!(read + 2 >= whole.len(), "the model after the file: read to the end ({read} of {})", whole.len());
            let (h, _, _) = head(form(&[("model", "whisper-1"), ("language", "en"), ("file", "x")]), frame).await.expect("a form");
            assert_eq!((h.model.clone(), h.stream), (Model::Name("whisper-1".into()), false));
            let (h, _, _) = head(form(&[("file", "x")]), frame).await.expect("a form");
            assert_eq!(h.model, Model::Missing);
        }
    }

    #[tokio::test]
    async fn with_the_model_before_the_file_the_file_is_not_read() {
        let file = "x".repeat(100_000);
        let whole = form(&[("model", "whisper-1"), ("stream", "true"), ("file", &file)]);
        let (h, read, rest) = head(whole.clone(), 1024).await.expect("a form");
        assert_eq!((h.model, h.stream), (Model::Name("whisper-1".into()), true));
        assert!(rest, "the rest is left to arrive");
        assert!(read <= 2048, "read {read} of {} bytes", whole.len());
    }

    #[tokio::test]
    async fn a_model_after_a_long_file_is_left_to_the_whole_form_parse() {
        let file = "x".repeat(200_000);
        let whole = form(&[("file", &file), ("model", "whisper-1"), ("stream", "true")]);
        let r = read_head(arriving(&whole, 4096), "XyZ", 1 << 20, PARSE_AHEAD).await.expect("read");
        assert!(r.head.is_none(), "no model in the first {PARSE_AHEAD} bytes");
        let read: u64 = r.read.iter().map(|b| b.len() as u64).sum();
        assert!((PARSE_AHEAD..PARSE_AHEAD + 4096).contains(&read), "stopped after {read} bytes");
        assert!(r.rest.is_some());
        // The whole form, in the frames it came in (some cut inside a
        // delimiter or a field's name): parsed a frame at a time.
        let frames = |b: &Bytes, n: usize| -> Vec<Bytes> { b.chunks(n).map(Bytes::copy_from_slice).collect() };
        for n in [7, 4093, whole.len()] {
            let h = head_of(&frames(&whole, n), "XyZ").expect("the whole form");
            assert_eq!((h.model, h.stream), (Model::Name("whisper-1".into()), true), "frames of {n}");
        }
        assert_eq!(head_of(&frames(&form(&[("file", "x")]), 5), "XyZ").expect("a form").model, Model::Missing);
        let cut = Bytes::from_static(b"--XyZ\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nwh");
        assert!(head_of(&[cut], "XyZ").is_err());
        assert!(head_of(&[], "XyZ").is_err(), "no form at all");
    }

    #[tokio::test]
    async fn a_malformed_form_is_a_400_and_a_long_one_a_413() {
        let cut = Bytes::from_static(b"--XyZ\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nwhis");
        let e = head(cut, 8).await.expect_err("cut");
        assert_eq!(e.status(), http::StatusCode::BAD_REQUEST);
        let long = "m".repeat(2000);
        assert!(head(form(&[("model", &long)]), 100).await.is_err(), "a model name past the field limit");
        let big = form(&[("file", &"x".repeat(5000)), ("model", "w")]);
        let e = read_head(arriving(&big, 100), "XyZ", 4096, PARSE_AHEAD).await.err().expect("over the limit");
        assert_eq!(e.status(), http::StatusCode::PAYLOAD_TOO_LARGE);
        assert_eq!(boundary(Some("application/json")).map(|b| b.is_ok()), None);
        assert!(boundary(Some("multipart/form-data")).is_some_and(|b| b.is_err()), "no boundary");
        assert_eq!(boundary(Some("multipart/form-data; boundary=XyZ")).and_then(Result::ok).as_deref(), Some("XyZ"));
    }
}
