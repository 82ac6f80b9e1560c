//! A multipart form read byte by byte as it arrives, the way the replica's
//! parser (python-multipart, under Starlette) reads it, keeping the fields
//! the gateway decides on (`model`, `stream`) and refusing any form that
//! parser could read otherwise (docs/access.md, rule 1):
//! - the body starts with the first delimiter (`--` and the boundary),
//!   each part with its headers (a name of token characters, `:`, the
//!   value to the line's end; at most 8 of them, 4,224 bytes each), an
//!   empty line, then its data up to the next delimiter (CR LF, `--` and
//!   the boundary, then CR LF for another part or `--` for the end; the
//!   delimiter followed by anything else is data);
//! - a part's `Content-Disposition` is `form-data` with one `name`; the
//!   headers that the replica reads are given once; a
//!   `Content-Transfer-Encoding` is refused unless it is the identity;
//! - `model` and `stream` are text fields, given once or always with the
//!   same value (the replica keeps the last, slogate routed on the first);
//! - `priority` is no field of a form: the gateway sets priority.
//!
//! Whatever comes after the closing delimiter is ignored, as the replica
//! ignores it.

use super::params::{self, py_strip};

/// The longest `model` or `stream` value read from a form.
pub(crate) const FIELD_LIMIT: usize = 1024;
/// The replica's limits on a part's headers (python-multipart's defaults).
const MAX_HEADERS: usize = 8;
const MAX_HEADER_LINE: usize = 4096 + 128;

/// Where the reader is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Matching the first delimiter (`--` and the boundary): how much of it.
    Start(usize),
    /// After a delimiter: `\r` (then `\n`) for a part, `-` (then `-`) for the end.
    AfterDelimiter,
    AfterCr,
    AfterDash,
    /// A part's header lines.
    Header,
    HeaderLf,
    /// A part's data, with how much of the next delimiter (`\r\n--` and
    /// the boundary, then two more bytes) is matched so far.
    Data(usize),
    End,
}

/// Which field a part is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Field {
    Model,
    Stream,
    Other,
}

/// What the form said, so far.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Fields {
    pub(crate) model: Option<String>,
    pub(crate) stream: Option<bool>,
    /// A file part began after `model` was read: routing needs no more.
    pub(crate) file_after_model: bool,
}

/// A streaming multipart/form-data reader. Feed it the body's bytes in
/// any pieces; it refuses at the first byte that makes the form one the
/// replica could read otherwise.
#[derive(Debug, Clone)]
pub(crate) struct FormReader {
    /// `\r\n--` and the boundary.
    delimiter: Vec<u8>,
    state: State,
    line: Vec<u8>,
    headers: usize,
    disposition: Option<Vec<u8>>,
    encoding: bool,
    field: Field,
    is_file: bool,
    value: Vec<u8>,
    fields: Fields,
    /// The byte after a matched delimiter (`\r` or `-`), while the next one decides.
    after: u8,
}

/// Why a form is refused, for the 400.
pub(crate) type Refusal = String;

impl FormReader {
    pub(crate) fn new(boundary: &[u8]) -> FormReader {
        let mut delimiter = b"\r\n--".to_vec();
        delimiter.extend_from_slice(boundary);
        FormReader {
            delimiter,
            state: State::Start(0),
            line: Vec::new(),
            headers: 0,
            disposition: None,
            encoding: false,
            field: Field::Other,
            is_file: false,
            value: Vec::new(),
            fields: Fields::default(),
            after: 0,
        }
    }

    pub(crate) fn fields(&self) -> &Fields {
        &self.fields
    }

    /// The closing delimiter was read: the form is whole.
    pub(crate) fn ended(&self) -> bool {
        self.state == State::End
    }

    /// The body ended: the form must be whole.
    pub(crate) fn finish(&self) -> Result<&Fields, Refusal> {
        if self.ended() {
            Ok(&self.fields)
        } else {
            Err("it ended before its closing boundary".into())
        }
    }

    /// Read the next bytes of the body.
    pub(crate) fn feed(&mut self, data: &[u8]) -> Result<(), Refusal> {
        let mut i = 0;
        while i < data.len() {
            let c = data[i];
            match self.state {
                State::End => return Ok(()),
                State::Start(k) => {
                    // `--` and the boundary: the delimiter less its CR LF.
                    if c != self.delimiter[2 + k] {
                        return Err("it does not start with its boundary".into());
                    }
                    self.state = if 2 + k + 1 == self.delimiter.len() { State::AfterDelimiter } else { State::Start(k + 1) };
                }
                State::AfterDelimiter => {
                    self.state = match c {
                        b'\r' => State::AfterCr,
                        b'-' => State::AfterDash,
                        _ => return Err("a boundary is not followed by CR LF or --".into()),
                    }
                }
                State::AfterCr if c == b'\n' => self.begin_part(),
                State::AfterDash if c == b'-' => {
                    self.state = State::End;
                    return Ok(());
                }
                State::AfterCr | State::AfterDash => return Err("a boundary is not followed by CR LF or --".into()),
                State::Header => {
                    // To the line's CR.
                    let end = memchr::memchr(b'\r', &data[i..]).map_or(data.len(), |e| i + e);
                    if self.line.len() + (end - i) > MAX_HEADER_LINE {
                        return Err("a part's header line is too long".into());
                    }
                    self.line.extend_from_slice(&data[i..end]);
                    if end < data.len() {
                        self.state = State::HeaderLf;
                    }
                    i = end + 1;
                    continue;
                }
                State::HeaderLf => {
                    if c != b'\n' {
                        return Err("a part's header line does not end with CR LF".into());
                    }
                    if self.line.is_empty() {
                        self.headers_done()?;
                    } else {
                        self.header_line()?;
                        self.state = State::Header;
                    }
                }
                State::Data(0) => {
                    // Skip to the next CR: only it can start a delimiter.
                    let take = memchr::memchr(b'\r', &data[i..]).unwrap_or(data.len() - i);
                    self.data(&data[i..i + take])?;
                    i += take;
                    if i < data.len() {
                        self.state = State::Data(1);
                        i += 1;
                    }
                    continue;
                }
                State::Data(k) => self.delimiter_byte(k, c)?,
            }
            i += 1;
        }
        Ok(())
    }

    /// Byte `c` while `k` bytes of a delimiter (and maybe the byte after it) are matched.
    fn delimiter_byte(&mut self, k: usize, c: u8) -> Result<(), Refusal> {
        let d = self.delimiter.len();
        let matched = if k < d {
            c == self.delimiter[k]
        } else if k == d {
            c == b'\r' || c == b'-'
        } else {
            // The byte after the delimiter decides: CR wants LF, - wants -.
            let after = self.after;
            (after == b'\r' && c == b'\n') || (after == b'-' && c == b'-')
        };
        if !matched {
            // Not a delimiter: what was matched is data, and this byte is read again.
            let mut was = self.delimiter[..k.min(d)].to_vec();
            if k > d {
                was.push(self.after);
            }
            self.data(&was)?;
            if c == b'\r' {
                self.state = State::Data(1);
            } else {
                self.data(&[c])?;
                self.state = State::Data(0);
            }
            return Ok(());
        }
        if k == d {
            self.after = c;
            self.state = State::Data(k + 1);
            return Ok(());
        }
        if k < d {
            self.state = State::Data(k + 1);
            return Ok(());
        }
        self.end_part()?;
        if c == b'\n' {
            self.begin_part();
        } else {
            self.state = State::End;
        }
        Ok(())
    }

    fn begin_part(&mut self) {
        self.line.clear();
        self.headers = 0;
        self.disposition = None;
        self.encoding = false;
        self.field = Field::Other;
        self.is_file = false;
        self.value.clear();
        self.state = State::Header;
    }

    /// One header line of a part (in `line`).
    fn header_line(&mut self) -> Result<(), Refusal> {
        self.headers += 1;
        if self.headers > MAX_HEADERS {
            return Err(format!("a part has more than {MAX_HEADERS} headers"));
        }
        let line = std::mem::take(&mut self.line);
        let Some(colon) = memchr::memchr(b':', &line) else { return Err("a part's header line has no `:`".into()) };
        let name = &line[..colon];
        if name.is_empty() || !name.iter().all(|&b| is_token(b)) {
            return Err("a part's header has a name that is not a token".into());
        }
        let mut value = &line[colon + 1..];
        while let [b' ', rest @ ..] = value {
            value = rest;
        }
        if name.eq_ignore_ascii_case(b"content-disposition") {
            if self.disposition.is_some() {
                return Err("a part has two Content-Disposition headers".into());
            }
            self.disposition = Some(value.to_vec());
        } else if name.eq_ignore_ascii_case(b"content-transfer-encoding") {
            let v = py_strip(value).to_ascii_lowercase();
            if self.encoding || !matches!(v.as_slice(), b"7bit" | b"8bit" | b"binary") {
                return Err("a part's Content-Transfer-Encoding is not accepted (only 7bit, 8bit or binary, once)".into());
            }
            self.encoding = true;
        }
        self.line = line;
        self.line.clear();
        Ok(())
    }

    /// The empty line after a part's headers: which field it is.
    fn headers_done(&mut self) -> Result<(), Refusal> {
        let Some(disposition) = self.disposition.take() else { return Err("a part has no Content-Disposition".into()) };
        let p = params::parse(&disposition, &[b"name", b"filename"])?;
        if !p.value.eq_ignore_ascii_case(b"form-data") {
            return Err("a part's Content-Disposition is not form-data".into());
        }
        let Some(name) = p.get(b"name") else { return Err("a part's Content-Disposition has no name".into()) };
        self.is_file = p.get(b"filename").is_some();
        self.field = match name {
            b"model" => Field::Model,
            b"stream" => Field::Stream,
            b"priority" => return Err("`priority` is set by the gateway, not in a form".into()),
            _ => Field::Other,
        };
        if self.field != Field::Other && self.is_file {
            return Err(format!("`{}` must be a text field, not a file", String::from_utf8_lossy(name)));
        }
        if self.is_file && self.fields.model.is_some() {
            self.fields.file_after_model = true;
        }
        self.value.clear();
        self.state = State::Data(0);
        Ok(())
    }

    /// Data of the current part.
    fn data(&mut self, d: &[u8]) -> Result<(), Refusal> {
        if self.field == Field::Other || d.is_empty() {
            return Ok(());
        }
        if self.value.len() + d.len() > FIELD_LIMIT {
            return Err(format!("a `{}` field is longer than {FIELD_LIMIT} bytes", self.field_name()));
        }
        self.value.extend_from_slice(d);
        Ok(())
    }

    fn field_name(&self) -> &'static str {
        match self.field {
            Field::Model => "model",
            Field::Stream => "stream",
            Field::Other => "other",
        }
    }

    /// The current part ended (its delimiter was read).
    fn end_part(&mut self) -> Result<(), Refusal> {
        let value = std::mem::take(&mut self.value);
        match self.field {
            Field::Other => {}
            Field::Model => {
                let m = String::from_utf8(value).map_err(|_| "the `model` field is not UTF-8".to_string())?;
                match &self.fields.model {
                    Some(first) if *first != m => return Err(format!("two `model` fields that differ (`{first}`, `{m}`)")),
                    _ => self.fields.model = Some(m),
                }
            }
            Field::Stream => {
                let v = truthy(&value);
                match self.fields.stream {
                    Some(first) if first != v => return Err("two `stream` fields that differ".into()),
                    _ => self.fields.stream = Some(v),
                }
            }
        }
        self.field = Field::Other;
        Ok(())
    }
}

/// A form's boolean as the replica's validation reads it (pydantic: `1`,
/// `on`, `t`, `true`, `y`, `yes`, any case).
fn truthy(v: &[u8]) -> bool {
    let v = py_strip(v).to_ascii_lowercase();
    matches!(v.as_slice(), b"1" | b"on" | b"t" | b"true" | b"y" | b"yes")
}

/// An HTTP token character (RFC 9110): what a header's name is made of.
fn is_token(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}
