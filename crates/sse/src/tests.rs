//! The parser and the chunk reading, against their references.

use super::*;

/// The Responses API's stream, as vLLM sends it: typed events, deltas
/// of text, reasoning and tool-call arguments are content, the
/// completion carries usage, and it ends without `[DONE]`.
#[test]
fn responses_events_are_read_by_their_type() {
    let created = br#"{"type":"response.created","response":{"id":"resp_1","status":"in_progress","usage":null}}"#;
    assert_eq!(analyze(created), EventInfo::default());
    for t in ["response.output_text.delta", "response.reasoning_text.delta", "response.function_call_arguments.delta"] {
        let e = format!(r#"{{"type":"{t}","item_id":"msg_1","output_index":0,"delta":"Hel"}}"#);
        assert!(analyze(e.as_bytes()).content, "{t}");
        let empty = format!(r#"{{"type":"{t}","delta":""}}"#);
        assert!(!analyze(empty.as_bytes()).content, "{t} with an empty delta");
    }
    assert!(!analyze(br#"{"type":"response.output_text.done","text":"Hello"}"#).content, "a done event repeats the text: not new content");
    let completed = br#"{"type":"response.completed","response":{"id":"resp_1","status":"completed","output":[{"type":"message","content":[{"type":"output_text","text":"Hello"}]}],"usage":{"input_tokens":12,"output_tokens":5,"total_tokens":17}}}"#;
    let info = analyze(completed);
    assert!(info.done && !info.error && !info.content);
    assert_eq!(info.usage, Some(Usage::new(12, 5)));
    assert_eq!(info.finish_reason.as_deref(), Some("stop"));
    let cut = br#"{"type":"response.incomplete","response":{"status":"incomplete","incomplete_details":{"reason":"max_output_tokens"},"usage":{"input_tokens":3,"output_tokens":16}}}"#;
    let info = analyze(cut);
    assert!(info.done && !info.error);
    assert_eq!(info.finish_reason.as_deref(), Some("length"));
    assert!(analyze(br#"{"type":"response.failed","response":{"status":"failed","error":{"code":"server_error"}}}"#).error);
    assert!(analyze(br#"{"type":"error","code":"server_error","message":"boom"}"#).error);
}

/// Anthropic's Messages stream, as vLLM's `/v1/messages` sends it: a text,
/// thinking or tool-input delta is content; `message_start` carries the
/// prompt's usage, `message_delta` the stop reason (`max_tokens` is
/// `length`) and the output's usage, `message_stop` ends it, `error` is an
/// error. Each through the memo too.
#[test]
fn anthropic_message_events_are_read_by_their_type() {
    let start = br#"{"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","content":[],"model":"m","stop_reason":null,"usage":{"input_tokens":21,"output_tokens":1}}}"#;
    let info = analyze(start);
    assert!(!info.content && !info.done);
    assert_eq!(info.usage, Some(Usage::new(21, 1)));
    assert!(!analyze(br#"{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#).content);
    for delta in [
        r#"{"type":"text_delta","text":"Hi"}"#,
        r#"{"type":"thinking_delta","thinking":"hm"}"#,
        r#"{"type":"input_json_delta","partial_json":"{\"a"}"#,
    ] {
        let e = format!(r#"{{"type":"content_block_delta","index":0,"delta":{delta}}}"#);
        assert!(analyze(e.as_bytes()).content, "{delta}");
        let mut memo = Memo::new();
        assert!(memo.analyze(e.as_bytes()).content && memo.analyze(e.as_bytes()).content, "{delta} through the memo");
    }
    assert!(!analyze(br#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":""}}"#).content);
    let delta =
        analyze(br#"{"type":"message_delta","delta":{"stop_reason":"max_tokens","stop_sequence":null},"usage":{"output_tokens":9}}"#);
    assert_eq!((delta.finish_reason.as_deref(), delta.usage), (Some("length"), Some(Usage::new(0, 9))));
    let stop = analyze(br#"{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"input_tokens":21,"output_tokens":9}}"#);
    assert_eq!(stop.finish_reason.as_deref(), Some("stop"));
    assert!(analyze(br#"{"type":"message_stop"}"#).done);
    assert!(analyze(br#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#).error);
    assert_eq!(analyze(br#"{"type":"ping"}"#), EventInfo::default());
}

/// OpenAI's transcription stream: `transcript.text.delta` events, then
/// `transcript.text.done` with usage.
#[test]
fn transcription_events_are_read_by_their_type() {
    assert!(analyze(br#"{"type":"transcript.text.delta","delta":"The"}"#).content);
    let done = analyze(br#"{"type":"transcript.text.done","text":"The end","usage":{"input_tokens":40,"output_tokens":3}}"#);
    assert!(done.done);
    assert_eq!(done.usage, Some(Usage::new(40, 3)));
}

fn parse_all(chunks: &[&[u8]]) -> Vec<Option<String>> {
    let mut p = SseParser::new();
    let mut out = Vec::new();
    for c in chunks {
        p.feed(c, |d, _| out.push(d.map(|d| String::from_utf8_lossy(d).into_owned())));
    }
    out
}

const STREAM: &[u8] = b": ping\n\ndata: {\"a\":1}\n\ndata: line1\ndata: line2\n\nevent: x\r\ndata:nospace\r\n\r\ndata: [DONE]\r\r";

#[test]
fn whole_stream_in_one_chunk() {
    let got = parse_all(&[STREAM]);
    assert_eq!(got, vec![None, Some("{\"a\":1}".into()), Some("line1\nline2".into()), Some("nospace".into()), Some("[DONE]".into())]);
}

#[test]
fn split_at_every_byte_boundary_gives_the_same_events() {
    let whole = parse_all(&[STREAM]);
    for cut in 0..=STREAM.len() {
        assert_eq!(parse_all(&[&STREAM[..cut], &STREAM[cut..]]), whole, "cut at {cut}");
    }
    let bytes: Vec<&[u8]> = STREAM.chunks(1).collect();
    assert_eq!(parse_all(&bytes), whole);
}

/// A replica's usual reads, whole events of one data line each, are handed
/// on where they lie: the parser copies nothing of them and holds no
/// buffer between them. A block of several data lines, or one split over
/// reads, goes through its buffer as before.
#[test]
fn whole_events_are_handed_on_in_place_and_nothing_is_held_between_them() {
    let read = b"data: {\"a\":1}\n\ndata:{\"b\":2}\r\n\r\ndata\n\n: ping\n\n";
    let mut p = SseParser::new();
    let mut got = Vec::new();
    p.feed(read, |d, end| {
        if let Some(d) = d {
            // A slice of the read itself.
            let at = d.as_ptr() as usize - read.as_ptr() as usize;
            assert_eq!(&read[at..at + d.len()], d);
        }
        got.push((d.map(|d| String::from_utf8_lossy(d).into_owned()), end));
    });
    assert_eq!(got, vec![(Some("{\"a\":1}".into()), 15), (Some("{\"b\":2}".into()), 31), (Some(String::new()), 37), (None, 45)]);
    assert_eq!((p.data.capacity(), p.line.capacity()), (0, 0), "nothing held between events");
    let mut several = Vec::new();
    p.feed(b"data: a\ndata: b\n\ndata: c", |d, _| several.push(d.map(|d| String::from_utf8_lossy(d).into_owned())));
    p.feed(b"\n\n", |d, _| several.push(d.map(|d| String::from_utf8_lossy(d).into_owned())));
    assert_eq!(several, vec![Some("a\nb".to_string()), Some("c".to_string())]);
}

/// Found by the property test: an empty read between a CR and its LF
/// made the LF a second line end, so a blank line appeared that the
/// replica never sent.
#[test]
fn an_empty_read_between_cr_and_lf_changes_nothing() {
    let whole = parse_all(&[b"data: a\r\ndata: b\r\n\r\n"]);
    assert_eq!(parse_all(&[b"data: a\r", b"", b"\ndata: b\r\n\r\n"]), whole);
    assert_eq!(whole, vec![Some("a\nb".to_string())]);
}

#[test]
fn block_end_offsets_point_after_the_blank_line() {
    let mut p = SseParser::new();
    let mut ends = Vec::new();
    p.feed(b"data: a\n\ndata: b\n\ndata: c", |_, end| ends.push(end));
    assert_eq!(ends, vec![9, 18]);
}

#[test]
fn role_chunk_is_not_content_but_text_tool_calls_and_reasoning_are() {
    let role = br#"{"id":"x","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}"#;
    assert!(!analyze(role).content);
    let text = br#"{"choices":[{"index":0,"delta":{"content":"Hi"}}]}"#;
    assert!(analyze(text).content);
    let tool = br#"{"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"name":"f"}}]}}]}"#;
    assert!(analyze(tool).content);
    let reasoning = br#"{"choices":[{"delta":{"reasoning_content":"hmm"}}]}"#;
    assert!(analyze(reasoning).content);
    let completion = br#"{"choices":[{"index":0,"text":" the","finish_reason":null}]}"#;
    assert!(analyze(completion).content);
    let escaped = br#"{"choices":[{"delta":{"content":"a\"b\n"}}]}"#;
    assert!(analyze(escaped).content);
    let only_escape = br#"{"choices":[{"delta":{"content":"\u00e9"}}]}"#;
    assert!(analyze(only_escape).content);
    let nulls = br#"{"object":null,"choices":[{"delta":{"content":null,"tool_calls":null},"text":null}]}"#;
    assert!(!analyze(nulls).content);
    let no_calls = br#"{"choices":[{"delta":{"content":"","tool_calls":[]}}]}"#;
    assert!(!analyze(no_calls).content);
}

#[test]
fn usage_errors_finish_and_done_are_recognised() {
    let usage = br#"{"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":7,"total_tokens":12}}"#;
    let u = analyze(usage);
    assert!(u.usage_only && !u.content);
    assert_eq!(u.usage, Some(Usage::new(5, 7)));
    assert!(analyze(br#"{"error":{"message":"boom","code":500}}"#).error);
    assert!(analyze(br#"{"object":"error","message":"boom"}"#).error);
    let fin = analyze(br#"{"choices":[{"delta":{},"finish_reason":"length"}]}"#);
    assert_eq!(fin.finish_reason.as_deref(), Some("length"));
    assert!(analyze(b"[DONE]").done);
    assert_eq!(analyze(b"not json"), EventInfo::default());
}

#[test]
fn cached_prompt_tokens_are_read_where_the_engines_report_them() {
    let chat = br#"{"choices":[],"usage":{"prompt_tokens":500,"completion_tokens":7,"prompt_tokens_details":{"cached_tokens":448}}}"#;
    assert_eq!(analyze(chat).usage.map(|u| u.cached_tokens), Some(448));
    let responses = br#"{"type":"response.completed","response":{"usage":{"input_tokens":50,"output_tokens":2,"input_tokens_details":{"cached_tokens":32}}}}"#;
    assert_eq!(analyze(responses).usage.map(|u| u.cached_tokens), Some(32));
    // vLLM without --enable-prompt-tokens-details sends null; odd values count as none.
    let more = br#"{"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":7,"prompt_tokens_details":{"audio_tokens":{"a":[1]},"cached_tokens":4}}}"#;
    assert_eq!(analyze(more).usage.map(|u| u.cached_tokens), Some(4));
    for details in ["null", "[1,2]", r#""x""#, r#"{"cached_tokens":"many"}"#, r#"{"cached_tokens":-1}"#, r#"{"cached_tokens":2.5}"#] {
        let e = format!(r#"{{"choices":[],"usage":{{"prompt_tokens":5,"completion_tokens":7,"prompt_tokens_details":{details}}}}}"#);
        assert_eq!(analyze(e.as_bytes()).usage, Some(Usage::new(5, 7)), "{details}");
    }
}

/// A byte that is not UTF-8 fails only a string that is read for its
/// text, as when every string was checked on its own.
#[test]
fn a_stray_byte_fails_only_a_string_that_is_read() {
    let mut ignored = br#"{"id":"x"#.to_vec();
    ignored.push(0xff);
    ignored.extend_from_slice(br#"","choices":[{"index":0,"delta":{"content":"hi"}}]}"#);
    assert!(analyze(&ignored).content);
    let mut read = br#"{"choices":[{"index":0,"delta":{"content":"h"#.to_vec();
    read.push(0xff);
    read.extend_from_slice(br#""}}]}"#);
    assert_eq!(analyze(&read), EventInfo::default());
}

/// A reference parser over a whole stream, written for clarity: split
/// into lines (CRLF, CR or LF), blank lines end blocks. Each block's data
/// (or `None` when it had no data line) with its absolute end offset.
fn reference(stream: &[u8]) -> Vec<(Option<String>, usize)> {
    let mut out = Vec::new();
    let (mut data, mut has_data) = (String::new(), false);
    let mut i = 0;
    while i < stream.len() {
        let Some(pos) = stream[i..].iter().position(|&b| b == b'\n' || b == b'\r') else { break };
        let line = String::from_utf8_lossy(&stream[i..i + pos]).into_owned();
        let mut end = i + pos + 1;
        if stream[i + pos] == b'\r' && stream.get(end) == Some(&b'\n') {
            end += 1;
        }
        i = end;
        if line.is_empty() {
            out.push((has_data.then(|| data.clone()), end));
            data.clear();
            has_data = false;
        } else if let Some(v) = line.strip_prefix("data:") {
            if has_data {
                data.push('\n');
            }
            data.push_str(v.strip_prefix(' ').unwrap_or(v));
            has_data = true;
        } else if line == "data" {
            if has_data {
                data.push('\n');
            }
            has_data = true;
        }
    }
    out
}

/// One event as sent: its lines, all ended the same way, then a blank line.
fn event_strategy() -> impl Strategy<Value = Vec<u8>> {
    let line = prop_oneof![
        "[a-zA-Z0-9 {}\":,\\[\\]]{0,20}".prop_map(|t| format!("data: {t}")),
        "[a-z0-9 ]{0,10}".prop_map(|t| format!("data:{t}")),
        "[a-z ]{0,10}".prop_map(|t| format!(": {t}")),
        "[a-z]{1,6}".prop_map(|t| format!("event: {t}")),
        Just("data".to_string()),
    ];
    (prop::collection::vec(line, 1..4), prop_oneof![Just("\n"), Just("\r\n"), Just("\r")]).prop_map(|(lines, eol)| {
        let mut e = String::new();
        for l in lines {
            e.push_str(&l);
            e.push_str(eol);
        }
        e.push_str(eol);
        e.into_bytes()
    })
}

use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    /// Fed in any pieces, the incremental parser finds the blocks the
    /// reference finds, with the same data and the same end offsets.
    #[test]
    fn the_parser_agrees_with_the_reference_under_any_split(
        events in prop::collection::vec(event_strategy(), 0..8),
        cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..12),
    ) {
        let stream: Vec<u8> = events.concat();
        let mut at: Vec<usize> = cuts.iter().map(|c| c.index(stream.len() + 1)).collect();
        at.sort_unstable();
        let mut p = SseParser::new();
        let mut got = Vec::new();
        let mut start = 0;
        for end in at.iter().copied().chain([stream.len()]) {
            let base = start;
            p.feed(&stream[start..end], |d, e| got.push((d.map(|d| String::from_utf8_lossy(d).into_owned()), base + e)));
            start = end;
        }
        let want = reference(&stream);
        prop_assert_eq!(got.len(), want.len(), "{:?} cut at {:?}: got {:?} want {:?}", String::from_utf8_lossy(&stream), at, got, want);
        for ((gd, ge), (wd, we)) in got.iter().zip(&want) {
            prop_assert_eq!(gd, wd);
            // A blank line ended by CRLF that a read splits between CR and
            // LF ends at the CR: the parser cannot wait for the next read
            // to see whether an LF follows (it would delay the event).
            let split_crlf = *ge + 1 == *we && stream[*ge] == b'\n' && at.contains(ge);
            prop_assert!(ge == we || split_crlf, "block end {} where the reference has {}", ge, we);
        }
    }
}
