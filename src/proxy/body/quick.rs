//! The quick path's reading of a request body: only the members routing
//! needs (rules in the parent module's doc). A one-pass scan
//! ([`sse::quick_request_head`]) reads the usual body; what it leaves (an
//! escaped key, a `stream_options`, a count it cannot be sure of) serde
//! reads into a small struct; what that leaves (a duplicate key, a `model`
//! that is not a string, JSON that is not valid) takes the general path.
//! The three read the same head: tests and the fuzz target hold them
//! equal. A 64-byte completion request's head took 1,660 instructions
//! this way and 2,360 through serde's struct (callgrind, the UTF-8 check
//! and the model's copy included).

use std::borrow::Cow;

use serde::de::IgnoredAny;
use serde::{Deserialize, Deserializer};
use serde_json::value::RawValue;
use serde_json::Value;

use super::{answers, first_non_ws, usage_asked, Head, Model, Spans};

/// The head and the prompt's place, or `None` when the body needs the
/// general path (or is malformed, which that path reports).
pub(super) fn head(bytes: &[u8]) -> Option<(Head, Spans)> {
    // A struct also reads from a JSON array; only an object will do.
    if first_non_ws(bytes, 0).map(|i| bytes[i]) != Some(b'{') {
        return None;
    }
    // JSON is UTF-8: skipped members are not decoded, so check it here
    // (the general path's values are, and it rejects the body).
    let text = std::str::from_utf8(bytes).ok()?;
    scanned(text).or_else(|| by_serde(text))
}

/// The members as the one-pass scan reads them.
fn scanned(text: &str) -> Option<(Head, Spans)> {
    head_from(&sse::quick_request_head(text.as_bytes())?, None, text)
}

/// The members read by serde into a small struct (the members as
/// [`head`] reads them).
fn by_serde(text: &str) -> Option<(Head, Spans)> {
    // Fails on duplicate keys and on a `model` or `stream` of another
    // type; the general path then decides as it always did.
    let w: Wire<'_> = serde_json::from_str(text).ok()?;
    // A borrowed member's place in the body.
    let at = |r: Option<&RawValue>| r.map(|r| (r.get().as_ptr() as usize - text.as_ptr() as usize, r.get().len()));
    let members = sse::RequestHead {
        model: w.model.as_deref(),
        stream: w.stream,
        priority: w.priority,
        cache_salt: w.cache_salt,
        max_tokens: w.max_tokens,
        max_completion_tokens: w.max_completion_tokens,
        max_output_tokens: w.max_output_tokens,
        n: w.n,
        best_of: w.best_of,
        messages: at(w.messages),
        prompt: at(w.prompt),
        input: at(w.input),
        instructions: at(w.instructions),
        prompt_cache_key: at(w.prompt_cache_key),
        metadata: at(w.metadata),
        previous_response_id: w.previous_response_id.as_deref(),
    };
    head_from(&members, w.stream_options.as_ref(), text)
}

/// The head and the prompt's place from the members either reading found
/// (`stream_options` as serde read it: the scan leaves a body with one to serde).
fn head_from(w: &sse::RequestHead<'_>, stream_options: Option<&Value>, text: &str) -> Option<(Head, Spans)> {
    let spans = Spans {
        instructions: w.instructions,
        prompt: w.messages.or(w.prompt).or(w.input),
        cache_key: w.prompt_cache_key,
        metadata: w.metadata,
    };
    let prompt = w.prompt.and_then(|(at, len)| text.get(at..at + len));
    let head = Head {
        model: Model::Name(w.model?.to_owned()),
        stream: w.stream == Some(true),
        include_usage: usage_asked(stream_options),
        has_stream_options: stream_options.is_some(),
        has_priority: w.priority,
        has_cache_salt: w.cache_salt,
        max_output: w.max_completion_tokens.or(w.max_tokens),
        max_output_tokens: w.max_output_tokens,
        answers: answers_raw(w.n, w.best_of, prompt)?,
        previous_response_id: w.previous_response_id.map(str::to_owned),
    };
    Some((head, spans))
}

/// Only the routed-on members; the rest is checked and skipped.
#[derive(Deserialize)]
struct Wire<'a> {
    #[serde(borrow)]
    model: Option<Cow<'a, str>>,
    stream: Option<bool>,
    #[serde(default, deserialize_with = "present_value")]
    stream_options: Option<Value>,
    #[serde(default, deserialize_with = "present")]
    priority: bool,
    #[serde(default, deserialize_with = "present")]
    cache_salt: bool,
    #[serde(default, deserialize_with = "count")]
    max_tokens: Option<u64>,
    #[serde(default, deserialize_with = "count")]
    max_completion_tokens: Option<u64>,
    #[serde(default, deserialize_with = "count")]
    max_output_tokens: Option<u64>,
    #[serde(default, deserialize_with = "count")]
    n: Option<u64>,
    #[serde(default, deserialize_with = "count")]
    best_of: Option<u64>,
    // The prompt, borrowed as written (checked, not built into values).
    #[serde(default, borrow)]
    messages: Option<&'a RawValue>,
    #[serde(default, borrow)]
    prompt: Option<&'a RawValue>,
    #[serde(default, borrow)]
    input: Option<&'a RawValue>,
    #[serde(default, borrow)]
    instructions: Option<&'a RawValue>,
    #[serde(default, borrow)]
    prompt_cache_key: Option<&'a RawValue>,
    #[serde(default, borrow)]
    metadata: Option<&'a RawValue>,
    #[serde(default, borrow)]
    previous_response_id: Option<Cow<'a, str>>,
}

/// A token count; anything else (the replica judges it) as absent.
fn count<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    Value::deserialize(d).map(|v| v.as_u64())
}

/// [`answers`] of a prompt as written (the quick path's borrowed member).
fn answers_raw(n: Option<u64>, best_of: Option<u64>, prompt: Option<&str>) -> Option<u64> {
    let Some(raw) = prompt.filter(|r| r.starts_with('[')) else { return Some(answers(n, best_of, None)) };
    let items: Vec<&RawValue> = serde_json::from_str(raw).ok()?;
    let listed = items.first().is_some_and(|f| f.get().starts_with('"') || f.get().starts_with('['));
    let each = n.unwrap_or(1).max(best_of.unwrap_or(1)).max(1);
    Some(if listed { each.saturating_mul(items.len() as u64) } else { each })
}

/// `Some` for any value, `null` included (unlike `Option`'s own rule).
fn present_value<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Value>, D::Error> {
    Value::deserialize(d).map(Some)
}

fn present<'de, D: Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
    IgnoredAny::deserialize(d).map(|_| true)
}

/// The request-body reader's promise, checked on any input (the proptest
/// and the fuzz target): the quick path reads the same head and writes the
/// same request as the general path, or both reject the body.
#[cfg(any(test, feature = "fuzzing"))]
pub(crate) fn paths_agree(bytes: &[u8], usage: bool, priority: Option<i64>) -> Result<(), String> {
    use super::{head_of, parse_object, RequestBody};
    use bytes::Bytes;
    let salt = priority.filter(|p| *p == 1).map(|_| "slogate-salt");
    let bytes = Bytes::copy_from_slice(bytes);
    let text = || String::from_utf8_lossy(&bytes).into_owned();
    let Ok(quick) = RequestBody::parse(bytes.clone()) else {
        return match parse_object(&bytes) {
            Err(_) => Ok(()),
            Ok(_) => Err(format!("the quick path rejected what the general path reads: {}", text())),
        };
    };
    let object = parse_object(&bytes).map_err(|_| format!("the general path rejects what the quick path read: {}", text()))?;
    if quick.head() != &head_of(&object) {
        return Err(format!("heads differ: {:?} vs {:?}: {}", quick.head(), head_of(&object), text()));
    }
    let written = |b: RequestBody| -> Result<Value, String> {
        let out = b.into_bytes(usage, priority, salt, None).map_err(|e| format!("cannot write: {e}"))?;
        serde_json::from_slice(&out).map_err(|e| format!("wrote invalid JSON ({e}): {}", String::from_utf8_lossy(&out)))
    };
    let q = written(quick)?;
    let mut general = RequestBody::parse(bytes.clone()).map_err(|e| e.to_string())?;
    general.object().map_err(|e| e.to_string())?;
    let g = written(general)?;
    if q != g {
        return Err(format!("the paths write different requests: {q} vs {g}: {}", text()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{by_serde, scanned};

    /// The scan reads what serde's struct reads, or leaves the body to it.
    #[test]
    fn the_scan_reads_the_head_serde_reads_or_leaves_the_body_to_it() {
        let read = [
            r#"{"model": "m1", "prompt": "Once upon a time", "max_tokens": 64}"#,
            r#"{"model":"m","messages":[{"role":"user","content":"hi \"you\""}],"stream":true,"max_completion_tokens":7,"max_tokens":9}"#,
            r#" { "model" : "m" , "input" : ["a", "b"] , "n" : 2 , "best_of" : 3 } "#,
            r#"{"model":"m","prompt":[[1,2],[3]],"n":null,"max_tokens":"12","priority":null,"cache_salt":{"a":[1]}}"#,
            r#"{"model":"m","prompt":[1,2,3],"stream":null,"previous_response_id":"resp_1","instructions":"be brief"}"#,
            r#"{"model":"m","messages":[],"prompt_cache_key":"k","metadata":{"user_id":"u"},"other":[true,false,null,-1.5e3],"other":0}"#,
            r#"{"model":"m","max_output_tokens":18446744073709551,"temperature":0.2}"#,
        ];
        for body in read {
            let (scan, serde) = (scanned(body), by_serde(body));
            assert!(scan.is_some(), "the scan reads {body}");
            assert_eq!(scan, serde, "{body}");
        }
        // Left to serde (which reads some of them) or to the general path.
        let left = [
            r#"{"model":"m","stream":true,"stream_options":{"include_usage":true}}"#,
            r#"{"mod\u0065l":"m"}"#,
            r#"{"model":"m\u00e9"}"#,
            r#"{"model":"m","model":"n"}"#,
            r#"{"model":"m","max_tokens":-1}"#,
            r#"{"model":"m","max_tokens":1.0}"#,
            r#"{"model":"m","max_tokens":99999999999999999999}"#,
            r#"{"model":"m","stream":"yes"}"#,
            r#"{"model":7}"#,
            r#"{"model":null}"#,
            r#"{"prompt":"p"}"#,
            r#"{"model":"m"} x"#,
            r#"{"model":"m","prompt":[1,]}"#,
        ];
        for body in left {
            assert_eq!(scanned(body), None, "left to serde: {body}");
        }
        assert!(by_serde(left[0]).is_some_and(|(h, _)| h.include_usage));
        assert!(by_serde(left[1]).is_some_and(|(h, _)| h.model == super::Model::Name("m".into())));
    }
}
