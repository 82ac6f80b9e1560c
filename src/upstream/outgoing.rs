//! A request to a replica as it goes on the wire: its method, its head
//! written line by line as the request is built (no header map of its own:
//! the client's headers are copied from the client's map straight into the
//! head), and its body. The body's length and the head's end are written
//! when the request starts on a connection ([`super::link`]). The rules:
//! docs/design/replica-connections.md, rule 9.

use std::io::Write as _;

use http::header::{CONTENT_LENGTH, HOST, TRANSFER_ENCODING};
use http::{HeaderName, HeaderValue, Method, Request};

use super::payload::SendBody;

/// Room left in a head for the lines written when it starts: the body's
/// length and the head's end.
const TAIL: usize = 40;

/// A request to a replica, its head written so far.
#[derive(Debug, Clone)]
pub(crate) struct Outgoing {
    method: Method,
    /// The request line and each header line, each ending in CRLF.
    head: Vec<u8>,
    body: SendBody,
}

impl Outgoing {
    /// A request for the target `prefix` + `target` (origin form), with
    /// room for `lines` more bytes of header lines, counted as
    /// [`Outgoing::line_len`] counts them.
    pub(crate) fn new(method: Method, prefix: &str, target: &str, lines: usize, body: SendBody) -> Outgoing {
        let m = method.as_str();
        let mut head = Vec::with_capacity(m.len() + prefix.len() + target.len() + 12 + lines + TAIL);
        head.extend_from_slice(m.as_bytes());
        head.push(b' ');
        head.extend_from_slice(prefix.as_bytes());
        head.extend_from_slice(if target.is_empty() { "/" } else { target }.as_bytes());
        head.extend_from_slice(b" HTTP/1.1\r\n");
        Outgoing { method, head, body }
    }

    /// The bytes a header line takes in the head.
    pub(crate) fn line_len(name: &HeaderName, value: &HeaderValue) -> usize {
        name.as_str().len() + value.len() + 4
    }

    /// Write a header line. A header value holds no CR or LF (`http`
    /// refuses them), so a line cannot end early.
    pub(crate) fn header(&mut self, name: &HeaderName, value: &HeaderValue) {
        self.line(name.as_str().as_bytes(), value.as_bytes());
    }

    fn line(&mut self, name: &[u8], value: &[u8]) {
        self.head.extend_from_slice(name);
        self.head.extend_from_slice(b": ");
        self.head.extend_from_slice(value);
        self.head.extend_from_slice(b"\r\n");
    }

    pub(crate) fn body(&self) -> &SendBody {
        &self.body
    }

    /// The whole head, the body's length (`len`) written last, and the
    /// method and body: every body slogate sends has a known length. A GET
    /// or HEAD without a body says nothing of one, as clients do.
    pub(super) fn finish(self, len: u64) -> (Method, Vec<u8>, SendBody) {
        let Outgoing { method, mut head, body } = self;
        if len > 0 || !matches!(method, Method::GET | Method::HEAD) {
            head.extend_from_slice(b"content-length: ");
            let _ = write!(head, "{len}");
            head.extend_from_slice(b"\r\n");
        }
        head.extend_from_slice(b"\r\n");
        (method, head, body)
    }

    /// The header lines written, as `name: value` (tests read what a
    /// replica would get).
    #[cfg(test)]
    pub(crate) fn header_lines(&self) -> Vec<String> {
        let text = String::from_utf8_lossy(&self.head);
        text.split("\r\n").skip(1).filter(|l| !l.is_empty()).map(str::to_string).collect()
    }

    /// The request line's target (tests).
    #[cfg(test)]
    pub(crate) fn target(&self) -> String {
        let text = String::from_utf8_lossy(&self.head);
        text.split(' ').nth(1).unwrap_or_default().to_string()
    }
}

/// A request built as an `http::Request` (health checks, scrapes, tests):
/// its URI's path and query as the target, `Host` from its header or else
/// from the URI's authority, its headers but for any framing of the body
/// (written when it starts).
impl From<Request<SendBody>> for Outgoing {
    fn from(req: Request<SendBody>) -> Outgoing {
        let (parts, body) = req.into_parts();
        let lines: usize = parts.headers.iter().map(|(n, v)| Outgoing::line_len(n, v)).sum();
        let host = parts.uri.authority().map_or(0, |a| a.as_str().len() + 8);
        let target = parts.uri.path_and_query().map_or("/", |p| p.as_str());
        let mut out = Outgoing::new(parts.method.clone(), "", target, lines + host, body);
        if !parts.headers.contains_key(HOST) {
            if let Some(authority) = parts.uri.authority() {
                out.line(b"host", authority.as_str().as_bytes());
            }
        }
        for (name, value) in &parts.headers {
            if name != CONTENT_LENGTH && name != TRANSFER_ENCODING {
                out.header(name, value);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn written(out: Outgoing, len: u64) -> String {
        String::from_utf8(out.finish(len).1).expect("utf-8")
    }

    #[test]
    fn a_request_head_states_its_length_and_drops_the_framing_it_came_with() {
        let req = Request::post("/v1/completions?x=1")
            .header(HOST, "replica:8000")
            .header(CONTENT_LENGTH, "999")
            .header(TRANSFER_ENCODING, "chunked")
            .header("x-a", "1")
            .header("x-a", "2")
            .body(SendBody::from(Bytes::new()))
            .expect("request");
        assert_eq!(
            written(req.into(), 17),
            "POST /v1/completions?x=1 HTTP/1.1\r\nhost: replica:8000\r\nx-a: 1\r\nx-a: 2\r\ncontent-length: 17\r\n\r\n"
        );
        let get = Request::get("http://h:1/health").body(SendBody::from(Bytes::new())).expect("request");
        assert_eq!(written(get.into(), 0), "GET /health HTTP/1.1\r\nhost: h:1\r\n\r\n");
        let post = Request::post("/x").body(SendBody::from(Bytes::new())).expect("request");
        assert_eq!(written(post.into(), 0), "POST /x HTTP/1.1\r\ncontent-length: 0\r\n\r\n", "a POST says its body is empty");
    }

    #[test]
    fn a_head_built_line_by_line_takes_the_prefix_and_needs_no_second_allocation() {
        let (n, v) = (HeaderName::from_static("x-request-id"), HeaderValue::from_static("abc"));
        let mut out = Outgoing::new(Method::POST, "/vllm", "/v1/chat/completions", Outgoing::line_len(&n, &v), Bytes::new().into());
        let room = out.head.capacity();
        out.header(&n, &v);
        assert_eq!(out.target(), "/vllm/v1/chat/completions");
        assert_eq!(out.header_lines(), ["x-request-id: abc"]);
        let (_, head, _) = out.finish(1234567);
        assert_eq!(head.capacity(), room, "the head was sized for its lines and its length");
        assert!(head.ends_with(b"x-request-id: abc\r\ncontent-length: 1234567\r\n\r\n"));
    }
}
