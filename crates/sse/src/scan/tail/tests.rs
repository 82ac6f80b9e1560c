//! The tail reading of an answer against the full one.

use super::*;
use crate::answer::full_answer;
use crate::scan::tests::{nested, object};
use crate::Usage;
use proptest::prelude::*;

/// Answers as vLLM and OpenAI's API write them: read from the tail, as the full reading reads them.
const TAKEN: &[&str] = &[
    r#"{"id":"cmpl-1","object":"text_completion","created":1,"model":"m1","choices":[{"index":0,"text":"token token","logprobs":null,"finish_reason":"length","stop_reason":null}],"usage":{"prompt_tokens":12,"total_tokens":76,"completion_tokens":64,"prompt_tokens_details":null}}"#,
    r#"{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"Hi \"there\"\n","refusal":null,"tool_calls":[],"reasoning_content":null},"logprobs":null,"finish_reason":"stop","stop_reason":null}],"usage":{"prompt_tokens":9,"total_tokens":12,"completion_tokens":3,"prompt_tokens_details":{"cached_tokens":4}},"prompt_logprobs":null,"prompt_token_ids":null,"kv_transfer_params":null}"#,
    r#"{"choices":[{"finish_reason":null,"text":"a"},{"finish_reason":"length","message":null},{"finish_reason":"stop"}],"usage":{}}"#,
    r#"{"choices":[{"message":{"content":"{\"finish_reason\":\"length\",\"usage\":{\"prompt_tokens\":99}}"},"finish_reason":"tool_calls"}],"usage":{"prompt_tokens":1}}"#,
    r#" { "choices" : [ { "finish_reason" : "stop" } ] , "usage" : { "completion_tokens" : 2 } , "x" : [ 1 , { "y" : "}" } ] } "#,
];

/// Answers the tail reading leaves to the full one.
const LEFT: &[&str] = &[
    r#"{"choices":[{"text":"no usage reported","finish_reason":"stop"}]}"#,
    r#"{"choices":[{"finish_reason":"stop"}],"usage":null}"#,
    r#"{"choices":[{"finish_reason":"stop"}],"x":{"usage":{"prompt_tokens":1}}}"#,
    r#"{"choices":[{"finish_reason":"stop"}],"usage":{"prompt_tokens":1}} x"#,
    r#"{"choices":[{"finish_reason":"stop"}],"usage":{"prompt_tokens":1},"x"}"#,
    r#"{"choices":[{"finish_reason":"stop"}],"usage":{"prompt_tokens":1.0}}"#,
    r#"{"choices":[{"finish_reason":"st\u006fp"}],"usage":{}}"#,
    r#"{"choices":[{"finish_reason":1}],"usage":{}}"#,
    r#"{"choices":[{"text":"\"finish_reason\":\"stop\""}],"usage":{}}"#,
    r#"{"choices":[],"usage":{}}"#,
    r#"[{"usage":{}}]"#,
    "",
];

#[test]
fn an_answer_as_replicas_write_it_is_read_from_its_tail_as_the_full_reading_reads_it() {
    for a in TAKEN {
        let tail = tail_answer(a.as_bytes(), true);
        assert!(tail.is_some(), "not read from the tail: {a}");
        assert_eq!(tail, full_answer(a.as_bytes()), "{a}");
    }
    // A finish reason and a usage inside a string (a tool call's arguments) are not read.
    let tool = tail_answer(TAKEN[3].as_bytes(), true).expect("read");
    assert_eq!((tool.finish_reason.as_deref(), tool.length), (Some("tool_calls"), false));
    assert_eq!(tool.usage, Some(Usage { prompt_tokens: 1, completion_tokens: 0, cached_tokens: 0 }));
    let mixed = tail_answer(TAKEN[2].as_bytes(), true).expect("read");
    assert_eq!((mixed.finish_reason.as_deref(), mixed.length), (Some("length"), true));
    for a in LEFT {
        assert_eq!(tail_answer(a.as_bytes(), true), None, "read from the tail: {a}");
    }
}

#[test]
fn usage_alone_is_read_from_the_tail_of_an_answer_without_choices() {
    let embeddings = r#"{"id":"embd-1","object":"list","created":1,"model":"m1","data":[{"index":0,"object":"embedding","embedding":[0.011,-0.05,1e-3]}],"usage":{"prompt_tokens":12,"total_tokens":12,"completion_tokens":0,"prompt_tokens_details":null}}"#;
    let want = Answer { usage: Some(Usage { prompt_tokens: 12, completion_tokens: 0, cached_tokens: 0 }), ..Answer::default() };
    assert_eq!(tail_answer(embeddings.as_bytes(), false), Some(want));
    // With choices asked for, an answer without them is left to the full reading.
    assert_eq!(tail_answer(embeddings.as_bytes(), true), None);
}

/// The last `"usage":` that opens a key is found, whatever comes after it.
#[test]
fn the_last_usage_key_is_found_and_a_usage_inside_a_string_is_not() {
    for (body, at) in [
        (&br#""usage":{}"#[..], Some(0)),
        (br#""a":"u","usage":{"x":"uu"},"b":"usage","usage":null"#, Some(39)),
        (br#""usage" :1,"usag":2,"uu\"usage\":""#, Some(0)),
        (br#""usage","x":1"#, None),
        (br#""x":"\"usage\":1""#, None),
        (br#""x":1 , "usage":{}"#, Some(8)),
        (b"", None),
    ] {
        assert_eq!(last_key(body), at, "{:?}", String::from_utf8_lossy(body));
    }
}

fn inner_key() -> impl Strategy<Value = &'static str> + Clone {
    prop_oneof![Just("content"), Just("text"), Just("role"), Just("arguments"), Just("x")]
}

/// A value of any shape whose strings may hold quotes, braces and the
/// keys searched for, its own keys never `usage` or `finish_reason`.
fn any_value() -> impl Strategy<Value = String> {
    let leaf = prop_oneof![
        Just("null".to_string()),
        Just("-1.5e3".to_string()),
        Just("12".to_string()),
        "[a-z{},: \\\\\"é]{0,6}".prop_map(|s| serde_json::to_string(&s).unwrap_or_default()),
        Just(r#""\"finish_reason\":\"length\",\"usage\":{}""#.to_string()),
    ];
    nested(leaf, inner_key())
}

fn finish() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("null".to_string()),
        Just(r#""stop""#.to_string()),
        Just(r#""length""#.to_string()),
        Just(r#""st\u006fp""#.to_string()),
        Just("1".to_string()),
    ]
}

/// Members with one of each key, as replicas write them: the first of each kept.
fn unique(mut m: Vec<(&'static str, String)>) -> Vec<(&'static str, String)> {
    let mut seen = std::collections::HashSet::new();
    m.retain(|(k, _)| seen.insert(*k));
    m
}

fn choice() -> impl Strategy<Value = String> {
    (prop::option::of(finish()), prop::collection::vec((inner_key(), any_value()), 0..3), 0usize..4).prop_map(|(f, m, at)| {
        let mut m = unique(m);
        if let Some(f) = f {
            m.insert(at.min(m.len()), ("finish_reason", f));
        }
        object(&m)
    })
}

fn usage_value() -> impl Strategy<Value = String> {
    let member = prop_oneof![
        (0u64..100).prop_map(|n| ("prompt_tokens", n.to_string())),
        (0u64..100).prop_map(|n| ("completion_tokens", n.to_string())),
        Just(("prompt_tokens_details", "null".to_string())),
        (0u64..100).prop_map(|n| ("prompt_tokens_details", format!("{{\"cached_tokens\":{n}}}"))),
        Just(("total_tokens", "1.5".to_string())),
        any_value().prop_map(|v| ("x", v)),
    ];
    prop_oneof![Just("null".to_string()), prop::collection::vec(member, 0..4).prop_map(|m| object(&unique(m)))]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    /// Generated answers, their choices' finish reasons and their usage
    /// anywhere among their members: where the tail reading answers, it
    /// answers as the full reading does, and it answers the common shape.
    #[test]
    fn a_generated_answer_read_from_its_tail_is_read_as_the_full_reading_reads_it(
        choices in prop::collection::vec(choice(), 0..3),
        usage in usage_value(),
        m in prop::collection::vec((inner_key(), any_value()), 0..3),
        at in 0usize..4,
        choices_at in 0usize..4,
    ) {
        let mut m = unique(m);
        m.insert(choices_at.min(m.len()), ("choices", format!("[{}]", choices.join(","))));
        m.insert(at.min(m.len()), ("usage", usage));
        let data = object(&m);
        if let Some(tail) = tail_answer(data.as_bytes(), true) {
            prop_assert_eq!(Some(tail), full_answer(data.as_bytes()), "{}", data);
        }
        // Usage alone: the rest of the answer is not read, so only an answer the full reading takes is compared.
        if let (Some(tail), Some(full)) = (tail_answer(data.as_bytes(), false), full_answer(data.as_bytes())) {
            prop_assert_eq!(tail.usage, full.usage, "{}", data);
        }
    }
}
