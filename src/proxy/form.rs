//! Multipart form bodies (`multipart/form-data`: audio transcription and
//! translation uploads). The form is read only for its `model` and
//! `stream` fields, by multer's parser over the body as received; the file
//! is skipped, never copied, and the caller's bytes go upstream as sent.
//! The rules are docs/access.md's (endpoints) and
//! docs/design/measurement.md's.

use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

use bytes::Bytes;

use super::body::{Head, Model};
use crate::error::GatewayError;

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

/// The routed-on fields of the form in `bytes` (its `boundary`): `model`,
/// and `stream` (`true` streams). 400 when the form is malformed.
pub(super) fn head(bytes: Bytes, boundary: &str) -> Result<Head, GatewayError> {
    let body = futures_util::stream::once(async move { Ok::<Bytes, std::convert::Infallible>(bytes) });
    let constraints =
        multer::Constraints::new().size_limit(multer::SizeLimit::new().for_field("model", FIELD_LIMIT).for_field("stream", FIELD_LIMIT));
    let mut form = multer::Multipart::with_constraints(body, boundary, constraints);
    // The whole body is in memory: the parser never waits, so it is driven
    // to its end here without a runtime.
    let (mut model, mut stream) = (Model::Missing, false);
    loop {
        let field = match now(form.next_field()) {
            Some(Ok(Some(field))) => field,
            Some(Ok(None)) => break,
            Some(Err(e)) => return Err(malformed(&e.to_string())),
            None => return Err(malformed("it ended early")),
        };
        match field.name() {
            Some("model") => match now(field.text()) {
                Some(Ok(m)) => model = Model::Name(m),
                Some(Err(e)) => return Err(malformed(&e.to_string())),
                None => return Err(malformed("it ended early")),
            },
            Some("stream") => match now(field.text()) {
                Some(Ok(s)) => stream = s.trim().eq_ignore_ascii_case("true"),
                Some(Err(e)) => return Err(malformed(&e.to_string())),
                None => return Err(malformed("it ended early")),
            },
            // The file and every other field: skipped by the next call.
            _ => {}
        }
    }
    Ok(Head::form(model, stream))
}

/// The value of `f` if it is ready at once (`None` if it would wait: the
/// in-memory body never does).
fn now<F: Future>(f: F) -> Option<F::Output> {
    let mut cx = Context::from_waker(Waker::noop());
    match pin!(f).poll(&mut cx) {
        Poll::Ready(v) => Some(v),
        Poll::Pending => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn the_model_and_stream_fields_are_read_wherever_they_are() {
        let h = head(form(&[("file", "RIFF....WAVEfmt "), ("model", "whisper-1"), ("stream", "true")]), "XyZ").expect("a form");
        assert_eq!((h.model.clone(), h.stream), (Model::Name("whisper-1".into()), true));
        let h = head(form(&[("model", "whisper-1"), ("language", "en"), ("file", "x")]), "XyZ").expect("a form");
        assert_eq!((h.model.clone(), h.stream), (Model::Name("whisper-1".into()), false));
        let h = head(form(&[("file", "x")]), "XyZ").expect("a form");
        assert_eq!(h.model, Model::Missing);
    }

    #[test]
    fn a_malformed_form_is_a_400() {
        let e = head(Bytes::from_static(b"--XyZ\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nwhis"), "XyZ").expect_err("cut");
        assert_eq!(e.status(), http::StatusCode::BAD_REQUEST);
        let long = "m".repeat(2000);
        assert!(head(form(&[("model", &long)]), "XyZ").is_err(), "a model name past the field limit");
        assert_eq!(boundary(Some("application/json")).map(|b| b.is_ok()), None);
        assert!(boundary(Some("multipart/form-data")).is_some_and(|b| b.is_err()), "no boundary");
        assert_eq!(boundary(Some("multipart/form-data; boundary=XyZ")).and_then(Result::ok).as_deref(), Some("XyZ"));
    }
}
