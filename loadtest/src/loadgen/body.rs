//! What loadgen sends: a request's JSON body (made-up prompts that share
//! no prefix, or a chat history), and the multipart form of a
//! transcription upload.

use bytes::Bytes;

use super::scenario::{Endpoint, Prompt, StreamSpec};

/// The path of `endpoint`'s requests.
pub(super) fn path(endpoint: Endpoint) -> &'static str {
    match endpoint {
        Endpoint::Chat => "/v1/chat/completions",
        Endpoint::Completions => "/v1/completions",
        Endpoint::Embeddings => "/v1/embeddings",
        Endpoint::Transcriptions => "/v1/audio/transcriptions",
    }
}

/// The boundary of loadgen's forms.
const BOUNDARY: &str = "loadgenformboundary";
pub(super) const FORM_CONTENT_TYPE: &str = "multipart/form-data; boundary=loadgenformboundary";

/// A transcription upload: a `file` part of `bytes` bytes (a WAV header,
/// then bytes that never hold the boundary), then `model`, the last field,
/// as a client that writes its file first sends it: a gateway reads the
/// whole form before it can route it.
pub(super) fn form(model: &str, bytes: u64) -> Bytes {
    let head = format!(
        "--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"speech.wav\"\r\nContent-Type: audio/wav\r\n\r\n"
    );
    let tail = format!("\r\n--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\n{model}\r\n--{BOUNDARY}--\r\n");
    let mut b = Vec::with_capacity(head.len() + bytes as usize + tail.len());
    b.extend_from_slice(head.as_bytes());
    let wav = b"RIFF\0\0\0\0WAVEfmt ";
    b.extend(wav.iter().chain(std::iter::repeat(&0x80u8)).take(bytes as usize));
    b.extend_from_slice(tail.as_bytes());
    Bytes::from(b)
}

/// The JSON body of one request of `spec`.
pub(super) fn request_body(spec: &StreamSpec, p: &Prompt) -> String {
    let (prompt, output) = (p.prompt_tokens, p.output_tokens);
    let mut body = match (spec.endpoint, &p.text) {
        (Endpoint::Chat, Some(text)) => serde_json::json!({"model": spec.model, "messages": [{"role": "user", "content": &**text}]}),
        (Endpoint::Chat, None) => serde_json::json!({"model": spec.model, "messages": conversation(prompt, spec.turns)}),
        (Endpoint::Completions, Some(text)) => serde_json::json!({"model": spec.model, "prompt": &**text}),
        (Endpoint::Completions, None) => serde_json::json!({"model": spec.model, "prompt": prompt_text(prompt)}),
        (Endpoint::Embeddings, Some(text)) => return serde_json::json!({"model": spec.model, "input": &**text}).to_string(),
        (Endpoint::Embeddings, None) => return serde_json::json!({"model": spec.model, "input": prompt_text(prompt)}).to_string(),
        // A form, made once per stream (see [`form`]).
        (Endpoint::Transcriptions, _) => return String::new(),
    };
    body["max_tokens"] = output.into();
    body["ignore_eos"] = true.into();
    body["stream"] = spec.stream.into();
    body.to_string()
}

/// Text of about `n` tokens as the simulator counts them (4 characters
/// each), starting with a number no other prompt has: made
/// up prompts share no prefix, as random prompts do not (an engine's
/// prefix cache finds nothing in them).
fn prompt_text(n: u32) -> String {
    // Numbered from a random start: unique across runs against the same replicas too.
    static START: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let id = START.get_or_init(rand::random::<u64>).wrapping_add(NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
    let mut s = format!("{:015x} ", id & 0x0fff_ffff_ffff_ffff);
    s.push_str(&"abc ".repeat((n as usize).saturating_sub(4)));
    s
}

/// A chat history of `turns` messages holding about `n` prompt tokens: a
/// short system prompt, then user/assistant turns ending with the user.
fn conversation(n: u32, turns: u32) -> Vec<serde_json::Value> {
    if turns <= 1 {
        return vec![serde_json::json!({"role": "user", "content": prompt_text(n)})];
    }
    let system = n.min(16);
    let rest = turns - 1;
    let each = (n - system) / rest;
    let mut msgs = vec![serde_json::json!({"role": "system", "content": prompt_text(system)})];
    for i in 0..rest {
        // Odd count of turns after the system prompt ends with the user.
        let role = if (rest - 1 - i) % 2 == 0 { "user" } else { "assistant" };
        msgs.push(serde_json::json!({"role": role, "content": prompt_text(each)}));
    }
    msgs
}

#[cfg(test)]
mod tests {
    use super::{form, prompt_text, request_body};
    use crate::loadgen::scenario::{Prompt, StreamSpec};

    #[test]
    fn an_embeddings_request_carries_its_input_and_nothing_of_a_generation() {
        let spec: StreamSpec = serde_norway::from_str(
            "{ name: e, model: m, endpoint: embeddings, stream: false, arrival: { kind: constant, rate: 1 }, prompt_tokens: { dist: fixed, value: 8 } }",
        )
        .expect("spec");
        let body = request_body(&spec, &Prompt { text: None, prompt_tokens: 8, output_tokens: 1 });
        let v: serde_json::Value = serde_json::from_str(&body).expect("JSON");
        assert_eq!(v["model"], "m");
        assert_eq!(v["input"].as_str().map(str::len), Some(32), "8 tokens of 4 characters");
        for absent in ["max_tokens", "stream", "ignore_eos", "messages"] {
            assert!(v.get(absent).is_none(), "{absent} in {body}");
        }
    }

    #[test]
    fn made_up_prompts_share_no_prefix_and_have_their_length() {
        let (a, b) = (prompt_text(100), prompt_text(100));
        assert_eq!((a.len(), b.len()), (400, 400));
        assert_ne!(a[..16], b[..16], "each starts with its own number: {a:.20} / {b:.20}");
    }

    #[test]
    fn a_transcription_form_has_its_file_then_the_model_and_one_boundary_set() {
        let f = form("whisper", 1000);
        let find = |needle: &str| f.windows(needle.len()).position(|w| w == needle.as_bytes());
        let (file, model) = (find("name=\"file\"").expect("file"), find("name=\"model\"").expect("model"));
        assert!(file < model, "the model last");
        assert!(f.ends_with(b"whisper\r\n--loadgenformboundary--\r\n"));
        assert_eq!(f.windows(21).filter(|w| w == b"--loadgenformboundary").count(), 3, "two parts and the end");
        let body_start = find("\r\n\r\nRIFF").expect("the file") + 4;
        let body_end = find("\r\n--loadgenformboundary\r\nContent-Disposition: form-data; name=\"model\"").expect("end");
        assert_eq!(body_end - body_start, 1000);
    }

    #[test]
    fn a_transcriptions_stream_needs_its_upload_size_and_nothing_of_a_prompt() {
        let spec = |extra: &str| -> StreamSpec {
            serde_norway::from_str(&format!(
                "{{ name: t, model: w, endpoint: transcriptions, arrival: {{ kind: constant, rate: 1 }}{extra} }}"
            ))
            .expect("spec")
        };
        assert!(spec(", upload_bytes: 25000000").sampler(1).is_ok());
        assert!(spec("").sampler(1).is_err(), "no upload size");
        assert!(spec(", upload_bytes: 10, prompt_tokens: { dist: fixed, value: 8 }").sampler(1).is_err(), "a prompt too");
        let chat: StreamSpec = serde_norway::from_str(
            "{ name: c, model: m, arrival: { kind: constant, rate: 1 }, upload_bytes: 10, prompt_tokens: { dist: fixed, value: 8 }, output_tokens: { dist: fixed, value: 8 } }",
        )
        .expect("spec");
        assert!(chat.sampler(1).is_err(), "upload_bytes on chat");
    }
}
