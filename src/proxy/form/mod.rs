//! Multipart form bodies (`multipart/form-data`: audio transcription and
//! translation uploads), read as the replica reads them ([`parse`]: the
//! replica's parser's rules, and what is refused because a version of it
//! could read the form otherwise). Routing reads the form as it arrives up
//! to its `model` field (and its first file after it); the rest goes on to
//! the replica as it arrives, read on by the same reader, so a second
//! `model` anywhere in the form is seen: the upload's last bytes wait for
//! the reader's verdict, and a form it refuses never reaches the replica
//! whole ([`crate::upstream::Upload`]).
//! The rules are docs/access.md's (endpoints, rule 1) and
//! docs/design/measurement.md's.

mod params;
pub(crate) mod parse;
#[cfg(any(test, feature = "fuzzing"))]
pub(crate) mod reference;

use bytes::Bytes;
use http_body::Body;
use http_body_util::BodyExt;

use super::body::{Head, Model};
use crate::error::{BoxError, GatewayError};
pub(crate) use parse::FormReader;

/// The longest boundary the replica's parser takes.
const MAX_BOUNDARY: usize = 256;

/// Is `content_type` (the request's only Content-Type) a multipart form?
/// Its boundary, if so: one `boundary` parameter, read as the replica reads
/// it; two of them (or any parameter twice) are a 400.
pub(super) fn boundary(content_type: Option<&[u8]>) -> Option<Result<Vec<u8>, GatewayError>> {
    let ct = content_type?;
    let media = params::py_strip(ct.split(|b| *b == b';').next().unwrap_or_default());
    if !media.eq_ignore_ascii_case(b"multipart/form-data") {
        return None;
    }
    let p = match params::parse(ct, &[b"boundary"]) {
        Ok(p) => p,
        Err(why) => return Some(Err(malformed(&format!("its Content-Type: {why}")))),
    };
    Some(match p.get(b"boundary") {
        None | Some([]) => Err(malformed("its Content-Type has no boundary")),
        Some(b) if b.len() > MAX_BOUNDARY => Err(malformed("its boundary is longer than 256 bytes")),
        Some(b) => Ok(b.to_vec()),
    })
}

pub(crate) fn malformed(why: &str) -> GatewayError {
    GatewayError::InvalidRequest { message: format!("the multipart form cannot be read: {why}"), param: None }
}

/// How far into a form its `model` is looked for as the body arrives: a
/// client that writes its fields first (as the OpenAI SDKs do) has them in
/// the first few hundred bytes. A form whose `model` comes later (after
/// the file) is read whole and read on aside, at a lower priority than the
/// streams ([`super::aside`]), rather than frame by frame on the threads
/// that carry them.
pub(super) const PARSE_AHEAD: u64 = 64 * 1024;

/// A form read as far as routing needs.
pub(super) struct FormRead<B> {
    /// The reader, having read `read`: it reads the rest too.
    pub(super) reader: FormReader,
    /// The bytes read, as received.
    pub(super) read: Vec<Bytes>,
    /// The rest of the body, when routing needed less than all of it.
    pub(super) rest: Option<B>,
}

impl<B> FormRead<B> {
    /// The routed-on fields, once `model` is known.
    pub(super) fn head(&self) -> Option<Head> {
        let f = self.reader.fields();
        f.model.clone().map(|m| Head::form(Model::Name(m), f.stream.unwrap_or(false)))
    }
}

/// Read the form in `body` (its `boundary`) as far as its `model` field
/// and the first file after it (or its end); no further than `ahead` bytes.
/// 400 when the form is malformed or ambiguous, 413 past `limit` bytes.
pub(super) async fn read_head<B>(
    mut body: B,
    boundary: &[u8],
    limit: u64,
    ahead: u64,
    hold: &mut crate::server::bodies::BodyHold,
) -> Result<FormRead<B>, GatewayError>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    let mut reader = FormReader::new(boundary);
    let (mut read, mut total) = (Vec::new(), 0u64);
    loop {
        let f = reader.fields();
        if (f.model.is_some() && (f.file_after_model || reader.ended())) || total >= ahead {
            return Ok(FormRead { reader, read, rest: Some(body) });
        }
        let Some(frame) = body.frame().await else {
            reader.finish().map_err(|why| malformed(&why))?;
            return Ok(FormRead { reader, read, rest: None });
        };
        let Ok(data) = frame.map_err(|e| GatewayError::BodyRead(e.into()))?.into_data() else { continue };
        total += data.len() as u64;
        if total > limit {
            return Err(GatewayError::PayloadTooLarge { limit });
        }
        hold.take(data.len())?;
        reader.feed(&data).map_err(|why| malformed(&why))?;
        read.push(data);
    }
}

/// Read on, in `reader`, the frames `parts` of a form now whole: the
/// routed-on fields of the whole form (`Model::Missing` without one). 400
/// when it is malformed or ambiguous, or ends before its closing boundary.
pub(super) fn read_rest(mut reader: FormReader, parts: &[Bytes]) -> Result<Head, GatewayError> {
    for p in parts {
        reader.feed(p).map_err(|why| malformed(&why))?;
    }
    let f = reader.finish().map_err(|why| malformed(&why))?;
    let model = f.model.clone().map_or(Model::Missing, Model::Name);
    Ok(Head::form(model, f.stream.unwrap_or(false)))
}

/// The routed-on fields of a whole form in memory (`parts`, the frames it
/// came in; its `boundary`).
#[cfg(test)]
pub(super) fn head_of(parts: &[Bytes], boundary: &[u8]) -> Result<Head, GatewayError> {
    read_rest(FormReader::new(boundary), parts)
}

/// The reader as the check of an upload's rest ([`crate::upstream::Upload`]).
impl crate::upstream::UploadCheck for FormReader {
    fn feed(&mut self, data: &[u8]) -> Result<(), String> {
        FormReader::feed(self, data)
    }

    fn end(&mut self) -> Result<(), String> {
        self.finish().map(|_| ())
    }
}

#[cfg(test)]
mod tests;
