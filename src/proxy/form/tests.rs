use super::*;
use http_body_util::StreamBody;

type Chunks = StreamBody<futures_util::stream::Iter<std::vec::IntoIter<Result<http_body::Frame<Bytes>, std::convert::Infallible>>>>;

fn form(parts: &[(&str, &str)]) -> Bytes {
    let mut b = String::new();
    for (name, value) in parts {
        if *name == "file" {
            b.push_str(&format!(
                "--XyZ\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.wav\"\r\nContent-Type: audio/wav\r\n\r\n{value}\r\n"
            ));
        } else {
            b.push_str(&format!("--XyZ\r\nContent-Disposition: form-data; name=\"{name}\"\r\n\r\n{value}\r\n"));
        }
    }
    b.push_str("--XyZ--\r\n");
    Bytes::from(b)
}

/// `bytes` as a body arriving in frames of `frame` bytes.
fn hold() -> crate::server::bodies::BodyHold {
    crate::server::bodies::BodyHold::new(Default::default(), Default::default(), u64::MAX, u64::MAX)
}

fn arriving(bytes: &Bytes, frame: usize) -> Chunks {
    let frames: Vec<_> = bytes.chunks(frame).map(|c| Ok(http_body::Frame::data(Bytes::copy_from_slice(c)))).collect();
    StreamBody::new(futures_util::stream::iter(frames))
}

async fn head(bytes: Bytes, frame: usize) -> Result<(Head, usize, bool), GatewayError> {
    let r = read_head(arriving(&bytes, frame), b"XyZ", 1 << 20, PARSE_AHEAD, &mut hold()).await?;
    let read: usize = r.read.iter().map(Bytes::len).sum();
    let head = match (r.head(), &r.rest) {
        (Some(h), _) => h,
        (None, None) => Head::form(Model::Missing, false),
        (None, Some(_)) => panic!("no model within the parse-ahead"),
    };
    Ok((head, read, r.rest.is_some()))
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
async fn a_model_after_a_long_file_is_left_to_the_whole_form_read() {
    let file = "x".repeat(200_000);
    let whole = form(&[("file", &file), ("model", "whisper-1"), ("stream", "true")]);
    let r = read_head(arriving(&whole, 4096), b"XyZ", 1 << 20, PARSE_AHEAD, &mut hold()).await.expect("read");
    assert!(r.head().is_none(), "no model in the first {PARSE_AHEAD} bytes");
    let read: u64 = r.read.iter().map(|b| b.len() as u64).sum();
    assert!((PARSE_AHEAD..PARSE_AHEAD + 4096).contains(&read), "stopped after {read} bytes");
    assert!(r.rest.is_some());
    // The whole form, in the frames it came in (some cut inside a
    // delimiter or a field's name): read a frame at a time.
    let frames = |b: &Bytes, n: usize| -> Vec<Bytes> { b.chunks(n).map(Bytes::copy_from_slice).collect() };
    for n in [7, 4093, whole.len()] {
        let h = head_of(&frames(&whole, n), b"XyZ").expect("the whole form");
        assert_eq!((h.model, h.stream), (Model::Name("whisper-1".into()), true), "frames of {n}");
    }
    assert_eq!(head_of(&frames(&form(&[("file", "x")]), 5), b"XyZ").expect("a form").model, Model::Missing);
    let cut = Bytes::from_static(b"--XyZ\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nwh");
    assert!(head_of(&[cut], b"XyZ").is_err());
    assert!(head_of(&[], b"XyZ").is_err(), "no form at all");
}

#[tokio::test]
async fn a_malformed_form_is_a_400_and_a_long_one_a_413() {
    let cut = Bytes::from_static(b"--XyZ\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nwhis");
    let e = head(cut, 8).await.expect_err("cut");
    assert_eq!(e.status(), http::StatusCode::BAD_REQUEST);
    let long = "m".repeat(2000);
    assert!(head(form(&[("model", &long)]), 100).await.is_err(), "a model name past the field limit");
    let big = form(&[("file", &"x".repeat(5000)), ("model", "w")]);
    let e = read_head(arriving(&big, 100), b"XyZ", 4096, PARSE_AHEAD, &mut hold()).await.err().expect("over the limit");
    assert_eq!(e.status(), http::StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(boundary(Some(b"application/json")).map(|b| b.is_ok()), None);
    assert!(boundary(Some(b"multipart/form-data")).is_some_and(|b| b.is_err()), "no boundary");
    assert_eq!(boundary(Some(b"multipart/form-data; boundary=XyZ")).and_then(Result::ok).as_deref(), Some(&b"XyZ"[..]));
    assert_eq!(boundary(Some(b"Multipart/Form-Data; BOUNDARY=\"XyZ\"")).and_then(Result::ok).as_deref(), Some(&b"XyZ"[..]));
    assert!(boundary(Some(b"multipart/form-data; boundary=a; boundary=b")).is_some_and(|b| b.is_err()), "two boundaries");
    assert!(boundary(Some(b"multipart/form-data; boundary=a; Boundary=b")).is_some_and(|b| b.is_err()), "two boundaries, case apart");
    assert!(boundary(Some(b"multipart/form-data; boundary*=utf-8''b; boundary=a")).is_some_and(|b| b.is_err()));
}

/// Every way the replica's parser could read another `model` than the
/// first one slogate routed on: each is refused, in any frames.
#[test]
fn forms_the_replica_could_read_otherwise_are_refused() {
    let part = |disposition: &str, value: &str| format!("--XyZ\r\nContent-Disposition: {disposition}\r\n\r\n{value}\r\n");
    let file = part(r#"form-data; name="file"; filename="a.wav""#, "RIFF");
    let small = part(r#"form-data; name="model""#, "m-small");
    let cases: Vec<(&str, String)> = vec![
        ("a second model after the file", format!("{small}{file}{}--XyZ--\r\n", part(r#"form-data; name="model""#, "m-big"))),
        ("Name= in another case", format!("{small}{file}{}--XyZ--\r\n", part(r#"form-data; Name="model""#, "m-big"))),
        ("NAME= in capitals", format!("{small}{}--XyZ--\r\n", part(r#"form-data; NAME="model""#, "m-big"))),
        ("two name parameters", format!("{small}{}--XyZ--\r\n", part(r#"form-data; name="x"; name="model""#, "m-big"))),
        ("name= inside a quoted value", format!("{}{file}--XyZ--\r\n", part(r#"form-data; filename="a; name=model"; name="model""#, "m-big"))),
        ("an extended name", format!("{small}{}--XyZ--\r\n", part("form-data; name*=utf-8''model", "m-big"))),
        ("a base64 model", format!("--XyZ\r\nContent-Disposition: form-data; name=\"model\"\r\nContent-Transfer-Encoding: base64\r\n\r\nbS1iaWc=\r\n{file}--XyZ--\r\n")),
        ("two dispositions", format!("--XyZ\r\nContent-Disposition: form-data; name=\"x\"\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nm-big\r\n{small}--XyZ--\r\n")),
        ("a model file", format!("{small}{}--XyZ--\r\n", part(r#"form-data; name="model"; filename="m""#, "m-big"))),
        ("a priority field", format!("{small}{}--XyZ--\r\n", part(r#"form-data; name="priority""#, "-1000"))),
        ("no closing boundary", format!("{small}{file}")),
        ("a preamble", format!("\r\n{small}--XyZ--\r\n")),
    ];
    for (what, body) in cases {
        let bytes = Bytes::from(body);
        for n in [1, 3, 17, bytes.len()] {
            let frames: Vec<Bytes> = bytes.chunks(n).map(Bytes::copy_from_slice).collect();
            let e = head_of(&frames, b"XyZ").expect_err(what);
            assert_eq!(e.status(), http::StatusCode::BAD_REQUEST, "{what}");
        }
        // The reference reads it too: where it finds a model, it is not the first one only.
        let _ = reference::fields(&bytes, b"XyZ");
    }
    // The same model twice is one model.
    let twice = Bytes::from(format!("{small}{file}{small}--XyZ--\r\n"));
    assert_eq!(head_of(&[twice], b"XyZ").expect("the same model twice").model, Model::Name("m-small".into()));
}

/// A delimiter that is not one (the boundary followed by another byte, a
/// CR inside the data) is data, as the replica reads it.
#[test]
fn near_delimiters_are_data() {
    let body = "--XyZ\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nm\r\r\n--XyZx\r\n--XyZ-a\r\n--XyZ\r\nContent-Disposition: form-data; name=\"f\"\r\n\r\n\r\n--XyZ--";
    let mut r = FormReader::new(b"XyZ");
    r.feed(body.as_bytes()).expect("a form");
    assert_eq!(r.finish().expect("whole").model.as_deref(), Some("m\r\r\n--XyZx\r\n--XyZ-a"));
    let reference = reference::fields(body.as_bytes(), b"XyZ").expect("the reference reads it");
    assert_eq!(reference.iter().find(|f| f.name == b"model").map(|f| f.value.clone()), Some(b"m\r\r\n--XyZx\r\n--XyZ-a".to_vec()));
}
