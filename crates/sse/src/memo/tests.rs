//! The memo against the two readings it stands in for.

use super::*;
use proptest::prelude::*;

/// One chunk through a memo (for `analyze`) and a second one (for
/// `analyze_text`), each held to the reading it stands in for.
fn same(m: &mut Memo, mt: &mut Memo, data: &[u8]) {
    assert_eq!(m.analyze(data), crate::analyze(data), "{:?}", String::from_utf8_lossy(data));
    let (mut a, mut b) = (String::from("<"), String::from("<"));
    assert_eq!(mt.analyze_text(data, &mut a), crate::analyze_text(data, &mut b), "{:?}", String::from_utf8_lossy(data));
    assert_eq!(a, b, "{:?}", String::from_utf8_lossy(data));
}

/// Chunk shapes as replicas write them: `{t}` the text (JSON-escaped),
/// `{n}` a number that changes from chunk to chunk.
const SHAPES: &[&str] = &[
    // vLLM, chat
    r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1764456789,"model":"m","choices":[{"index":0,"delta":{"content":"{t}"},"logprobs":null,"finish_reason":null}]}"#,
    // the simulator, stamped
    r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1764456789,"model":"m","choices":[{"index":0,"delta":{"content":"{t}"},"logprobs":null,"finish_reason":null}],"sim_rx_ns":1764456789123456789,"sim_t_ns":{n}}"#,
    // completions
    r#"{"id":"cmpl-1","object":"text_completion","created":{n},"model":"m","choices":[{"index":0,"text":"{t}","logprobs":null,"finish_reason":null,"stop_reason":null}]}"#,
    // SGLang: nulls for what a chunk does not carry
    r#"{"id":"x","object":"chat.completion.chunk","created":{n},"model":"m","choices":[{"index":0,"delta":{"role":null,"content":"{t}","reasoning_content":null,"tool_calls":null},"logprobs":null,"finish_reason":null,"matched_stop":null}],"usage":null}"#,
    // text and a finish in one chunk; reasoning beside it; a second choice
    r#"{"choices":[{"index":0,"delta":{"content":"{t}"},"finish_reason":"length"}],"n":{n}}"#,
    r#"{"choices":[{"index":0,"delta":{"reasoning_content":"r","content":"{t}"}}],"n":{n}}"#,
    r#"{"choices":[{"index":0,"text":"{t}"},{"index":1,"text":"b"}],"n":{n}}"#,
    r#" {"n" : {n} , "choices" : [ { "delta" : { "content" : "{t}" } } ] } "#,
];

/// Texts a stream carries (raw; escaped when put in a chunk), and a few
/// written by hand with escapes the encoder does not choose.
const TEXTS: &[&str] = &[" the", "\n", "y \"you\"", "é", "😀", "\\", "", "a\tb", " gateway", "\u{1}"];
const RAW_TEXTS: &[&str] = &[r"\u00e9", r"\/", r"\ud83d\ude00", r"\u12", "\u{1}", r"\x", "a\"b"];

fn chunk(shape: &str, text: &str, n: u64) -> String {
    shape.replace("{t}", text).replace("{n}", &n.to_string())
}

fn escaped(text: &str) -> String {
    let quoted = serde_json::to_string(text).unwrap_or_default();
    quoted[1..quoted.len() - 1].to_string()
}

#[test]
fn a_streams_chunks_are_read_by_the_last_as_the_readings_read_them() {
    for shape in SHAPES {
        let (mut m, mut mt) = (Memo::new(), Memo::new());
        let mut n = 1_764_456_789_000_000_000u64;
        let texts = TEXTS.iter().map(|t| escaped(t)).chain(RAW_TEXTS.iter().map(|t| t.to_string()));
        for text in texts.clone().chain(texts) {
            n += 9_876_543;
            same(&mut m, &mut mt, chunk(shape, &text, n).as_bytes());
            // Between them, what else a stream sends.
            if n % 3 == 0 {
                for other in [&b"[DONE]"[..], br#"{"choices":[],"usage":{"prompt_tokens":4,"completion_tokens":3}}"#] {
                    same(&mut m, &mut mt, other);
                }
            }
        }
        // Most chunks with text were read by the one before.
        assert!(m.hits >= 16 && mt.hits >= 16, "{shape}: {} and {} of 34 read by the memo", m.hits, mt.hits);
    }
}

/// After a chunk of each shape, every other chunk of the shape with one
/// byte removed, or replaced by a byte that matters to JSON: read as the
/// readings read it, by the memo or not.
#[test]
fn a_damaged_chunk_is_read_as_the_readings_read_it() {
    let bytes: &[u8] = b"\"\\{}[],:0-1.eEnu tfx\x01\xff";
    let (mut hits, mut tried) = (0, 0);
    for shape in SHAPES {
        let first = chunk(shape, "first", 17);
        let next = chunk(shape, &escaped("next \"one\""), 1_234_567);
        let next = next.as_bytes();
        for i in 0..next.len() {
            let mut variants = vec![[&next[..i], &next[i + 1..]].concat()];
            for &b in bytes {
                let mut r = next.to_vec();
                r[i] = b;
                variants.push(r);
            }
            for v in variants {
                let (mut m, mut mt) = (Memo::new(), Memo::new());
                same(&mut m, &mut mt, first.as_bytes());
                same(&mut m, &mut mt, &v);
                hits += m.hits;
                tried += 1;
            }
        }
    }
    assert!(hits > 1000 && tried - hits > 1000, "both ways exercised: {hits} of {tried} by the memo");
}

/// A chunk of a generated shape: members around a choice, each written
/// with or without spaces, with its text and numbers left to fill.
fn shape() -> impl Strategy<Value = String> {
    let member = prop_oneof![
        Just(r#""id":"c""#.to_string()),
        Just(r#""created":{n}"#.to_string()),
        Just(r#""x":-{n}.5e1"#.to_string()),
        Just(r#""usage":null"#.to_string()),
        Just(r#""error":null"#.to_string()),
        Just(r#""object":"error""#.to_string()),
        Just(r#""y":[{n},"{n}",{"z":{n}}]"#.to_string()),
        Just(r#""index":{n}"#.to_string()),
    ];
    let choice = prop_oneof![
        Just(r#"{"index":0,"delta":{"content":"{t}"}}"#),
        Just(r#"{"index":{n},"delta":{"content":"{t}"}}"#),
        Just(r#"{"text":"{t}","finish_reason":"stop"}"#),
        Just(r#"{"delta":{"content":"","tool_calls":[{}]},"text":"{t}"}"#),
        Just(r#"{"delta":{"content":"{t}"},"delta":{}}"#),
    ];
    (prop::collection::vec(member, 0..4), choice, any::<bool>()).prop_map(|(members, choice, spaced)| {
        let mut all = members;
        all.insert(all.len() / 2, format!(r#""choices":[{choice}]"#));
        let sep = if spaced { " , " } else { "," };
        format!("{{{}}}", all.join(sep))
    })
}

fn text() -> impl Strategy<Value = String> {
    prop_oneof!["[a-z \\\\\"é\u{1}]{0,6}".prop_map(|s| escaped(&s)), "[a-z\\\\\"/u0-9]{0,6}", Just(r"\ud800".to_string()),]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1000))]

    /// Two chunks of a generated shape, the second with other text and
    /// numbers: read as the readings read them.
    #[test]
    fn a_generated_stream_is_read_as_the_readings_read_it(
        shape in shape(),
        texts in prop::collection::vec(text(), 2..4),
        numbers in prop::collection::vec(0u64..20, 2..4),
    ) {
        let (mut m, mut mt) = (Memo::new(), Memo::new());
        for (t, n) in texts.iter().zip(&numbers) {
            same(&mut m, &mut mt, chunk(&shape, t, *n).as_bytes());
        }
    }
}
