//! The replica's reading of a multipart form, written down plainly over a
//! whole body: the oracle the streaming reader ([`super::parse`]) is held
//! to by its tests and its fuzz target. It follows python-multipart's
//! parser as Starlette drives it (vLLM's stack), rule for rule:
//!
//! | step | the replica's rule |
//! |---|---|
//! | start | leading CR or LF: skip to the first `-`; then `--` and the boundary, then CR LF (a part) or `--` (an empty form) |
//! | headers | lines to CR LF; a name of token characters before `:`, spaces after it skipped; names lower-cased, the last of a name kept; an empty line ends them |
//! | data | up to CR LF `--` boundary followed by CR LF (next part) or `--` (the end); followed by anything else, it is data |
//! | after the end | ignored |
//! | disposition | split at `;` outside quotes (quotes counted from the segment's start, less `\"`); a parameter's name stripped and lower-cased; a value in quotes unquoted (`\\`, then `\"`); the last of a name kept; a part without `name` is an error |
//! | file | a part with `filename` |
//! | encoding | `Content-Transfer-Encoding` ignored |
//!
//! It refuses nothing that the replica reads; it accepts what the replica
//! accepts. Not on the request path.

/// One field as the replica reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RefField {
    pub(crate) name: Vec<u8>,
    pub(crate) value: Vec<u8>,
    pub(crate) file: bool,
}

fn is_token(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

fn position(hay: &[u8], needle: &[u8], from: usize) -> Option<usize> {
    if from > hay.len() {
        return None;
    }
    hay[from..].windows(needle.len()).position(|w| w == needle).map(|i| i + from)
}

/// The fields of `body` under `boundary`, in order, or the replica's error.
pub(crate) fn fields(body: &[u8], boundary: &[u8]) -> Result<Vec<RefField>, String> {
    let mut at = 0;
    if matches!(body.first(), Some(b'\r' | b'\n')) {
        at = body.iter().position(|&b| b == b'-').ok_or("no boundary")?;
    }
    let mut open = b"--".to_vec();
    open.extend_from_slice(boundary);
    if !body[at..].starts_with(&open) {
        return Err("does not start with the boundary".into());
    }
    at += open.len();
    match body.get(at..at + 2) {
        Some(b"--") => return Ok(Vec::new()),
        Some(b"\r\n") => at += 2,
        _ => return Err("bad first boundary".into()),
    }
    let mut delimiter = b"\r\n--".to_vec();
    delimiter.extend_from_slice(boundary);
    let mut out = Vec::new();
    loop {
        // Headers.
        let mut headers: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
        loop {
            let end = position(body, b"\r", at).ok_or("headers cut")?;
            if body.get(end + 1) != Some(&b'\n') {
                return Err("header without LF".into());
            }
            let line = &body[at..end];
            at = end + 2;
            if line.is_empty() {
                break;
            }
            let colon = line.iter().position(|&b| b == b':').ok_or("header without colon")?;
            if colon == 0 || !line[..colon].iter().all(|&b| is_token(b)) {
                return Err("bad header name".into());
            }
            let value: Vec<u8> = line[colon + 1..].iter().copied().skip_while(|&b| b == b' ').collect();
            let name = line[..colon].to_ascii_lowercase();
            headers.retain(|(n, _)| *n != name);
            headers.push((name, value));
            if headers.len() > 8 {
                return Err("too many headers".into());
            }
        }
        let disposition = headers.iter().find(|(n, _)| n == b"content-disposition").map(|(_, v)| v.clone()).unwrap_or_default();
        let options = options(&disposition);
        let name = options.iter().rev().find(|(k, _)| k == b"name").map(|(_, v)| v.clone()).ok_or("part without a name")?;
        let file = options.iter().any(|(k, _)| k == b"filename");
        // Data, to a delimiter followed by CR LF or --.
        let mut search = at;
        let (end, last) = loop {
            let d = position(body, &delimiter, search).ok_or("data cut")?;
            match body.get(d + delimiter.len()..d + delimiter.len() + 2) {
                Some(b"\r\n") => break (d, false),
                Some(b"--") => break (d, true),
                Some(_) => search = d + 1,
                None => return Err("data cut".into()),
            }
        };
        out.push(RefField { name, value: body[at..end].to_vec(), file });
        if last {
            return Ok(out);
        }
        at = end + delimiter.len() + 2;
    }
}

/// A header's parameters, in order (the last of a name is the one read).
pub(crate) fn options(header: &[u8]) -> Vec<(Vec<u8>, Vec<u8>)> {
    let strip = |s: &[u8]| -> Vec<u8> { super::params::py_strip(s).to_vec() };
    let mut s: &[u8] = header;
    let mut plist: Vec<Vec<u8>> = Vec::new();
    let mut first = true;
    loop {
        // The classic email-parser split: extend past a `;` while the quotes before it are odd.
        let quotes = |t: &[u8]| t.iter().filter(|&&b| b == b'"').count() - t.windows(2).filter(|w| w == b"\\\"").count();
        let mut end = s.iter().position(|&b| b == b';');
        while let Some(e) = end {
            if quotes(&s[..e]) % 2 == 0 {
                break;
            }
            end = s[e + 1..].iter().position(|&b| b == b';').map(|i| i + e + 1);
        }
        let e = end.unwrap_or(s.len());
        let f = &s[..e];
        let seg = match f.iter().position(|&b| b == b'=') {
            Some(i) if !first => {
                let mut k = strip(&f[..i]).to_ascii_lowercase();
                k.push(b'=');
                k.extend_from_slice(&strip(&f[i + 1..]));
                k
            }
            _ => strip(f),
        };
        plist.push(seg);
        first = false;
        match end {
            Some(e) => s = &s[e + 1..],
            None => break,
        }
    }
    let mut out = Vec::new();
    for seg in plist.into_iter().skip(1) {
        let (k, v) = match seg.iter().position(|&b| b == b'=') {
            Some(i) => (seg[..i].to_vec(), seg[i + 1..].to_vec()),
            None => (seg.clone(), Vec::new()),
        };
        if k.contains(&b'*') {
            continue;
        }
        let v = if v.len() >= 2 && v[0] == b'"' && v[v.len() - 1] == b'"' {
            let inner = String::from_utf8_lossy(&v[1..v.len() - 1]).into_owned();
            // (Latin-1 bytes stay as they are for the names compared here.)
            if inner.as_bytes() == &v[1..v.len() - 1] {
                inner.replace("\\\\", "\\").replace("\\\"", "\"").into_bytes()
            } else {
                v[1..v.len() - 1].to_vec()
            }
        } else {
            v
        };
        out.push((k, v));
    }
    out
}

/// The streaming reader's promise, on any body and any cutting of it into
/// frames (the tests and the fuzz target): where it accepts a form, the
/// replica reads the same `model` and `stream` from it (each the last of
/// its name there), and no `priority`; where the replica could not read a
/// form, the reader does not accept it.
#[cfg(feature = "fuzzing")]
pub(crate) fn agree(body: &[u8], boundary: &[u8], cuts: &[usize]) -> Result<(), String> {
    let mut reader = super::FormReader::new(boundary);
    let mut at = 0;
    let mut refused = None;
    for &c in cuts.iter().chain(std::iter::once(&body.len())) {
        let c = c.clamp(at, body.len());
        if let Err(e) = reader.feed(&body[at..c]) {
            refused = Some(e);
            break;
        }
        at = c;
    }
    let ours = match refused {
        Some(_) => return Ok(()),
        None => match reader.finish() {
            Ok(f) => f.clone(),
            Err(_) => return Ok(()),
        },
    };
    let text = || String::from_utf8_lossy(body).into_owned();
    let theirs = fields(body, boundary).map_err(|e| format!("accepted a form the replica cannot read ({e}): {:?}", text()))?;
    let last = |n: &[u8]| theirs.iter().rev().find(|f| f.name == n);
    let model = last(b"model").map(|f| String::from_utf8_lossy(&f.value).into_owned());
    if model != ours.model {
        return Err(format!("model: the reader says {:?}, the replica {model:?}: {:?}", ours.model, text()));
    }
    if theirs.iter().any(|f| f.name == b"model" && Some(String::from_utf8_lossy(&f.value).into_owned()) != ours.model) {
        return Err(format!("the replica sees two models where the reader accepted one: {:?}", text()));
    }
    let stream = last(b"stream").map(|f| {
        let v = super::params::py_strip(&f.value).to_ascii_lowercase();
        matches!(v.as_slice(), b"1" | b"on" | b"t" | b"true" | b"y" | b"yes")
    });
    if stream != ours.stream {
        return Err(format!("stream: the reader says {:?}, the replica {stream:?}: {:?}", ours.stream, text()));
    }
    if theirs.iter().any(|f| f.name == b"priority") {
        return Err(format!("accepted a form with a priority: {:?}", text()));
    }
    Ok(())
}
