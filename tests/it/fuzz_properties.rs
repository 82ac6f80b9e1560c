//! The fuzz targets' properties (`fuzz/`, `scripts/fuzz SECONDS`) on
//! arbitrary input through proptest, so every test run tries them too: the
//! SSE observer does not depend on how a stream is cut into reads, the
//! request-body reader's two paths agree, the form reader reads what the
//! replica reads, context reduction never grows a request, and the config
//! parser answers any text without panicking.

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

/// One part of a multipart form under the boundary `XyZ`, from pieces
/// that reach the reader's corners: every way of writing a disposition the
/// replica reads (names in any case, twice, extended, hidden in quotes,
/// in angle brackets), encodings, repeated headers, values that hold
/// near-delimiters, files.
fn form_part() -> impl Strategy<Value = String> {
    let name = prop_oneof![Just("model"), Just("stream"), Just("file"), Just("priority"), Just("x"), Just("Model")];
    let param = prop_oneof![
        name.clone().prop_map(|n| format!("name=\"{n}\"")),
        name.clone().prop_map(|n| format!("Name={n}")),
        name.clone().prop_map(|n| format!("NAME = \"{n}\" ")),
        name.clone().prop_map(|n| format!("name*=utf-8''{n}")),
        name.clone().prop_map(|n| format!("name=<{n}>")),
        name.prop_map(|n| format!("filename=\"a; name={n}\"")),
        Just("filename=\"a.wav\"".to_string()),
        Just("filename=\"a\\\"b\"".to_string()),
        Just("name".to_string()),
    ];
    let disposition =
        (prop_oneof![8 => Just("form-data"), 1 => Just("Form-Data"), 1 => Just("attachment")], prop::collection::vec(param, 1..3))
            .prop_map(|(t, ps)| format!("Content-Disposition: {t}; {}\r\n", ps.join("; ")));
    let header = prop_oneof![
        4 => disposition,
        1 => Just("Content-Type: audio/wav\r\n".to_string()),
        1 => Just("Content-Transfer-Encoding: base64\r\n".to_string()),
        1 => Just("content-transfer-encoding: binary\r\n".to_string()),
        1 => Just("X Bad: 1\r\n".to_string()),
    ];
    let value = prop_oneof![
        Just("m-small"),
        Just("m-big"),
        Just("true"),
        Just("0"),
        Just("a\r\n--XyZx"),
        Just("\r\n--XyZ-"),
        Just("\r"),
        Just(""),
        Just("bS1iaWc="),
    ];
    let headers = prop_oneof![6 => header.clone().prop_map(|h| vec![h]), 1 => prop::collection::vec(header, 0..3)];
    let tricky = (headers, value.clone()).prop_map(|(hs, v)| format!("--XyZ\r\n{}\r\n{v}\r\n", hs.concat()));
    let plain = (prop_oneof![Just("model"), Just("stream"), Just("language")], value)
        .prop_map(|(n, v)| format!("--XyZ\r\nContent-Disposition: form-data; name=\"{n}\"\r\n\r\n{v}\r\n"));
    prop_oneof![plain, tricky]
}

/// A member a request body's head is read from, with a value of the type
/// it has (nine times in ten), or any member with any value (one in ten:
/// a type it should not have, a key written with an escape, another member).
fn routed_member() -> impl Strategy<Value = (&'static str, &'static str)> {
    let any: Vec<&'static str> = vec![
        "true",
        "false",
        "null",
        "0",
        "7",
        "-1",
        "1.5",
        "2e3",
        "18446744073709551615",
        "\"m\"",
        "\"m\\n\"",
        "{}",
        "[]",
        "[\"a\",\"b\"]",
        "[1,2]",
        "[[1],[2]]",
        "{\"include_usage\":true}",
        "{\"user_id\":\"u\"}",
        "[{\"role\":\"user\",\"content\":\"hi\"}]",
    ];
    let typed = |key: &'static str, values: Vec<&'static str>| (Just(key), prop::sample::select(values));
    let prompt = vec!["\"p\"", "[\"a\",\"b\"]", "[1,2]", "[[1],[2]]", "[{\"role\":\"user\",\"content\":\"hi\"}]", "null", "{}"];
    let count = vec!["0", "7", "64", "18446744073709551615", "-1", "1.5", "null", "\"9\""];
    prop_oneof![
        2 => typed("stream", vec!["true", "false", "null"]),
        1 => typed("stream_options", vec!["{\"include_usage\":true}", "{\"include_usage\":false}", "null"]),
        1 => typed("priority", vec!["1", "null", "\"high\""]),
        1 => typed("cache_salt", vec!["\"s\"", "null"]),
        1 => prop::sample::select(vec!["messages", "prompt", "input", "instructions", "prompt_cache_key", "metadata"]).prop_flat_map(move |k| (Just(k), prop::sample::select(prompt.clone()))),
        1 => typed("previous_response_id", vec!["\"r1\"", "null", "\"r\\u0031\""]),
        2 => prop::sample::select(vec!["max_tokens", "max_completion_tokens", "max_output_tokens", "n", "best_of"]).prop_flat_map(move |k| (Just(k), prop::sample::select(count.clone()))),
        1 => (prop::sample::select(vec!["model", "stream", "prompt", "n", "mod\\u0065l", "x"]), prop::sample::select(any)),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn the_form_reader_reads_what_the_replica_reads(
        parts in prop::collection::vec(form_part(), 1..6),
        lead in prop_oneof![8 => Just(""), 1 => Just("\r\n"), 1 => Just("x")],
        end in prop_oneof![8 => Just("--XyZ--\r\n"), 1 => Just("--XyZ--"), 1 => Just("--XyZ"), 1 => Just("")],
        cuts in prop::collection::vec(0usize..400, 0..6),
    ) {
        let body = format!("{lead}{}{end}", parts.concat());
        let mut cuts = cuts;
        cuts.sort_unstable();
        slogate::fuzzing::form_reader(body.as_bytes(), b"XyZ", &cuts);
    }

    #[test]
    fn the_form_reader_reads_what_the_replica_reads_on_any_bytes(
        body in prop::collection::vec(prop_oneof![Just(b'-'), Just(b'\r'), Just(b'\n'), Just(b'X'), Just(b'y'), Just(b'Z'), any::<u8>()], 0..96),
        cut in 0usize..96,
    ) {
        slogate::fuzzing::form_reader(&body, b"XyZ", &[cut]);
    }

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
    fn the_request_body_paths_agree_on_the_members_routing_reads(
        model in prop_oneof![8 => Just("\"m\""), 1 => Just("\"r\\u0031\""), 1 => Just("null")],
        members in prop::collection::vec(routed_member(), 0..5),
        at in 0usize..5,
        gap in prop_oneof![Just(""), Just(" "), Just("\n  ")],
        usage in any::<bool>(),
    ) {
        let mut members: Vec<String> = members.iter().map(|(k, v)| format!("{gap}\"{k}\"{gap}:{gap}{v}")).collect();
        members.insert(at.min(members.len()), format!("{gap}\"model\":{gap}{model}"));
        let text = format!("{{{}{gap}}}", members.join(","));
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
