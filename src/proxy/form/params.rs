//! A header's parameters (`form-data; name="model"; filename="a.wav"`,
//! `multipart/form-data; boundary=XyZ`) read as the replica's form parser
//! reads them, and refused where it could read them otherwise.
//!
//! vLLM's stack (Starlette over python-multipart) splits a header at each
//! `;` outside a quoted string (a quote escaped with `\` does not count),
//! lower-cases each parameter's name, strips Python's whitespace around
//! it, unquotes a value that starts and ends with `"` (`\\` then `\"`
//! unescaped, in that order), and keeps the last of two parameters of the
//! same name. slogate reads the same way, and refuses what a version of it
//! could read another way: a parameter given twice, an extended one
//! (`name*=`, RFC 2231, decoded by older versions and ignored by newer), a
//! `name` or `filename` without `=` (docs/access.md, rule 1).

/// Python's `str.strip()` whitespace, for a header decoded as Latin-1.
pub(super) fn py_space(b: u8) -> bool {
    matches!(b, b'\t' | b'\n' | 0x0b | 0x0c | b'\r' | 0x1c..=0x1f | b' ' | 0x85 | 0xa0)
}

pub(super) fn py_strip(mut s: &[u8]) -> &[u8] {
    while let [first, rest @ ..] = s {
        if !py_space(*first) {
            break;
        }
        s = rest;
    }
    while let [rest @ .., last] = s {
        if !py_space(*last) {
            break;
        }
        s = rest;
    }
    s
}

fn count(s: &[u8], pattern: &[u8]) -> usize {
    if s.len() < pattern.len() {
        return 0;
    }
    let mut n = 0;
    let mut i = 0;
    while i + pattern.len() <= s.len() {
        if &s[i..i + pattern.len()] == pattern {
            n += 1;
            i += pattern.len();
        } else {
            i += 1;
        }
    }
    n
}

fn find(s: &[u8], b: u8, from: usize) -> Option<usize> {
    s.get(from..).and_then(|t| memchr::memchr(b, t)).map(|i| i + from)
}

/// The header's `;`-separated segments, each stripped; the first is the
/// value itself (`form-data`, `multipart/form-data`). A `;` inside a
/// quoted string is refused: versions of the replica's parser disagree on
/// where such a segment ends (the standard library's email parser counts
/// quotes from the segment's start, python-multipart's own copy of it
/// another way), so no reading of it can be known to be the replica's.
pub(super) fn segments(value: &[u8]) -> Result<Vec<&[u8]>, String> {
    let mut out = Vec::new();
    let mut start = 0;
    loop {
        let end = find(value, b';', start);
        let e = end.unwrap_or(value.len());
        let seg = &value[start..e];
        if end.is_some() && (count(seg, b"\"") - count(seg, b"\\\"")) % 2 == 1 {
            return Err("a `;` inside a quoted parameter value".into());
        }
        let seg = py_strip(seg);
        if out.is_empty() || !seg.is_empty() {
            out.push(seg);
        }
        match end {
            Some(e) => start = e + 1,
            None => return Ok(out),
        }
    }
}

/// A header's value and parameters, as read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Params {
    /// The value before the first `;`, stripped (`form-data`).
    pub(super) value: Vec<u8>,
    /// Each parameter: its name lower-cased, its value unquoted.
    pub(super) params: Vec<(Vec<u8>, Vec<u8>)>,
}

impl Params {
    pub(super) fn get(&self, name: &[u8]) -> Option<&[u8]> {
        self.params.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_slice())
    }
}

/// Parse a header's parameters, refusing what is ambiguous (`why`, for the 400).
pub(super) fn parse(header: &[u8], ambiguous: &[&[u8]]) -> Result<Params, String> {
    let mut segs = segments(header)?.into_iter();
    let value = segs.next().unwrap_or_default().to_vec();
    let mut params: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
    for seg in segs {
        let Some(eq) = memchr::memchr(b'=', seg) else {
            let bare = seg.to_ascii_lowercase();
            if ambiguous.iter().any(|a| bare.starts_with(a)) {
                return Err(format!("the parameter `{}` has no value", String::from_utf8_lossy(seg)));
            }
            continue;
        };
        let key = py_strip(&seg[..eq]).to_ascii_lowercase();
        let raw = py_strip(&seg[eq + 1..]);
        if let Some(star) = memchr::memchr(b'*', &key) {
            if ambiguous.iter().any(|a| key[..star] == **a) {
                return Err(format!("the extended parameter `{}` is not accepted", String::from_utf8_lossy(&key)));
            }
            continue;
        }
        if params.iter().any(|(k, _)| *k == key) {
            return Err(format!("the parameter `{}` is given twice", String::from_utf8_lossy(&key)));
        }
        // Older versions also take `<...>` off a value (the email parser's unquote).
        if raw.len() > 1 && raw[0] == b'<' && raw[raw.len() - 1] == b'>' && ambiguous.contains(&key.as_slice()) {
            return Err(format!("the parameter `{}` is in angle brackets", String::from_utf8_lossy(&key)));
        }
        params.push((key, unquote(raw)));
    }
    Ok(Params { value, params })
}

/// A value that starts and ends with `"`, without them; `\\` then `\"` unescaped.
fn unquote(v: &[u8]) -> Vec<u8> {
    if v.len() < 2 || v[0] != b'"' || v[v.len() - 1] != b'"' {
        return v.to_vec();
    }
    let replace = |s: &[u8], from: &[u8], to: &[u8]| -> Vec<u8> {
        let mut out = Vec::with_capacity(s.len());
        let mut i = 0;
        while i < s.len() {
            if s[i..].starts_with(from) {
                out.extend_from_slice(to);
                i += from.len();
            } else {
                out.push(s[i]);
                i += 1;
            }
        }
        out
    };
    replace(&replace(&v[1..v.len() - 1], b"\\\\", b"\\"), b"\\\"", b"\"")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(h: &str) -> Result<Vec<(String, String)>, String> {
        parse(h.as_bytes(), &[b"name", b"filename", b"boundary"]).map(|p| {
            p.params
                .into_iter()
                .map(|(k, v)| (String::from_utf8_lossy(&k).into_owned(), String::from_utf8_lossy(&v).into_owned()))
                .collect()
        })
    }

    fn kv(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    /// The replica's reading, case by case (python-multipart's
    /// `parse_options_header`, as Starlette calls it).
    #[test]
    fn parameters_are_read_as_the_replica_reads_them() {
        assert_eq!(p(r#"form-data; name="model""#), Ok(kv(&[("name", "model")])));
        assert_eq!(p(r#"form-data; Name="model""#), Ok(kv(&[("name", "model")])), "names are case-insensitive");
        assert_eq!(p(r#"form-data; NAME = model "#), Ok(kv(&[("name", "model")])), "spaces around a bare value");
        let nbsp = parse(b"form-data; name\xa0=model", &[b"name"]).expect("read");
        assert_eq!(nbsp.get(b"name"), Some(&b"model"[..]), "NBSP (Latin-1) is Python whitespace");
        assert_eq!(p(r#"form-data; filename="x, name=model"; name="file""#), Ok(kv(&[("filename", "x, name=model"), ("name", "file")])));
        assert_eq!(p(r#"form-data; name="a\"b""#), Ok(kv(&[("name", "a\"b")])));
        assert_eq!(p(r#"form-data; name="a\\b""#), Ok(kv(&[("name", "a\\b")])));
        assert_eq!(p("form-data;; name=a;"), Ok(kv(&[("name", "a")])), "empty segments are nothing");
        assert_eq!(p("form-data; other"), Ok(vec![]), "a bare word is no name");
    }

    #[test]
    fn what_could_be_read_two_ways_is_refused() {
        assert!(p(r#"form-data; name="model"; name="file""#).is_err(), "two names");
        assert!(p(r#"form-data; name="model"; NAME="file""#).is_err(), "two names, case apart");
        assert!(p("form-data; name*=utf-8''model; name=file").is_err(), "an extended name");
        assert!(p("form-data; name*0=mo; name*1=del").is_err(), "a continued name");
        assert!(p("form-data; name").is_err(), "a name without a value");
        assert!(
            p(r#"form-data; filename="x; name=model"; name="file""#).is_err(),
            "a ; inside quotes: where it ends depends on the version"
        );
        assert!(p(r#"form-data; filename="a\"; name=model"; name=f"#).is_err());
        assert!(p("form-data; name=<model>").is_err(), "angle brackets: older versions take them off");
        assert!(p("multipart/form-data; boundary=a; boundary=b").is_err(), "two boundaries");
        assert!(p("multipart/form-data; Boundary=a; boundary=b").is_err());
        assert_eq!(
            p("form-data; title*=x; name=f"),
            Ok(kv(&[("name", "f")])),
            "another extended parameter is ignored, as the replica does"
        );
    }
}
