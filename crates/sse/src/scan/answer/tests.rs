//! The quick readings of a complete answer and of its usage against the full ones.

use super::*;
use crate::answer::full_answer;
use crate::scan::tests::{damaged, nested, object, value};
use proptest::prelude::*;

/// Usage objects as vLLM, SGLang and OpenAI's APIs write them, each one
/// the quick reading takes.
const USAGE_TAKEN: &[&str] = &[
    r#"{"prompt_tokens":12,"total_tokens":12,"completion_tokens":0,"prompt_tokens_details":null}"#,
    r#"{"prompt_tokens":12,"total_tokens":76,"completion_tokens":64,"prompt_tokens_details":{"cached_tokens":8}}"#,
    r#"{"input_tokens":5,"input_tokens_details":{"cached_tokens":0},"output_tokens":9,"output_tokens_details":{"reasoning_tokens":3},"total_tokens":14}"#,
    r#"{"prompt_tokens":3,"prompt_tokens_details":{"audio_tokens":1,"cached_tokens":2,"cached_tokens":1}}"#,
    r#" { "completion_tokens" : 1 , "x" : [ 1.5e-3 , "é" , { } ] } "#,
    r#"{}"#,
];

/// Usage objects the quick reading leaves to the full one.
const USAGE_LEFT: &[&str] = &[
    r#"{"prompt_tokens":1,"input_tokens":2}"#,
    r#"{"prompt_tokens":1,"prompt_tokens":1}"#,
    r#"{"prompt_tokens":-1}"#,
    r#"{"prompt_tokens":1.0}"#,
    r#"{"prompt_tokens":null}"#,
    r#"{"prompt_tokens":"1"}"#,
    r#"{"prompt_tokens":99999999999999999999}"#,
    r#"{"prompt_tokens_details":{"cached_tokens":null}}"#,
    r#"{"prompt_tokens_details":7}"#,
    r#"{"prompt_\u0074okens":1}"#,
    r#"{"prompt_tokens":1}}"#,
    r#"[1,2,0]"#,
    r#"{"x":01}"#,
    "",
];

/// Whole answers as vLLM, SGLang and OpenAI's APIs write them, each one
/// the quick reading takes.
const ANSWER_TAKEN: &[&str] = &[
    r#"{"id":"cmpl-1","object":"text_completion","created":1,"model":"m1","choices":[{"index":0,"text":"token token","logprobs":null,"finish_reason":"length","stop_reason":null}],"usage":{"prompt_tokens":12,"total_tokens":76,"completion_tokens":64,"prompt_tokens_details":null}}"#,
    r#"{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"Hi \"there\"\n","refusal":null,"tool_calls":[],"reasoning_content":null},"logprobs":null,"finish_reason":"stop","stop_reason":null}],"usage":{"prompt_tokens":9,"total_tokens":12,"completion_tokens":3,"prompt_tokens_details":{"cached_tokens":4}},"prompt_logprobs":null,"kv_transfer_params":null}"#,
    r#"{"id":"embd-1","object":"list","created":1,"model":"m1","data":[{"index":0,"object":"embedding","embedding":[0.011,-0.05,1e-3]}],"usage":{"prompt_tokens":12,"total_tokens":12,"completion_tokens":0,"prompt_tokens_details":null}}"#,
    r#"{"choices":[{"finish_reason":null,"text":"a"},{"finish_reason":"length","message":null},{"finish_reason":"stop"}],"usage":{}}"#,
    r#"{"id":"resp_1","object":"response","status":"incomplete","output":[{"type":"message","content":[{"type":"output_text","text":"Hi"}]}],"usage":{"input_tokens":3,"output_tokens":2,"total_tokens":5}}"#,
    r#"{"status":null,"choices":[],"usage":{"prompt_tokens":1}}"#,
    r#" { "usage" : { } } "#,
];

/// Whole answers the quick reading leaves to the full one.
const ANSWER_LEFT: &[&str] = &[
    r#"{"choices":[{"index":0,"text":"no usage reported","finish_reason":"stop"}]}"#,
    r#"{"choices":[{"message":{"content":"é"}}],"usage":null}"#,
    r#"{"usage":{},"usage":{}}"#,
    r#"{"usage":{},"choices":[],"choices":[]}"#,
    r#"{"usage":{},"choices":null}"#,
    r#"{"usage":{},"choices":[{"finish_reason":"st\u006fp"}]}"#,
    r#"{"usage":{},"choices":[{"finish_reason":1}]}"#,
    r#"{"usage":{},"choices":[{"finish_reason":"stop","finish_reason":"stop"}]}"#,
    r#"{"usage":{},"choices":[{"message":{"content":"a","content":"b"}}]}"#,
    r#"{"usage":{},"choices":[{"message":"a"}]}"#,
    r#"{"usage":{},"choices":[{"message":["a"]}]}"#,
    r#"{"usage":{},"choices":[{"text":"a","text":"a"}]}"#,
    r#"{"usage":{},"choices":[["stop"]]}"#,
    r#"{"usage":{},"status":"fa\u0069led"}"#,
    r#"{"usage":{},"status":1}"#,
    r#"{"usage":7}"#,
    r#"{"usage":{}} x"#,
    r#"{"usage":{},"x":"\ud800"}"#,
    r#"[{"usage":{}}]"#,
    "",
];

/// The quick reading of a usage object, where it answers, is the full one's.
fn usage_agrees(data: &[u8]) -> bool {
    let Some(q) = quick_usage(data) else { return false };
    assert_eq!(Some(q), crate::from_json::<Usage>(data).ok(), "{:?}", String::from_utf8_lossy(data));
    true
}

/// The quick reading of an answer, where it answers, is the full one's.
fn answer_agrees(data: &[u8]) -> bool {
    let Some(q) = quick_answer(data) else { return false };
    assert_eq!(Some(q), full_answer(data), "{:?}", String::from_utf8_lossy(data));
    true
}

#[test]
fn common_usage_is_read_quickly_and_as_the_full_reading_does() {
    for u in USAGE_TAKEN {
        assert!(usage_agrees(u.as_bytes()), "not read quickly: {u}");
    }
    assert_eq!(quick_usage(USAGE_TAKEN[1].as_bytes()), Some(Usage { prompt_tokens: 12, completion_tokens: 64, cached_tokens: 8 }));
    assert_eq!(quick_usage(USAGE_TAKEN[2].as_bytes()), Some(Usage { prompt_tokens: 5, completion_tokens: 9, cached_tokens: 0 }));
    for u in USAGE_LEFT {
        assert!(quick_usage(u.as_bytes()).is_none(), "read quickly: {u}");
        // What is left is read the full way, as before.
        assert_eq!(crate::read_usage(u.as_bytes()), crate::from_json::<Usage>(u.as_bytes()).ok(), "{u}");
    }
}

#[test]
fn common_answers_are_read_quickly_and_as_the_full_reading_does() {
    for a in ANSWER_TAKEN {
        assert!(answer_agrees(a.as_bytes()), "not read quickly: {a}");
    }
    let mixed = quick_answer(ANSWER_TAKEN[3].as_bytes());
    assert_eq!(mixed.as_ref().map(|a| (a.length, a.finish_reason.as_deref())), Some((true, Some("length"))));
    let chat = quick_answer(ANSWER_TAKEN[1].as_bytes()).and_then(|a| a.usage);
    assert_eq!(chat, Some(Usage { prompt_tokens: 9, completion_tokens: 3, cached_tokens: 4 }));
    for a in ANSWER_LEFT {
        assert!(quick_answer(a.as_bytes()).is_none(), "read quickly: {a}");
        assert_eq!(crate::read_answer(a.as_bytes()), full_answer(a.as_bytes()), "{a}");
    }
    // Without usage, the text is counted (the full reading's work).
    assert_eq!(crate::read_answer(ANSWER_LEFT[1].as_bytes()).map(|a| a.chars), Some(1));
}

#[test]
fn a_damaged_usage_or_answer_is_read_as_the_full_reading_does_or_left_to_it() {
    let samples: Vec<&str> = USAGE_TAKEN.iter().chain(USAGE_LEFT).copied().collect();
    let (taken, left) = damaged(&samples, usage_agrees);
    assert!(taken > 1000 && left > 1000, "usage, both readings exercised: {taken} quick, {left} full");
    let samples: Vec<&str> = ANSWER_TAKEN.iter().chain(ANSWER_LEFT).copied().collect();
    let (taken, left) = damaged(&samples, answer_agrees);
    assert!(taken > 1000 && left > 1000, "answers, both readings exercised: {taken} quick, {left} full");
}

fn answer_key() -> impl Strategy<Value = &'static str> + Clone {
    prop_oneof![
        Just("prompt_tokens"),
        Just("input_tokens"),
        Just("completion_tokens"),
        Just("output_tokens"),
        Just("prompt_tokens_details"),
        Just("input_tokens_details"),
        Just("cached_tokens"),
        Just("usage"),
        Just("choices"),
        Just("finish_reason"),
        Just("message"),
        Just("content"),
        Just("text"),
        Just("status"),
        Just("x"),
    ]
}

/// A JSON value of any shape, its keys those of an answer and its usage.
fn answer_value() -> impl Strategy<Value = String> {
    let leaf = prop_oneof![
        (0u64..1000).prop_map(|n| n.to_string()),
        Just("18446744073709551616".to_string()),
        Just(r#""length""#.to_string()),
        Just(r#""failed""#.to_string()),
        value(),
    ];
    nested(leaf, answer_key())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    /// Generated usage objects and answers: the quick reading answers as
    /// the full one or not at all.
    #[test]
    fn a_generated_usage_or_answer_is_read_as_the_full_reading_does_or_left_to_it(
        mut m in prop::collection::vec((answer_key(), answer_value()), 0..5),
        usage in prop::collection::vec((answer_key(), answer_value()), 0..4),
        at in 0usize..6,
    ) {
        let v = object(&m);
        usage_agrees(v.as_bytes());
        answer_agrees(v.as_bytes());
        // Most answers the quick reading takes report usage: one does here.
        m.insert(at.min(m.len()), ("usage", object(&usage)));
        answer_agrees(object(&m).as_bytes());
    }
}
