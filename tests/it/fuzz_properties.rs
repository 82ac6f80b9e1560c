//! The fuzz targets' properties (`fuzz/`, `scripts/fuzz SECONDS`) on
//! arbitrary input through proptest, so every test run tries them too: the
//! SSE observer does not depend on how a stream is cut into reads, the
//! request-body reader's two paths agree, context reduction never grows a
//! request, and the config parser answers any text without panicking.

use proptest::prelude::*;

/// Bytes that look like an SSE stream often enough to reach the parser's
/// corners: event lines, usage and done events, CR/LF mixes, junk.
fn sse_bytes() -> impl Strategy<Value = Vec<u8>> {
    let piece = prop_oneof![
        Just(b"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"x\"}}]}\n\n".to_vec()),
        Just(b"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":2}}\n\n".to_vec()),
        Just(b"data: [DONE]\n\n".to_vec()),
        Just(b": keep-alive\r\n\r\n".to_vec()),
        Just(b"data: {\"error\":{\"message\":\"x\"}}\r\n\r\n".to_vec()),
        Just(b"\r".to_vec()),
        Just(b"\n".to_vec()),
        prop::collection::vec(any::<u8>(), 0..24),
    ];
    prop::collection::vec(piece, 0..10).prop_map(|v| v.concat())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn the_sse_observer_does_not_depend_on_how_reads_are_cut(stream in sse_bytes(), cuts in prop::collection::vec(any::<u8>(), 0..8)) {
        slogate::fuzzing::sse_reads(&stream, &cuts);
    }

    #[test]
    fn the_request_body_paths_agree_on_any_bytes(bytes in prop::collection::vec(any::<u8>(), 0..64), usage in any::<bool>()) {
        slogate::fuzzing::request_body(&bytes, usage, Some(1));
    }

    #[test]
    fn the_request_body_paths_agree_on_json_like_text(
        text in r#"\{( *"(model|stream|stream_options|priority|messages|x)" *: *(true|false|null|1|"m"|\{\}|\[\]|\{"include_usage":(true|false)\}) *,?)*\}"#,
        usage in any::<bool>(),
    ) {
        slogate::fuzzing::request_body(text.as_bytes(), usage, None);
    }

    #[test]
    fn reduction_never_grows_a_request(text in r#"\{"(messages|documents|max_tokens|max_completion_tokens|x)":(\[(\{"role":"(system|user|assistant|tool)","content":"[a-z ]{0,40}"\},?){0,6}\]|[0-9]{1,6}|"[a-z]{0,8}")\}"#, chat in any::<bool>()) {
        slogate::fuzzing::reduce(text.as_bytes(), chat);
    }

    #[test]
    fn the_config_parser_answers_any_text(text in r#"(server|pools|classes|breaker|tiers|auth|[a-z_]{1,8})?:?( |\n  |- )?([a-z_]{0,10}: ?[a-z0-9.\[\]{}:,-]{0,12}\n?){0,6}"#) {
        slogate::fuzzing::config(&text);
    }

    #[test]
    fn the_config_parser_answers_any_bytes(bytes in prop::collection::vec(any::<u8>(), 0..128)) {
        slogate::fuzzing::config(&String::from_utf8_lossy(&bytes));
    }
}
