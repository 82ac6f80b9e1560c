//! A prompt's token ids as an engine computes them: chat messages
//! rendered with the model's chat template (as vLLM renders them, with the
//! generation prompt added), then tokenized with the model's
//! `tokenizer.json`; a completion's prompt tokenized as it is, with the
//! tokenizer's special tokens (vLLM adds the BOS there, and the template
//! writes its own for chat).
//!
//! The template is rendered as transformers renders it for vLLM: blocks
//! trimmed, `raise_exception`, `strftime_now` (in UTC) and a `tojson` that
//! writes as Python's `json.dumps`. What can differ from the engine, and
//! then costs a miss, never a wrong answer: a template that reads
//! variables vLLM sets and this does not (only `messages`,
//! `add_generation_prompt`, `bos_token`, `eos_token` and `tools` are
//! given), a request with tools or a per-request template, a server whose
//! local time zone is not UTC (`strftime_now`), and templates using Jinja
//! features outside what minijinja implements.

use std::path::{Path, PathBuf};

use minijinja::value::Serde;
use minijinja::{context, Environment};
use serde_json::Value;
use tokenizers::Tokenizer;

/// A model's tokenizer and chat template.
pub struct PromptTokens {
    tokenizer: Tokenizer,
    template: Option<Environment<'static>>,
    bos: String,
    eos: String,
}

impl std::fmt::Debug for PromptTokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PromptTokens").field("template", &self.template.is_some()).finish_non_exhaustive()
    }
}

/// transformers' `tojson`: Python's `json.dumps(x, ensure_ascii=False)`,
/// with its `", "` and `": "` separators (minijinja's own escapes HTML and
/// writes compact JSON: other text, other tokens).
fn tojson(v: minijinja::Value) -> Result<minijinja::Value, minijinja::Error> {
    struct Python;
    impl serde_json::ser::Formatter for Python {
        fn begin_array_value<W: ?Sized + std::io::Write>(&mut self, w: &mut W, first: bool) -> std::io::Result<()> {
            if first {
                Ok(())
            } else {
                w.write_all(b", ")
            }
        }
        fn begin_object_key<W: ?Sized + std::io::Write>(&mut self, w: &mut W, first: bool) -> std::io::Result<()> {
            if first {
                Ok(())
            } else {
                w.write_all(b", ")
            }
        }
        fn begin_object_value<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
            w.write_all(b": ")
        }
    }
    let mut out = Vec::new();
    let mut ser = serde_json::Serializer::with_formatter(&mut out, Python);
    serde::Serialize::serialize(&v, &mut ser).map_err(|e| minijinja::Error::new(minijinja::ErrorKind::InvalidOperation, e.to_string()))?;
    Ok(minijinja::Value::from_safe_string(String::from_utf8_lossy(&out).into_owned()))
}

fn now_unix() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or(0)
}

/// A Unix time in UTC as (year, month, day, seconds into the day): days
/// since 1970-01-01 to a civil date by Howard Hinnant's algorithm.
pub fn civil(unix: i64) -> (i64, i64, i64, i64) {
    let days = unix.div_euclid(86_400);
    let secs = unix.rem_euclid(86_400);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + i64::from(month <= 2), month, day, secs)
}

/// transformers' `strftime_now` (Llama 3's templates write today's date
/// into the system header with it), in UTC: `%d %m %Y %y %b %B %H %M %S %j
/// %%`; other directives are written as they are.
fn strftime(format: &str, unix: i64) -> String {
    const MONTHS: [&str; 12] =
        ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October", "November", "December"];
    let (year, month, day, secs) = civil(unix);
    let leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
    let before: [i64; 12] = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];
    let yday = before[(month - 1) as usize] + day + i64::from(leap && month > 2);
    let name = MONTHS[(month - 1) as usize];
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('d') => out.push_str(&format!("{day:02}")),
            Some('m') => out.push_str(&format!("{month:02}")),
            Some('Y') => out.push_str(&year.to_string()),
            Some('y') => out.push_str(&format!("{:02}", year % 100)),
            Some('b') => out.push_str(&name[..3]),
            Some('B') => out.push_str(name),
            Some('H') => out.push_str(&format!("{:02}", secs / 3600)),
            Some('M') => out.push_str(&format!("{:02}", secs / 60 % 60)),
            Some('S') => out.push_str(&format!("{:02}", secs % 60)),
            Some('j') => out.push_str(&format!("{yday:03}")),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

/// `tokenizer_config.json`'s special tokens are a string or `{content: ...}`.
fn token_text(v: Option<&Value>) -> String {
    match v {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Object(o)) => o.get("content").and_then(Value::as_str).unwrap_or_default().to_string(),
        _ => String::new(),
    }
}

impl PromptTokens {
    /// Load `tokenizer` (a `tokenizer.json`) and the chat template: from
    /// `template` (a Jinja file) if given, else from beside the tokenizer
    /// as Hugging Face saves it (`chat_template.jinja`, else
    /// `tokenizer_config.json`'s `chat_template`). Without a template, chat
    /// prompts are not tokenized (routed by estimate).
    pub fn load(tokenizer: &Path, template: Option<&Path>) -> Result<PromptTokens, String> {
        let tok = Tokenizer::from_file(tokenizer).map_err(|e| format!("{}: {e}", tokenizer.display()))?;
        let config_path: PathBuf = tokenizer.with_file_name("tokenizer_config.json");
        let config: Option<Value> = std::fs::read(&config_path).ok().and_then(|b| serde_json::from_slice(&b).ok());
        let beside = tokenizer.with_file_name("chat_template.jinja");
        let source = match template {
            Some(p) => Some(std::fs::read_to_string(p).map_err(|e| format!("{}: {e}", p.display()))?),
            // Hugging Face writes the template into a file of its own now, into the config before.
            None if beside.is_file() => Some(std::fs::read_to_string(&beside).map_err(|e| format!("{}: {e}", beside.display()))?),
            None => config.as_ref().and_then(|c| match c.get("chat_template") {
                Some(Value::String(s)) => Some(s.clone()),
                // A list of named templates: the default one.
                Some(Value::Array(named)) => named
                    .iter()
                    .find(|t| t.get("name").and_then(Value::as_str) == Some("default"))
                    .and_then(|t| t.get("template")?.as_str().map(str::to_string)),
                _ => None,
            }),
        };
        let template = match source {
            Some(src) => {
                let mut env = Environment::new();
                // As transformers compiles chat templates (and vLLM through it).
                let syntax = minijinja::syntax::SyntaxConfig::builder().trim_blocks(true).lstrip_blocks(true).build();
                env.set_syntax(syntax.map_err(|e| format!("chat template: {e}"))?);
                minijinja_contrib::add_to_environment(&mut env);
                env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
                env.add_function("raise_exception", |msg: String| -> Result<String, minijinja::Error> {
                    Err(minijinja::Error::new(minijinja::ErrorKind::InvalidOperation, msg))
                });
                env.add_function("strftime_now", |format: String| strftime(&format, now_unix()));
                env.add_filter("tojson", tojson);
                env.add_template_owned("chat", src).map_err(|e| format!("chat template: {e}"))?;
                Some(env)
            }
            None => None,
        };
        let bos = token_text(config.as_ref().and_then(|c| c.get("bos_token")));
        let eos = token_text(config.as_ref().and_then(|c| c.get("eos_token")));
        Ok(PromptTokens { tokenizer: tok, template, bos, eos })
    }

    /// The token ids of a chat request's `messages` (the JSON array as the
    /// client sent it); `None` where they cannot be rendered.
    pub fn of_messages(&self, messages: &[u8]) -> Option<Vec<u32>> {
        let env = self.template.as_ref()?;
        let messages: Value = serde_json::from_slice(messages).ok()?;
        let text = env
            .get_template("chat")
            .ok()?
            .render(context! {
                messages => minijinja::Value::from(Serde(&messages)),
                add_generation_prompt => true,
                bos_token => self.bos.as_str(),
                eos_token => self.eos.as_str(),
                tools => minijinja::Value::from(()),
            })
            .ok()?;
        let enc = self.tokenizer.encode_fast(text, false).ok()?;
        Some(enc.get_ids().to_vec())
    }

    /// The token ids of a completion's `prompt` (its JSON): a text, or
    /// token ids as they are; `None` for several prompts in one request.
    pub fn of_prompt(&self, prompt: &[u8]) -> Option<Vec<u32>> {
        match serde_json::from_slice::<Value>(prompt).ok()? {
            Value::String(text) => self.of_text(&text),
            Value::Array(ids) => ids.iter().map(|t| t.as_u64().and_then(|t| u32::try_from(t).ok())).collect(),
            _ => None,
        }
    }

    /// The token ids of a text, with the tokenizer's special tokens (the
    /// BOS a completion's prompt gets).
    pub fn of_text(&self, text: &str) -> Option<Vec<u32>> {
        let enc = self.tokenizer.encode_fast(text, true).ok()?;
        Some(enc.get_ids().to_vec())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Written by scripts/prompt_tokens_fixtures.py with Hugging Face's
    /// transformers: a small BPE tokenizer, a Llama-3-style template, and
    /// the ids transformers gives.
    fn fixtures() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tokenizer")
    }

    fn ids(v: &Value) -> Vec<u32> {
        serde_json::from_value(v.clone()).expect("ids")
    }

    #[test]
    fn chat_and_completion_prompts_tokenize_as_hugging_face_does() {
        let t = PromptTokens::load(&fixtures().join("tokenizer.json"), None).expect("loads");
        let expected: Value = serde_json::from_slice(&std::fs::read(fixtures().join("expected.json")).expect("reads")).expect("json");
        let chats = expected["chats"].as_array().expect("chats");
        assert!(chats.len() >= 3);
        for c in chats {
            let messages = serde_json::to_vec(&c["messages"]).expect("json");
            assert_eq!(t.of_messages(&messages), Some(ids(&c["ids"])), "{}", c["messages"]);
        }
        for p in expected["prompts"].as_array().expect("prompts") {
            let prompt = serde_json::to_vec(&p["prompt"]).expect("json");
            assert_eq!(t.of_prompt(&prompt), Some(ids(&p["ids"])), "{}", p["prompt"]);
        }
        // Token ids are the prompt; several prompts in one request are not routed on.
        assert_eq!(t.of_prompt(b"[1, 2, 3]"), Some(vec![1, 2, 3]));
        assert_eq!(t.of_prompt(br#"["a", "b"]"#), None);
        // A template that raises (a role it does not know) gives no tokens, not a guess.
        assert_eq!(t.of_messages(br#"[{"role": "tool", "content": "x"}]"#), None);
        assert_eq!(t.of_messages(b"not json"), None);
    }

    #[test]
    fn strftime_now_writes_dates_as_pythons_strftime() {
        // 2024-07-26 13:05:09 UTC, and a leap day.
        assert_eq!(strftime("%d %b %Y", 1_721_999_109), "26 Jul 2024");
        assert_eq!(strftime("%Y-%m-%d %H:%M:%S %j %B %y %%", 1_721_999_109), "2024-07-26 13:05:09 208 July 24 %");
        assert_eq!(strftime("%d %b %Y", 1_709_164_800), "29 Feb 2024");
        assert_eq!(strftime("%d %b %Y", 0), "01 Jan 1970");
    }

    #[test]
    fn tojson_writes_as_pythons_json_dumps() {
        let v = minijinja::Value::from(Serde(serde_json::json!({"name": "get_weather", "args": [1, "日本 <b>"]})));
        assert_eq!(tojson(v).expect("json").to_string(), r#"{"name": "get_weather", "args": [1, "日本 <b>"]}"#);
    }

    #[test]
    fn a_tokenizer_that_cannot_be_read_is_named_in_the_error() {
        let e = PromptTokens::load(Path::new("/nonexistent/tokenizer.json"), None).expect_err("no file");
        assert!(e.contains("/nonexistent/tokenizer.json"), "{e}");
        let dir = tempfile::tempdir().expect("tempdir");
        let bad = dir.path().join("tokenizer.json");
        std::fs::write(&bad, b"{}").expect("writes");
        assert!(PromptTokens::load(&bad, None).is_err());
        // Without a template, chat prompts are not tokenized; completions are.
        std::fs::copy(fixtures().join("tokenizer.json"), &bad).expect("copies");
        let t = PromptTokens::load(&bad, None).expect("loads");
        assert_eq!(t.of_messages(br#"[{"role": "user", "content": "hi"}]"#), None);
        assert!(t.of_prompt(br#""hi""#).is_some());
    }
}
