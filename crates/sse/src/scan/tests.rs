//! The quick reading against the full one.

use super::*;
use crate::text::Str;
use crate::NonEmpty;
use proptest::prelude::*;

/// Chunks as vLLM, SGLang and OpenAI send them (and the simulator's,
/// with its stamps), each one the quick reading takes.
const TAKEN: &[&str] = &[
    r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1764456789,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}"#,
    r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1764456789,"model":"m","choices":[{"index":0,"delta":{"content":" gateway"},"logprobs":null,"finish_reason":null}],"sim_rx_ns":1764456789123456789,"sim_t_ns":1764456789133456789}"#,
    r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":""},"logprobs":null,"finish_reason":"length","stop_reason":null}]}"#,
    r#"{"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":" the","logprobs":null,"finish_reason":null,"stop_reason":null}]}"#,
    r#"{"id":"c","choices":[{"index":0,"delta":{"content":"y \"you\"\n\u00e9 é"}}]}"#,
    r#"{"id":"c","choices":[{"index":0,"delta":{"reasoning_content":"hmm","content":null}}]}"#,
    r#"{"id":"c","choices":[{"index":0,"delta":{"reasoning":"","content":"a"}}]}"#,
    r#"{"id":"c","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"f","arguments":""}}]}}]}"#,
    r#"{"id":"c","choices":[{"index":0,"delta":{"tool_calls":[]}},{"index":1,"delta":{"content":"b"}}]}"#,
    r#"{"id":"c","choices":[{"index":1,"text":"b"},{"index":0,"text":"a","finish_reason":"stop"}]}"#,
    r#" { "choices" : [ { "delta" : { } , "finish_reason" : "stop" } ] , "x" : [ 1.5e-3 , -0 , true , false , null , { } , [ ] ] } "#,
    r#"{"choices":null,"object":"error","x":{"y":[{"z":"\/\b\f\r\t\\"}]}}"#,
    r#"{}"#,
    r#"{"choices":[]}"#,
];

/// Chunks the quick reading leaves to the full one.
const LEFT: &[&str] = &[
    r#"{"choices":[],"usage":{"prompt_tokens":4,"completion_tokens":3}}"#,
    r#"{"error":{"message":"boom"}}"#,
    r#"{"type":"response.output_text.delta","delta":"Hel"}"#,
    r#"{"choices":[{"index":0,"delta":{"content":"a"}}],"choices":[]}"#,
    r#"{"choices":[{"index":0,"index":0,"text":"a"}]}"#,
    r#"{"cho\u0069ces":[{"text":"a"}]}"#,
    r#"{"choices":[{"index":0,"delta":{"content":"\ud83d\ude00"}}]}"#,
    r#"{"choices":[{"index":-1,"text":"a"}]}"#,
    r#"{"choices":[{"index":0.0,"text":"a"}]}"#,
    r#"{"choices":[{"index":0,"delta":{"content":7}}]}"#,
    r#"{"choices":[["a"]]}"#,
    r#"[{"choices":[]}]"#,
    r#"{"choices":[{"index":0,"text":"a"}]} x"#,
    r#"{"choices":[{"index":0,"text":"a\u12"}]}"#,
    "{\"choices\":[{\"index\":0,\"text\":\"a\u{1}\"}]}",
    r#"{"x":01}"#,
    r#"[DONE]"#,
    "",
];

/// The quick reading, where it answers, is the full one's: for
/// `analyze` and for `analyze_text`.
fn agrees(data: &[u8]) -> bool {
    let trimmed = data.trim_ascii();
    let Some(q) = quick(trimmed) else { return false };
    let (info, _, _) = crate::read::<NonEmpty>(data);
    assert_eq!(q.info, info, "{:?}", String::from_utf8_lossy(data));
    let (info, text, other) = crate::read::<Str<'_>>(data);
    assert_eq!(q.info, info, "{:?}", String::from_utf8_lossy(data));
    assert_eq!(q.other, other, "{:?}", String::from_utf8_lossy(data));
    assert_eq!(q.text.is_some(), text.is_some(), "{:?}", String::from_utf8_lossy(data));
    if let (Some(span), Some(t)) = (q.text, text) {
        if !span.escaped {
            assert_eq!(&trimmed[span.start..span.end], t.0.as_bytes());
        }
    }
    true
}

#[test]
fn common_chunks_are_read_quickly_and_as_the_full_reading_does() {
    for c in TAKEN {
        assert!(agrees(c.as_bytes()), "not read quickly: {c}");
    }
    for c in LEFT {
        assert!(quick(c.as_bytes().trim_ascii()).is_none(), "read quickly: {c}");
    }
}

/// Every chunk above with one byte removed, or replaced by a byte that
/// matters to JSON: the quick reading answers as the full one or not at all.
#[test]
fn a_damaged_chunk_is_read_as_the_full_reading_does_or_left_to_it() {
    let samples: Vec<&str> = TAKEN.iter().chain(LEFT).copied().collect();
    let (taken, left) = damaged(&samples, agrees);
    assert!(taken > 1000 && left > 1000, "both readings exercised: {taken} quick, {left} full");
}

/// Every sample with one byte removed, or replaced by a byte that matters
/// to JSON, given to `agrees`: how many it read quickly, how many it left.
pub(super) fn damaged(samples: &[&str], agrees: fn(&[u8]) -> bool) -> (usize, usize) {
    let bytes: &[u8] = b"\"\\{}[],:0-1.eEnu tfx\x01\xff";
    let (mut taken, mut left) = (0, 0);
    for s in samples {
        let s = s.as_bytes();
        for i in 0..s.len() {
            let mut d = s.to_vec();
            d.remove(i);
            let mut variants = vec![d];
            for &b in bytes {
                let mut r = s.to_vec();
                r[i] = b;
                variants.push(r);
            }
            for v in variants {
                if agrees(&v) {
                    taken += 1;
                } else {
                    left += 1;
                }
            }
        }
    }
    (taken, left)
}

/// A JSON object of any shape, its keys those a chunk has and a few others.
fn chunk() -> impl Strategy<Value = String> {
    prop::collection::vec((key(), value()), 0..5).prop_map(|m| object(&m))
}

pub(super) fn object(members: &[(&str, String)]) -> String {
    format!("{{{}}}", members.iter().map(|(k, v)| format!("\"{k}\":{v}")).collect::<Vec<_>>().join(","))
}

fn key() -> impl Strategy<Value = &'static str> + Clone {
    prop_oneof![
        Just("choices"),
        Just("index"),
        Just("delta"),
        Just("text"),
        Just("content"),
        Just("finish_reason"),
        Just("tool_calls"),
        Just("reasoning"),
        Just("reasoning_content"),
        Just("object"),
        Just("id"),
        Just("usage"),
    ]
}

/// A JSON value of any shape.
pub(super) fn value() -> impl Strategy<Value = String> {
    let leaf = prop_oneof![
        Just("null".to_string()),
        Just("true".to_string()),
        Just("0".to_string()),
        Just("-1.5e3".to_string()),
        Just("12".to_string()),
        "[a-z \\\\\"é\u{1}]{0,6}".prop_map(|s| serde_json::to_string(&s).unwrap_or_default()),
        Just(r#""\ud800""#.to_string()),
    ];
    nested(leaf, key())
}

/// Arrays and objects of `leaf` values, nested up to four deep, their keys `key`.
pub(super) fn nested(
    leaf: impl Strategy<Value = String> + 'static,
    key: impl Strategy<Value = &'static str> + Clone + 'static,
) -> impl Strategy<Value = String> {
    leaf.prop_recursive(4, 32, 4, move |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(|v| format!("[{}]", v.join(","))),
            prop::collection::vec((key.clone(), inner), 0..5).prop_map(|m| object(&m)),
        ]
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    /// Generated chunks: the quick reading answers as the full one or not at all.
    #[test]
    fn a_generated_chunk_is_read_as_the_full_reading_does_or_left_to_it(v in chunk()) {
        agrees(v.as_bytes());
    }
}

/// A plain run ends where a byte-by-byte reading ends it, whatever its
/// length (the word steps, the search for long runs, the short tail) and
/// wherever the quote, backslash or control character falls.
#[test]
fn a_plain_run_ends_at_the_first_quote_backslash_or_control_character() {
    let by_byte = |b: &[u8], i: usize| i + b[i..].iter().take_while(|&&c| c != b'"' && c != b'\\' && c >= 0x20).count();
    for len in 0..80 {
        for start in [0, 1, 7] {
            let plain: Vec<u8> = (0..start + len).map(|k| b"token \xc3\xa9x"[k % 9]).collect();
            assert_eq!(plain_run(&plain, start), start + len, "no end in {len} bytes from {start}");
            for at in start..start + len {
                for end in [b'"', b'\\', b'\n', 0x1f, 0] {
                    let mut b = plain.clone();
                    b[at] = end;
                    // A second one later does not move the first.
                    if at + 3 < b.len() {
                        b[at + 3] = b'"';
                    }
                    assert_eq!(plain_run(&b, start), by_byte(&b, start), "{end:#x} at {at} of {len} from {start}");
                }
            }
        }
    }
}
