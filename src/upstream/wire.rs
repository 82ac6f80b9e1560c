//! HTTP/1.1 as slogate speaks it to a replica: an answer's head parsed
//! (`httparse`) and its body's framing decoded (a request's head is
//! written as it is built: [`super::outgoing`]). No I/O here:
//! [`super::link`] reads and writes, this decides what the bytes mean.
//! The rules: docs/design/replica-connections.md.

use bytes::{Buf, Bytes, BytesMut};
use http::header::{self, CONNECTION, CONTENT_LENGTH, TRANSFER_ENCODING};
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

/// The headers of one hop (RFC 9110 section 7.6.1): never forwarded,
/// either way. `Connection` first.
pub(crate) const HOP_BY_HOP: [HeaderName; 9] = [
    CONNECTION,
    HeaderName::from_static("keep-alive"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    TRANSFER_ENCODING,
    header::UPGRADE,
    HeaderName::from_static("proxy-connection"),
];

/// What an answer's head says of its own hop, read from its lines as
/// they were parsed: its framing and whether the connection stays, and
/// which of its headers are this hop's (never put in the map).
#[derive(Default)]
struct HopLines {
    /// The headers left out, by their place in the head (at most
    /// [`MAX_HEADERS`]).
    left_out: u128,
    /// `Connection` says `close`; says `keep-alive`; names a header.
    close: bool,
    keep_alive: bool,
    names_headers: bool,
    /// `Transfer-Encoding` was sent; its last coding is `chunked`.
    codings: bool,
    chunked: bool,
    /// Every `Content-Length` value, the same (an error if not).
    length: Option<u64>,
}

impl HopLines {
    /// Read a head's lines; an error for a `Content-Length` that is not one
    /// length.
    fn read(headers: &[httparse::Header<'_>]) -> Result<HopLines, WireError> {
        let mut hop = HopLines::default();
        for (i, h) in headers.iter().enumerate() {
            let name = h.name.as_bytes();
            if name.eq_ignore_ascii_case(CONTENT_LENGTH.as_str().as_bytes()) {
                hop.content_length(h.value)?;
                continue;
            }
            let Some(at) = HOP_BY_HOP.iter().position(|n| n.as_str().as_bytes().eq_ignore_ascii_case(name)) else { continue };
            hop.left_out |= 1 << i;
            if at == 0 {
                for token in list_items(h.value) {
                    if token.eq_ignore_ascii_case(b"close") {
                        hop.close = true;
                    } else if token.eq_ignore_ascii_case(b"keep-alive") {
                        hop.keep_alive = true;
                    } else {
                        hop.names_headers = true;
                    }
                }
            } else if HOP_BY_HOP[at] == TRANSFER_ENCODING {
                hop.codings = true;
                hop.chunked = h.value.split(|b| *b == b',').next_back().map(trim).is_some_and(|c| c.eq_ignore_ascii_case(b"chunked"));
            }
        }
        if hop.names_headers {
            hop.leave_out_named(headers);
        }
        if hop.codings {
            // A length beside a transfer coding is not the body's: the
            // coding decides, and the length is not passed on (RFC 9112
            // section 6.3).
            hop.leave_out(headers, CONTENT_LENGTH.as_str().as_bytes());
        }
        Ok(hop)
    }

    /// A `Content-Length` value: one or more lengths, all the same.
    fn content_length(&mut self, value: &[u8]) -> Result<(), WireError> {
        for part in value.split(|b| *b == b',') {
            let n = std::str::from_utf8(trim(part))
                .ok()
                .filter(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
                .and_then(|s| s.parse::<u64>().ok())
                .ok_or(WireError::Invalid("its Content-Length"))?;
            if self.length.is_some_and(|l| l != n) {
                return Err(WireError::Invalid("two different Content-Lengths"));
            }
            self.length = Some(n);
        }
        Ok(())
    }

    /// Leave out the headers a `Connection` header names.
    fn leave_out_named(&mut self, headers: &[httparse::Header<'_>]) {
        let named = headers.iter().filter(|h| h.name.eq_ignore_ascii_case(CONNECTION.as_str())).flat_map(|h| list_items(h.value));
        for token in named {
            self.leave_out(headers, token);
        }
    }

    /// Leave out every header named `name` (in any case).
    fn leave_out(&mut self, headers: &[httparse::Header<'_>], name: &[u8]) {
        for (i, h) in headers.iter().enumerate() {
            if h.name.as_bytes().eq_ignore_ascii_case(name) {
                self.left_out |= 1 << i;
            }
        }
    }

    /// A header of the head, by its place, goes in the map.
    fn kept(&self, i: usize) -> bool {
        self.left_out & (1 << i) == 0
    }
}

/// Parse an answer's head from the front of `buf`, taking it out of it:
/// `Ok(None)` while it is incomplete. Informational answers (1xx) are
/// skipped. `method`: the request's, which decides whether a body follows.
/// The head's own hop's headers (`Connection`, those it names,
/// `Transfer-Encoding` and the rest of [`HOP_BY_HOP`]) are read for its
/// framing and left out of the map: the client's hop has its own.
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
        if status.is_informational() {
            buf.advance(len);
            continue;
        }
        let version = if parsed.version == Some(1) { Version::HTTP_11 } else { Version::HTTP_10 };
        let hop = HopLines::read(parsed.headers)?;
        let kept = || parsed.headers.iter().enumerate().filter(|(i, _)| hop.kept(*i)).map(|(_, h)| h);
        // Every value copied into one allocation, each a slice of it: not
        // an allocation per header, and nothing of the read buffer kept.
        let values = values_of(kept());
        // Room for the headers the gateway adds to the answer it relays
        // (class, replica, queue time, request id): sized to the replica's
        // alone, vLLM's four and those four outgrew the map, which then
        // hashed every header again into one twice its size.
        let mut headers = HeaderMap::with_capacity(kept().count() + ADDED_HEADERS);
        let mut at = 0;
        for h in kept() {
            let name = HeaderName::from_bytes(h.name.as_bytes()).map_err(|_| WireError::Invalid("a header name"))?;
            let value =
                HeaderValue::from_maybe_shared(values.slice(at..at + h.value.len())).map_err(|_| WireError::Invalid("a header value"))?;
            at += h.value.len();
            headers.append(name, value);
        }
        buf.advance(len);
        let framing = framing(status, method, &hop);
        let keep_alive = (if version == Version::HTTP_11 { !hop.close } else { hop.keep_alive }) && framing != Some(Framing::Close);
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
fn values_of<'a, 'b: 'a>(headers: impl Iterator<Item = &'a httparse::Header<'b>> + Clone) -> Bytes {
    let total: usize = headers.clone().map(|h| h.value.len()).sum();
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

/// The elements of a comma-separated header value (RFC 9110 section
/// 5.6.1), trimmed, the empty ones left out: a `Connection` header's
/// options and the headers it names.
pub(crate) fn list_items(value: &[u8]) -> impl Iterator<Item = &[u8]> {
    value.split(|b| *b == b',').map(trim).filter(|t| !t.is_empty())
}

/// RFC 9112 section 6.3, for an answer.
fn framing(status: StatusCode, method: &Method, hop: &HopLines) -> Option<Framing> {
    if *method == Method::HEAD || status == StatusCode::NO_CONTENT || status == StatusCode::NOT_MODIFIED {
        return None;
    }
    if hop.codings {
        return Some(if hop.chunked { Framing::Chunked(Chunk::Size) } else { Framing::Close });
    }
    match hop.length {
        Some(0) => None,
        Some(n) => Some(Framing::Length(n)),
        None => Some(Framing::Close),
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
        let wire = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\ntransfer-encoding: chunked\r\nx-b: 1\r\n\r\n5\r\nhello\r\n";
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
        assert!(!h.response.headers().contains_key("transfer-encoding"), "this hop's framing is not the client's");
        let (a, b) = (&h.response.headers()["content-type"], &h.response.headers()["x-b"]);
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
        assert!(!te.response.headers().contains_key("content-length"), "and the length is not passed on");
        let other = f("HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ntransfer-encoding: gzip\r\n\r\n", &Method::GET);
        assert_eq!(other.framing, Some(Framing::Close), "the last coding not chunked: the body ends at close");
        assert!(!f("HTTP/1.1 200 OK\r\nconnection: Close\r\ncontent-length: 1\r\n\r\n", &Method::GET).keep_alive);
        assert!(!f("HTTP/1.0 200 OK\r\ncontent-length: 1\r\n\r\n", &Method::GET).keep_alive);
        assert!(f("HTTP/1.0 200 OK\r\nconnection: keep-alive\r\ncontent-length: 1\r\n\r\n", &Method::GET).keep_alive);
        let early = f("HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\ncontent-length: 2\r\n\r\n", &Method::POST);
        assert_eq!(early.response.status(), StatusCode::CREATED, "an informational answer is skipped");
    }

    #[test]
    fn hop_by_hop_headers_and_those_connection_names_are_left_out_and_nothing_else() {
        let kept = |lines: &str| {
            let h = head(
                &format!("HTTP/1.1 200 OK\r\n{lines}content-type: application/json\r\nx-keep: 1\r\ncontent-length: 2\r\n\r\n"),
                &Method::GET,
            )
            .expect("valid")
            .expect("whole");
            let mut left: Vec<String> = h.response.headers().iter().map(|(k, v)| format!("{k}: {}", v.to_str().unwrap_or("?"))).collect();
            left.sort();
            (left, h.keep_alive)
        };
        let all = |ka: bool| (vec!["content-length: 2".to_string(), "content-type: application/json".into(), "x-keep: 1".into()], ka);
        assert_eq!(kept(""), all(true), "nothing to leave out");
        assert_eq!(kept("Connection: Keep-Alive\r\n"), all(true));
        assert_eq!(kept("connection: close\r\n"), all(false));
        // A header named in a later Connection value, beside one that names
        // none, and one named before the Connection that names it.
        let named = "x-early: b\r\nconnection: keep-alive\r\nConnection: close, X-Private, X-Early\r\nx-private: a\r\n\
                     keep-alive: timeout=5\r\nproxy-connection: keep-alive\r\ntrailer: x\r\nupgrade: h2c\r\n";
        assert_eq!(kept(named), all(false));
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
