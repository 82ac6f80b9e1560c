//! Context reduction: pure functions that rewrite a chat or completion
//! request to cost less while a class's TTFT P99 is over its trigger: cap
//! the output, cut RAG documents, drop the oldest turns (never system
//! messages, the last user message, or half of a tool call and its result).
//! Every field this code does not touch survives as it was. The rules are
//! docs/design/reduction.md's.

use serde_json::{Map, Value};

/// The limits of `context_reduction`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    pub(crate) max_tokens_cap: u64,
    pub(crate) max_documents: usize,
    pub(crate) max_prompt_tokens: u64,
}

impl Limits {
    pub(crate) fn from_config(c: &crate::config::ContextReductionConfig) -> Limits {
        Limits {
            max_tokens_cap: c.max_tokens_cap as u64,
            max_documents: c.max_documents as usize,
            max_prompt_tokens: c.max_prompt_tokens as u64,
        }
    }
}

/// What a rewrite changed, e.g. `max_tokens=1024->256; documents=10->3; messages=24->8`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Changes(Vec<String>);

impl Changes {
    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
    /// The `x-slogate-context-reduced` header value.
    pub(crate) fn header(&self) -> String {
        self.0.join("; ")
    }
}

/// Rough prompt-token estimate of a text: about four characters a token.
fn text_tokens(s: &str) -> u64 {
    (s.chars().count() as u64).div_ceil(4)
}

/// Tokens a JSON value stands for when it ends up in the prompt.
fn value_tokens(v: &Value) -> u64 {
    match v {
        Value::Null => 0,
        Value::String(s) => text_tokens(s),
        Value::Array(items) => items.iter().map(value_tokens).sum(),
        Value::Object(o) => o.iter().filter(|(k, _)| k.as_str() != "type").map(|(_, v)| value_tokens(v)).sum(),
        other => text_tokens(&other.to_string()),
    }
}

/// Estimated tokens of one chat message (content, tool calls, name, plus
/// a few tokens of chat-template framing).
pub(crate) fn message_tokens(m: &Value) -> u64 {
    const FRAMING: u64 = 4;
    let Some(o) = m.as_object() else { return FRAMING };
    FRAMING + ["content", "tool_calls", "name", "reasoning_content"].iter().filter_map(|k| o.get(*k)).map(value_tokens).sum::<u64>()
}

/// Estimated prompt tokens of a chat request (messages and documents).
pub(crate) fn prompt_tokens(obj: &Map<String, Value>) -> u64 {
    let msgs = obj.get("messages").and_then(Value::as_array).map(|a| a.iter().map(message_tokens).sum()).unwrap_or(0);
    let docs = obj.get("documents").map(value_tokens).unwrap_or(0);
    msgs + docs
}

fn role(m: &Value) -> &str {
    m.get("role").and_then(Value::as_str).unwrap_or("")
}

fn has_tool_calls(m: &Value) -> bool {
    m.get("tool_calls").and_then(Value::as_array).is_some_and(|a| !a.is_empty())
}

/// Cut messages into units that are kept or dropped whole: an assistant
/// message with tool calls plus the tool results that follow it, or one
/// message. Returns index ranges.
fn units(msgs: &[Value]) -> Vec<std::ops::Range<usize>> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < msgs.len() {
        let start = i;
        i += 1;
        if role(&msgs[start]) == "assistant" && has_tool_calls(&msgs[start]) {
            while i < msgs.len() && role(&msgs[i]) == "tool" {
                i += 1;
            }
        }
        out.push(start..i);
    }
    out
}

/// Rewrite a request in place. `chat` selects `/v1/chat/completions` rules
/// (messages, documents, `max_completion_tokens`); otherwise only
/// `max_tokens` is capped (a completion prompt is not cut).
pub(crate) fn reduce(obj: &mut Map<String, Value>, chat: bool, limits: &Limits) -> Changes {
    let mut changes = Vec::new();

    // 1. Output length.
    let keys: &[&str] = if chat { &["max_tokens", "max_completion_tokens"] } else { &["max_tokens"] };
    let mut any = false;
    for k in keys {
        match obj.get(*k) {
            Some(Value::Number(n)) => {
                any = true;
                if n.as_f64().is_some_and(|v| v > limits.max_tokens_cap as f64) {
                    changes.push(format!("{k}={n}->{}", limits.max_tokens_cap));
                    obj.insert((*k).to_string(), Value::from(limits.max_tokens_cap));
                }
            }
            Some(Value::Null) | None => {}
            // Not a number: leave it for the replica to reject.
            Some(_) => any = true,
        }
    }
    if !any {
        changes.push(format!("max_tokens=none->{}", limits.max_tokens_cap));
        obj.insert("max_tokens".into(), Value::from(limits.max_tokens_cap));
    }
    if !chat {
        return Changes(changes);
    }

    // 2. RAG documents.
    if let Some(Value::Array(docs)) = obj.get_mut("documents") {
        if docs.len() > limits.max_documents {
            changes.push(format!("documents={}->{}", docs.len(), limits.max_documents));
            docs.truncate(limits.max_documents);
        }
    }

    // 3. History.
    let mut total = prompt_tokens(obj);
    if total > limits.max_prompt_tokens {
        if let Some(Value::Array(msgs)) = obj.get_mut("messages") {
            let before = msgs.len();
            let last_user = msgs.iter().rposition(|m| role(m) == "user");
            let mut drop = vec![false; msgs.len()];
            for u in units(msgs) {
                if total <= limits.max_prompt_tokens {
                    break;
                }
                let protected = u.clone().any(|i| matches!(role(&msgs[i]), "system" | "developer") || Some(i) == last_user);
                if protected {
                    continue;
                }
                for i in u {
                    drop[i] = true;
                    total = total.saturating_sub(message_tokens(&msgs[i]));
                }
            }
            let mut i = 0;
            msgs.retain(|_| {
                i += 1;
                !drop[i - 1]
            });
            if msgs.len() != before {
                changes.push(format!("messages={before}->{}", msgs.len()));
            }
        }
    }
    Changes(changes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn limits() -> Limits {
        Limits { max_tokens_cap: 256, max_documents: 3, max_prompt_tokens: 100 }
    }

    fn obj(v: Value) -> Map<String, Value> {
        v.as_object().cloned().unwrap_or_default()
    }

    #[test]
    fn caps_max_tokens_and_adds_it_when_absent() {
        let mut o = obj(json!({"model": "m", "messages": [], "max_tokens": 1024}));
        assert_eq!(reduce(&mut o, true, &limits()).header(), "max_tokens=1024->256");
        assert_eq!(o["max_tokens"], 256);
        let mut o = obj(json!({"model": "m", "messages": [], "max_completion_tokens": 2000}));
        assert_eq!(reduce(&mut o, true, &limits()).header(), "max_completion_tokens=2000->256");
        assert!(o.get("max_tokens").is_none());
        let mut o = obj(json!({"model": "m", "messages": []}));
        assert_eq!(reduce(&mut o, true, &limits()).header(), "max_tokens=none->256");
        assert_eq!(o["max_tokens"], 256);
        let mut o = obj(json!({"model": "m", "messages": [], "max_tokens": 100}));
        assert!(reduce(&mut o, true, &limits()).is_empty());
        assert_eq!(o["max_tokens"], 100);
    }

    #[test]
    fn keeps_first_documents() {
        let mut o = obj(json!({"model": "m", "max_tokens": 10, "documents": [{"t": "a"}, {"t": "b"}, {"t": "c"}, {"t": "d"}, {"t": "e"}],
            "messages": [{"role": "user", "content": "q"}]}));
        assert_eq!(reduce(&mut o, true, &limits()).header(), "documents=5->3");
        assert_eq!(o["documents"], json!([{"t": "a"}, {"t": "b"}, {"t": "c"}]));
    }

    #[test]
    fn drops_oldest_keeps_system_and_last_user_and_tool_pairs() {
        let long = "x".repeat(200); // 50 tokens + framing
        let mut o = obj(json!({"model": "m", "max_tokens": 10, "custom_field": {"keep": true}, "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": long},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": long},
            {"role": "assistant", "content": long},
            {"role": "user", "content": long},
        ]}));
        let original = o.clone();
        // Estimate: 6 + 54 + 7 + 54 + 54 + 54 = 229 tokens.
        assert_eq!(prompt_tokens(&o), 229);
        // Dropping the oldest user turn is enough for 180: the tool pair stays.
        let c = reduce(&mut o, true, &Limits { max_prompt_tokens: 180, ..limits() });
        assert_eq!(c.header(), "messages=6->5");
        let roles: Vec<&str> = o["messages"].as_array().into_iter().flatten().map(role).collect();
        assert_eq!(roles, ["system", "assistant", "tool", "assistant", "user"]);
        // For 100 the tool call and its result go together, never one alone.
        let mut o = original;
        let c = reduce(&mut o, true, &limits());
        assert_eq!(c.header(), "messages=6->2");
        let roles: Vec<&str> = o["messages"].as_array().into_iter().flatten().map(role).collect();
        assert_eq!(roles, ["system", "user"]);
        assert_eq!(o["custom_field"], json!({"keep": true}));
    }

    #[test]
    fn completions_only_cap_output() {
        let mut o = obj(json!({"model": "m", "prompt": "x".repeat(10_000), "max_tokens": 4000}));
        assert_eq!(reduce(&mut o, false, &limits()).header(), "max_tokens=4000->256");
        assert_eq!(o["prompt"].as_str().map(str::len), Some(10_000));
    }
}

#[cfg(test)]
mod properties {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    /// One conversation turn: a message, or a tool call with its results.
    fn turn() -> impl Strategy<Value = Vec<Value>> {
        let text = "[a-z ]{0,400}";
        prop_oneof![
            text.prop_map(|t| vec![json!({"role": "user", "content": t})]),
            text.prop_map(|t| vec![json!({"role": "assistant", "content": t, "x_vendor": 1})]),
            text.prop_map(|t| vec![json!({"role": "system", "content": t})]),
            (text, 1usize..3).prop_map(|(t, n)| {
                let calls: Vec<Value> = (0..n)
                    .map(|i| json!({"id": format!("call_{i}"), "type": "function", "function": {"name": "f", "arguments": "{}"}}))
                    .collect();
                let mut v = vec![json!({"role": "assistant", "content": null, "tool_calls": calls})];
                for i in 0..n {
                    v.push(json!({"role": "tool", "tool_call_id": format!("call_{i}"), "content": t.clone()}));
                }
                v
            }),
        ]
    }

    fn request() -> impl Strategy<Value = Value> {
        (
            prop::collection::vec(turn(), 0..12),
            prop::option::of(0u64..5000),
            prop::option::of(prop::collection::vec("[a-z]{0,50}", 0..8)),
            any::<bool>(),
        )
            .prop_map(|(turns, max_tokens, docs, extra)| {
                let mut o = json!({"model": "m", "messages": turns.concat(), "stream": true});
                if let Some(m) = max_tokens {
                    o["max_tokens"] = json!(m);
                }
                if let Some(d) = docs {
                    o["documents"] = json!(d.into_iter().map(|t| json!({"text": t})).collect::<Vec<_>>());
                }
                if extra {
                    o["guided_json"] = json!({"type": "object"});
                }
                o
            })
    }

    fn roles(v: &Value) -> Vec<String> {
        v["messages"].as_array().into_iter().flatten().map(|m| role(m).to_string()).collect()
    }

    /// Tool results whose call is not in the conversation, or calls without results.
    fn broken_tool_pairs(v: &Value) -> bool {
        let msgs = v["messages"].as_array().cloned().unwrap_or_default();
        let mut open: Vec<String> = Vec::new();
        for m in &msgs {
            if role(m) == "tool" {
                let id = m["tool_call_id"].as_str().unwrap_or("").to_string();
                match open.iter().position(|o| *o == id) {
                    Some(i) => {
                        open.remove(i);
                    }
                    None => return true,
                }
            } else {
                if !open.is_empty() {
                    return true;
                }
                if let Some(calls) = m["tool_calls"].as_array() {
                    open = calls.iter().filter_map(|c| c["id"].as_str().map(String::from)).collect();
                }
            }
        }
        !open.is_empty()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(500))]

        #[test]
        fn rewrite_is_valid_shorter_and_keeps_what_must_stay(input in request(), cap in 1u64..1024, docs in 0usize..5, budget in 0u64..600) {
            let limits = Limits { max_tokens_cap: cap, max_documents: docs, max_prompt_tokens: budget };
            let before = serde_json::to_vec(&input).expect("serialize");
            let mut o = input.as_object().cloned().expect("object");
            let changes = reduce(&mut o, true, &limits);
            let after = serde_json::to_vec(&Value::Object(o.clone())).expect("serialize");
            let out: Value = serde_json::from_slice(&after).expect("valid JSON");

            // Never longer, except for the max_tokens field it may add.
            let added = if input.get("max_tokens").is_none() { format!(",\"max_tokens\":{cap}").len() } else { 0 };
            prop_assert!(after.len() <= before.len() + added, "{} > {} + {}", after.len(), before.len(), added);
            prop_assert!(prompt_tokens(&o) <= prompt_tokens(input.as_object().expect("object")));
            prop_assert!(out["max_tokens"].as_u64().is_some_and(|m| m <= cap));

            // System messages and the last user message are all kept, in order.
            let sys_in: Vec<&Value> = input["messages"].as_array().into_iter().flatten().filter(|m| role(m) == "system").collect();
            let sys_out: Vec<&Value> = out["messages"].as_array().into_iter().flatten().filter(|m| role(m) == "system").collect();
            prop_assert_eq!(sys_in, sys_out);
            let last_user = |v: &Value| v["messages"].as_array().and_then(|a| a.iter().rev().find(|m| role(m) == "user").cloned());
            prop_assert_eq!(last_user(&input), last_user(&out));

            // Kept messages are a subsequence of the input; tool pairs are intact.
            let ins = input["messages"].as_array().cloned().unwrap_or_default();
            let mut it = ins.iter();
            for m in out["messages"].as_array().into_iter().flatten() {
                prop_assert!(it.any(|x| x == m), "not a subsequence");
            }
            prop_assert!(!broken_tool_pairs(&out), "tool pair split: {:?}", roles(&out));

            // Documents: the first ones, at most max_documents of them.
            if let Some(d) = input["documents"].as_array() {
                let kept = out["documents"].as_array().cloned().unwrap_or_default();
                prop_assert_eq!(&kept[..], &d[..d.len().min(docs)]);
            }
            // Fields it does not handle survive untouched.
            prop_assert_eq!(&out["stream"], &input["stream"]);
            prop_assert_eq!(&out["guided_json"], &input["guided_json"]);
            prop_assert_eq!(&out["model"], &input["model"]);
            // The header names every change and nothing else.
            prop_assert_eq!(changes.is_empty(), out == input);
        }
    }
}
