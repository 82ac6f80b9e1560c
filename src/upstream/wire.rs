//! HTTP/1.1 as slogate speaks it to a replica: an answer's head parsed
//! (`httparse`) and its body's framing decoded (a request's head is
//! written as it is built: [`super::outgoing`]). No I/O here:
//! [`super::link`] reads and writes, this decides what the bytes mean.
//! The rules: docs/design/replica-connections.md.

use bytes::{Buf, Bytes, BytesMut};
use http::header::{CONNECTION, CONTENT_LENGTH, TRANSFER_ENCODING};
use http::{HeaderMap, HeaderName, HeaderValue, Method, Response, StatusCode, Version};

/// Headers an answer's head may carry (hyper's default too).
const MAX_HEADERS: usize = 100;
/// The longest answer head taken.
pub(super) const MAX_HEAD: usize = 64 * 1024;
/// The longest chunk-size line taken (its extensions included).
const MAX_CHUNK_LINE: usize = 4096;

/// Why a replica's answer could not be read as HTTP/1.1.
#[derive(Debug, thiserror::Error)]
pub(crate) enum WireError {
    #[error("the replica's answer is not valid HTTP/1.1: {0}")]
    Invalid(&'static str),
    #[error("the replica's answer head is over {MAX_HEAD} bytes")]
    HeadTooLarge,
    #[error("the replica closed the connection before answering")]
    Closed,
    #[error("the replica's connection ended before its answer was complete")]
    Incomplete,
    // The I/O error is in the message, not a source: messages that walk
    // the sources would say it twice.
    #[error("connection to the replica failed: {0}")]
    Io(std::io::Error),
    /// The request's body failed as it was being sent (the client's upload
    /// stopped or was refused: the upload records why).
    #[error("the request body failed: {0}")]
    Body(String),
}

impl WireError {
    /// The connection ended (closed, or reset) with the answer unfinished.
    pub(crate) fn closed(&self) -> bool {
        match self {
            WireError::Closed | WireError::Incomplete => true,
            WireError::Io(e) => matches!(
                e.kind(),
                std::io::ErrorKind::ConnectionReset
                    | std::io::ErrorKind::BrokenPipe
                    | std::io::ErrorKind::ConnectionAborted
                    | std::io::ErrorKind::UnexpectedEof
            ),
            _ => false,
        }
    }
}

/// How an answer's body is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Framing {
    /// This many bytes still to come.
    Length(u64),
    /// Chunked: where in a chunk the decoder is.
    Chunked(Chunk),
    /// Until the replica closes the connection.
    Close,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Chunk {
    /// At a chunk-size line.
    Size,
    /// Inside a chunk's data: this many bytes of it left.
    Data(u64),
    /// After a chunk's data: its CRLF.
    DataEnd,
    /// After the last chunk: trailer lines, to the empty one.
    Trailers,
}

/// An answer's head, read.
pub(super) struct Head {
    pub(super) response: Response<()>,
    /// How its body is delimited; `None`: it has none.
    pub(super) framing: Option<Framing>,
    /// The connection may carry another request once this answer is read.
    pub(super) keep_alive: bool,
}

/// Headers an answer's map has room for beyond the replica's own.
const ADDED_HEADERS: usize = 4;

/// Parse an answer's head from the front of `buf`, taking it out of it:
/// `Ok(None)` while it is incomplete. Informational answers (1xx) are
/// skipped. `method`: the request's, which decides whether a body follows.
pub(super) fn parse_head(buf: &mut BytesMut, method: &Method) -> Result<Option<Head>, WireError> {
    loop {
        // Left uninitialised: filling 100 slots first cost more than parsing a head.
        let mut slots = [const { std::mem::MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_HEADERS];
        let mut parsed = httparse::Response::new(&mut []);
        let len = match httparse::ParserConfig::default().parse_response_with_uninit_headers(&mut parsed, buf, &mut slots) {
            Ok(httparse::Status::Complete(len)) if len <= MAX_HEAD => len,
            Ok(httparse::Status::Complete(_)) => return Err(WireError::HeadTooLarge),
            Ok(httparse::Status::Partial) if buf.len() >= MAX_HEAD => return Err(WireError::HeadTooLarge),
            Ok(httparse::Status::Partial) => return Ok(None),
            Err(httparse::Error::TooManyHeaders) => return Err(WireError::Invalid("more than 100 headers")),
            Err(_) => return Err(WireError::Invalid("its head does not parse")),
        };
        let status = parsed.code.and_then(|c| StatusCode::from_u16(c).ok()).ok_or(WireError::Invalid("its status"))?;
        let version = if parsed.version == Some(1) { Version::HTTP_11 } else { Version::HTTP_10 };
        // Every value copied into one allocation, each a slice of it: not
        // an allocation per header, and nothing of the read buffer kept.
        let values = values_of(parsed.headers);
        // Room for the headers the gateway adds to the answer it relays
        // (class, replica, queue time, request id): sized to the replica's
        // alone, vLLM's four and those four outgrew the map, which then
        // hashed every header again into one twice its size.
        let mut headers = HeaderMap::with_capacity(parsed.headers.len() + ADDED_HEADERS);
        let mut at = 0;
        for h in parsed.headers.iter() {
            let name = HeaderName::from_bytes(h.name.as_bytes()).map_err(|_| WireError::Invalid("a header name"))?;
            let value =
                HeaderValue::from_maybe_shared(values.slice(at..at + h.value.len())).map_err(|_| WireError::Invalid("a header value"))?;
            at += h.value.len();
            headers.append(name, value);
        }
        buf.advance(len);
        if status.is_informational() {
            continue;
        }
        let framing = framing(status, method, &headers)?;
        let keep_alive = keep_alive(version, &headers) && framing != Some(Framing::Close);
        let mut response = Response::new(());
        *response.status_mut() = status;
        *response.version_mut() = version;
        *response.headers_mut() = headers;
        return Ok(Some(Head { response, framing, keep_alive }));
    }
}

/// A head's values up to this many bytes are kept in one allocation with
/// their count (a replica's usual four or five come to about 100 bytes).
const INLINE_VALUES: usize = 256;

/// A head's values when they are few: one allocation that every value's
/// slice shares by a count. (Copied into a vector instead, the first slice
/// allocates again to share it.)
struct InlineValues {
    len: usize,
    buf: [u8; INLINE_VALUES],
}

impl AsRef<[u8]> for InlineValues {
    fn as_ref(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

/// Every value of `headers`, one after another, in one buffer.
fn values_of(headers: &[httparse::Header<'_>]) -> Bytes {
    let total: usize = headers.iter().map(|h| h.value.len()).sum();
    if total <= INLINE_VALUES {
        let mut inline = InlineValues { len: 0, buf: [0; INLINE_VALUES] };
        for h in headers {
            inline.buf[inline.len..inline.len + h.value.len()].copy_from_slice(h.value);
            inline.len += h.value.len();
        }
        return Bytes::from_owner(inline);
    }
    let mut values = BytesMut::with_capacity(total);
    for h in headers {
        values.extend_from_slice(h.value);
    }
    values.freeze()
}

/// RFC 9112 section 6.3, for an answer.
fn framing(status: StatusCode, method: &Method, headers: &HeaderMap) -> Result<Option<Framing>, WireError> {
    if *method == Method::HEAD || status == StatusCode::NO_CONTENT || status == StatusCode::NOT_MODIFIED {
        return Ok(None);
    }
    let mut codings = headers.get_all(TRANSFER_ENCODING).iter().peekable();
    if codings.peek().is_some() {
        let last = codings.flat_map(|v| v.as_bytes().split(|b| *b == b',')).last().map(trim);
        return Ok(Some(if last.is_some_and(|c| c.eq_ignore_ascii_case(b"chunked")) {
            Framing::Chunked(Chunk::Size)
        } else {
            Framing::Close
        }));
    }
    let mut length = None;
    for v in headers.get_all(CONTENT_LENGTH) {
        for part in v.as_bytes().split(|b| *b == b',') {
            let n = std::str::from_utf8(trim(part))
                .ok()
                .filter(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
                .and_then(|s| s.parse::<u64>().ok())
                .ok_or(WireError::Invalid("its Content-Length"))?;
            if length.is_some_and(|l| l != n) {
                return Err(WireError::Invalid("two different Content-Lengths"));
            }
            length = Some(n);
        }
    }
    Ok(Some(match length {
        Some(0) => return Ok(None),
        Some(n) => Framing::Length(n),
        None => Framing::Close,
    }))
}

fn keep_alive(version: Version, headers: &HeaderMap) -> bool {
    let has = |token: &[u8]| {
        headers.get_all(CONNECTION).iter().any(|v| v.as_bytes().split(|b| *b == b',').any(|t| trim(t).eq_ignore_ascii_case(token)))
    };
    if version == Version::HTTP_11 {
        !has(b"close")
    } else {
        has(b"keep-alive")
    }
}

fn trim(b: &[u8]) -> &[u8] {
    b.trim_ascii()
}

/// What [`decode`] found in the buffer.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Decoded {
    /// The body's next bytes are the buffer's first this many: the caller
    /// takes them out.
    Data(usize),
    /// The body is whole.
    End,
    /// More must be read first.
    More,
}

/// Find the body's next bytes at the front of `buf` (taking out the
/// framing around them), moving `framing` on. With [`Framing::Close`] the
/// caller decides the end (the connection's end of file).
pub(super) fn decode(buf: &mut BytesMut, framing: &mut Framing) -> Result<Decoded, WireError> {
    loop {
        match framing {
            Framing::Length(0) => return Ok(Decoded::End),
            Framing::Length(left) => {
                if buf.is_empty() {
                    return Ok(Decoded::More);
                }
                let n = (*left).min(buf.len() as u64) as usize;
                *left -= n as u64;
                return Ok(Decoded::Data(n));
            }
            Framing::Close => {
                if buf.is_empty() {
                    return Ok(Decoded::More);
                }
                return Ok(Decoded::Data(buf.len()));
            }
            Framing::Chunked(chunk) => match chunk {
                Chunk::Size => {
                    let Some((len, end)) = find_line(buf, MAX_CHUNK_LINE)? else { return Ok(Decoded::More) };
                    let size = buf[..len].split(|b| *b == b';').next().map(trim).unwrap_or_default();
                    let size = std::str::from_utf8(size)
                        .ok()
                        .filter(|s| !s.is_empty() && s.len() <= 16)
                        .and_then(|s| u64::from_str_radix(s, 16).ok())
                        .ok_or(WireError::Invalid("a chunk size"))?;
                    buf.advance(end);
                    *chunk = if size == 0 { Chunk::Trailers } else { Chunk::Data(size) };
                }
                Chunk::Data(left) => {
                    if buf.is_empty() {
                        return Ok(Decoded::More);
                    }
                    let n = (*left).min(buf.len() as u64) as usize;
                    *left -= n as u64;
                    if *left == 0 {
                        *chunk = Chunk::DataEnd;
                    }
                    return Ok(Decoded::Data(n));
                }
                Chunk::DataEnd => {
                    let Some((len, end)) = find_line(buf, 2)? else { return Ok(Decoded::More) };
                    if len != 0 {
                        return Err(WireError::Invalid("a chunk's end"));
                    }
                    buf.advance(end);
                    *chunk = Chunk::Size;
                }
                Chunk::Trailers => {
                    let Some((len, end)) = find_line(buf, MAX_HEAD)? else { return Ok(Decoded::More) };
                    buf.advance(end);
                    if len == 0 {
                        *framing = Framing::Length(0);
                    }
                }
            },
        }
    }
}

/// The line (ended by CRLF, or LF alone) at the front of `buf`: its length
/// without its end, and with it. `None` while it is incomplete; an error
/// past `max`.
fn find_line(buf: &[u8], max: usize) -> Result<Option<(usize, usize)>, WireError> {
    let Some(at) = buf.iter().take(max + 2).position(|b| *b == b'\n') else {
        return if buf.len() > max + 1 { Err(WireError::Invalid("a line too long")) } else { Ok(None) };
    };
    let len = if at > 0 && buf[at - 1] == b'\r' { at - 1 } else { at };
    Ok(Some((len, at + 1)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(bytes: &str, method: &Method) -> Result<Option<Head>, WireError> {
        parse_head(&mut BytesMut::from(bytes), method)
    }

    /// Decode all of `wire` fed in pieces of `step` bytes: the body, and
    /// whether its end was found.
    fn body(wire: &str, mut framing: Framing, step: usize) -> Result<(Vec<u8>, bool), WireError> {
        let (mut buf, mut out) = (BytesMut::new(), Vec::new());
        for piece in wire.as_bytes().chunks(step) {
            buf.extend_from_slice(piece);
            loop {
                match decode(&mut buf, &mut framing)? {
                    Decoded::Data(n) => out.extend_from_slice(&buf.split_to(n)),
                    Decoded::End => return Ok((out, true)),
                    Decoded::More => break,
                }
            }
        }
        Ok((out, false))
    }

    #[test]
    fn an_answer_head_parses_in_pieces_and_says_how_its_body_ends() {
        let wire = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n";
        let mut buf = BytesMut::new();
        let mut got = None;
        for b in wire.as_bytes() {
            buf.extend_from_slice(&[*b]);
            if let Some(h) = parse_head(&mut buf, &Method::POST).expect("valid") {
                got = Some(h);
                break;
            }
        }
        let h = got.expect("parsed");
        assert_eq!(h.response.status(), StatusCode::OK);
        assert_eq!(h.response.headers()["content-type"], "text/event-stream");
        assert_eq!(h.framing, Some(Framing::Chunked(Chunk::Size)));
        assert!(h.keep_alive);
        assert!(buf.is_empty(), "the head is taken out, nothing after it read yet");
        let (a, b) = (&h.response.headers()["content-type"], &h.response.headers()["transfer-encoding"]);
        assert_eq!(a.as_bytes()[a.len()..].as_ptr(), b.as_bytes().as_ptr(), "the values share one allocation, one after the other");
    }

    #[test]
    fn a_heads_values_read_the_same_whether_few_or_many_bytes() {
        for long in [10, INLINE_VALUES, INLINE_VALUES + 1, 4000] {
            let v = "v".repeat(long);
            let wire = format!("HTTP/1.1 200 OK\r\nx-a: {v}\r\nx-b: b\r\ncontent-length: 0\r\n\r\n");
            let h = head(&wire, &Method::GET).expect("valid").expect("whole");
            let got = |name: &str| h.response.headers().get(name).map(|v| v.as_bytes().to_vec());
            assert_eq!(got("x-a"), Some(v.clone().into_bytes()), "{long}");
            assert_eq!(got("x-b").as_deref(), Some(&b"b"[..]), "{long}");
            assert_eq!(got("content-length").as_deref(), Some(&b"0"[..]), "{long}");
        }
    }

    #[test]
    fn framing_follows_the_rules_for_an_answer() {
        let f = |wire: &str, m: &Method| head(wire, m).expect("valid").expect("whole");
        let h = f("HTTP/1.1 200 OK\r\ncontent-length: 12\r\n\r\n", &Method::POST);
        assert_eq!((h.framing, h.keep_alive), (Some(Framing::Length(12)), true));
        assert_eq!(f("HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n", &Method::POST).framing, None);
        assert_eq!(f("HTTP/1.1 200 OK\r\ncontent-length: 12\r\n\r\n", &Method::HEAD).framing, None);
        assert_eq!(f("HTTP/1.1 204 No Content\r\n\r\n", &Method::POST).framing, None);
        let close = f("HTTP/1.1 200 OK\r\n\r\n", &Method::GET);
        assert_eq!((close.framing, close.keep_alive), (Some(Framing::Close), false), "no length: ends at close");
        let te = f("HTTP/1.1 200 OK\r\ncontent-length: 5\r\ntransfer-encoding: gzip, chunked\r\n\r\n", &Method::GET);
        assert_eq!(te.framing, Some(Framing::Chunked(Chunk::Size)), "transfer-encoding wins over a length");
        assert!(!f("HTTP/1.1 200 OK\r\nconnection: Close\r\ncontent-length: 1\r\n\r\n", &Method::GET).keep_alive);
        assert!(!f("HTTP/1.0 200 OK\r\ncontent-length: 1\r\n\r\n", &Method::GET).keep_alive);
        assert!(f("HTTP/1.0 200 OK\r\nconnection: keep-alive\r\ncontent-length: 1\r\n\r\n", &Method::GET).keep_alive);
        let early = f("HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\ncontent-length: 2\r\n\r\n", &Method::POST);
        assert_eq!(early.response.status(), StatusCode::CREATED, "an informational answer is skipped");
    }

    #[test]
    fn a_head_that_is_not_http_or_lies_about_its_length_is_refused() {
        for wire in [
            "HTTP/1.1 200 OK\r\ncontent-length: 1\r\ncontent-length: 2\r\n\r\n",
            "HTTP/1.1 200 OK\r\ncontent-length: -1\r\n\r\n",
            "HTTP/1.1 200 OK\r\ncontent-length: +1\r\n\r\n",
            "SSH-2.0-OpenSSH\r\n\r\n",
        ] {
            assert!(matches!(head(wire, &Method::GET), Err(WireError::Invalid(_))), "{wire:?}");
        }
        let same_twice = head("HTTP/1.1 200 OK\r\ncontent-length: 3, 3\r\n\r\n", &Method::GET).expect("valid").expect("whole");
        assert_eq!(same_twice.framing, Some(Framing::Length(3)));
        let huge = format!("HTTP/1.1 200 OK\r\nx: {}", "a".repeat(MAX_HEAD));
        assert!(matches!(head(&huge, &Method::GET), Err(WireError::HeadTooLarge)), "incomplete and too large");
        let whole = format!("{huge}\r\n\r\n");
        assert!(matches!(head(&whole, &Method::GET), Err(WireError::HeadTooLarge)), "read whole in one go, still too large");
    }

    #[test]
    fn a_chunked_body_decodes_whatever_the_reads_cut_it_into() {
        let wire = "5;ext=1\r\nhello\r\n1\r\n \r\nA\r\n0123456789\r\n0\r\ntrailer: x\r\n\r\n";
        for step in [1, 2, 3, 7, wire.len()] {
            let (out, ended) = body(wire, Framing::Chunked(Chunk::Size), step).expect("valid");
            assert_eq!((out.as_slice(), ended), (&b"hello 0123456789"[..], true), "in pieces of {step}");
        }
        let lf_only = body("3\nabc\n0\n\n", Framing::Chunked(Chunk::Size), 1).expect("valid");
        assert_eq!(lf_only, (b"abc".to_vec(), true));
    }

    #[test]
    fn a_broken_chunked_body_is_an_error_not_a_short_answer() {
        for wire in ["zz\r\n", "3\r\nabcX\r\n", "12345678901234567\r\n"] {
            assert!(matches!(body(wire, Framing::Chunked(Chunk::Size), 1), Err(WireError::Invalid(_))), "{wire:?}");
        }
        assert!(body(&"1".repeat(MAX_CHUNK_LINE + 8), Framing::Chunked(Chunk::Size), 64).is_err(), "a size line without end");
    }

    #[test]
    fn a_body_of_known_length_ends_at_it_and_leaves_what_follows() {
        let mut buf = BytesMut::from("abcdefNEXT");
        let mut framing = Framing::Length(6);
        assert_eq!(decode(&mut buf, &mut framing).expect("valid"), Decoded::Data(6));
        buf.advance(6);
        assert_eq!(decode(&mut buf, &mut framing).expect("valid"), Decoded::End);
        assert_eq!(&buf[..], b"NEXT");
    }

    #[test]
    fn a_vllm_answers_map_takes_the_gateways_headers_without_growing() {
        let vllm = "HTTP/1.1 200 OK\r\ndate: Sat, 05 Dec 2026 14:00:00 GMT\r\nserver: uvicorn\r\ncontent-length: 2\r\ncontent-type: application/json\r\n\r\n{}";
        let mut headers = head(vllm, &Method::POST).expect("valid").expect("whole").response.into_parts().0.headers;
        let room = headers.capacity();
        for name in ["x-slogate-class", "x-slogate-replica", "x-slogate-queue-ms", "x-request-id"] {
            headers.insert(name, HeaderValue::from_static("v"));
        }
        assert_eq!((headers.len(), headers.capacity()), (8, room));
    }
}
