//! Who may do what: API keys (their classes, weight, models, endpoints and
//! limits), where keys' limits are kept, and the paths a pool opens beyond
//! the inference endpoints. The rules are in docs/access.md.

use serde::{Deserialize, Serialize};

use super::units::Dur;

/// One path opened on a pool (`pools[].extra_paths`), for `keys` only.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ExtraPath {
    /// The exact path, e.g. `/v1/load_lora_adapter` (POST).
    pub path: String,
    /// Names of `auth.keys` that may call it (`anonymous` when the gateway has no keys).
    pub keys: Vec<String>,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuthConfig {
    pub keys: Vec<KeyConfig>,
    /// More keys, in the same format (a list), read with the config and
    /// re-read at every reload; a relative path is the config file's sibling.
    pub keys_file: Option<std::path::PathBuf>,
    /// Output tokens reserved against a key's `tokens_per_minute` for a
    /// request that names no `max_tokens` or `max_completion_tokens`.
    pub default_max_tokens: u64,
    /// Every key's `cache_isolation` where it names none.
    pub cache_isolation: bool,
    /// How many of `keys` came from `keys_file` (the last ones).
    #[serde(skip)]
    pub from_file: usize,
}

impl Default for AuthConfig {
    fn default() -> Self {
        AuthConfig { keys: Vec::new(), keys_file: None, default_max_tokens: 1024, cache_isolation: false, from_file: 0 }
    }
}

impl AuthConfig {
    /// Where key `i` was configured, for messages: `auth.keys[i]` or `auth.keys_file[j]`.
    pub fn key_field(&self, i: usize) -> String {
        let own = self.keys.len() - self.from_file.min(self.keys.len());
        if i < own {
            format!("auth.keys[{i}]")
        } else {
            format!("auth.keys_file[{}]", i - own)
        }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct KeyConfig {
    pub name: String,
    #[serde(default)]
    pub key_env: Option<String>,
    #[serde(default)]
    pub key_sha256: Option<String>,
    pub classes: Vec<String>,
    /// Its share of a tier against the other keys' when slots are short.
    #[serde(default = "one")]
    pub weight: f64,
    #[serde(default)]
    pub limits: Option<KeyLimitsConfig>,
    /// Models the key may use: names, or patterns where `*` stands for any
    /// run of characters (`llama-3.1-8b*`). Left out: every model.
    #[serde(default)]
    pub models: Option<Vec<String>>,
    /// Endpoint kinds the key may call (`chat`, `completions`, `responses`, `messages`,
    /// `embeddings`, `rerank`, `transcription`, `speech`, `tokenize`,
    /// `other`). Left out: every kind.
    #[serde(default)]
    pub endpoints: Option<Vec<Endpoint>>,
    /// Keep its prompts' cache apart from other keys': every request it
    /// sends carries a `cache_salt` of the gateway's (its own replaced), and
    /// the prefix index keys its prompts apart. Left out: `auth.cache_isolation`.
    #[serde(default)]
    pub cache_isolation: Option<bool>,
}

/// The kinds of work the data plane forwards: the `endpoint` of access log
/// lines, and what `auth.keys[].endpoints` names. A closed set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Endpoint {
    /// `/v1/chat/completions`
    Chat,
    /// `/v1/completions`
    Completions,
    /// `/v1/responses`
    Responses,
    /// `/v1/messages` (Anthropic's Messages API, as vLLM serves it)
    Messages,
    /// `/v1/embeddings`
    Embeddings,
    /// `/rerank`, `/v1/rerank`, `/v2/rerank`, `/score`, `/v1/score`
    Rerank,
    /// `/v1/audio/transcriptions`, `/v1/audio/translations`
    Transcription,
    /// `/v1/audio/speech`
    Speech,
    /// `/tokenize`, `/detokenize`
    Tokenize,
    /// `/pooling`, `/classify`, and paths opened with `pools[].extra_paths`
    Other,
}

impl Endpoint {
    /// The kind of an inference path (POST, routed by the body's `model`);
    /// `None`: not one slogate forwards on its own.
    pub fn of_path(path: &str) -> Option<Endpoint> {
        Some(match path {
            "/v1/chat/completions" => Endpoint::Chat,
            "/v1/completions" => Endpoint::Completions,
            "/v1/responses" => Endpoint::Responses,
            "/v1/messages" => Endpoint::Messages,
            "/v1/embeddings" => Endpoint::Embeddings,
            "/rerank" | "/v1/rerank" | "/v2/rerank" | "/score" | "/v1/score" => Endpoint::Rerank,
            "/v1/audio/transcriptions" | "/v1/audio/translations" => Endpoint::Transcription,
            "/v1/audio/speech" => Endpoint::Speech,
            "/tokenize" | "/detokenize" | "/v1/messages/count_tokens" => Endpoint::Tokenize,
            "/pooling" | "/classify" => Endpoint::Other,
            _ => return None,
        })
    }

    pub const ALL: [Endpoint; 10] = [
        Endpoint::Chat,
        Endpoint::Completions,
        Endpoint::Responses,
        Endpoint::Messages,
        Endpoint::Embeddings,
        Endpoint::Rerank,
        Endpoint::Transcription,
        Endpoint::Speech,
        Endpoint::Tokenize,
        Endpoint::Other,
    ];

    /// Work a replica does in milliseconds, beside its streams: embeddings,
    /// rerank and score, tokenize. It does not wait behind streams for a slot.
    pub fn is_short(self) -> bool {
        matches!(self, Endpoint::Embeddings | Endpoint::Rerank | Endpoint::Tokenize)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Endpoint::Chat => "chat",
            Endpoint::Completions => "completions",
            Endpoint::Responses => "responses",
            Endpoint::Messages => "messages",
            Endpoint::Embeddings => "embeddings",
            Endpoint::Rerank => "rerank",
            Endpoint::Transcription => "transcription",
            Endpoint::Speech => "speech",
            Endpoint::Tokenize => "tokenize",
            Endpoint::Other => "other",
        }
    }
}

fn one() -> f64 {
    1.0
}

impl KeyConfig {
    /// What the tenant behind this key is.
    pub fn tenant(&self) -> TenantConfig {
        TenantConfig { weight: self.weight, limits: self.limits }
    }
}

/// Where keys' limits are kept. Without `redis` each instance enforces its
/// part of a key's limits (the limit over the live instances of the fleet);
/// with it every gateway naming the same server counts against one total.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct LimitsConfig {
    /// `redis://[user:password@]host:port[/db]` (Redis or Valkey; no TLS, no cluster).
    pub redis: Option<String>,
    /// An environment variable holding the server's password (AUTH).
    pub password_env: Option<String>,
    /// A request's limit check waits at most this for the server; past it
    /// (or while the server is down) the instance's own part is enforced.
    pub timeout: Dur,
    /// The server's keys start with this (`PREFIX:key:NAME:requests`, ...).
    pub key_prefix: String,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        LimitsConfig { redis: None, password_env: None, timeout: Dur::millis(50), key_prefix: "slogate".into() }
    }
}

/// A key's own limits (`auth.keys[].limits`); each is optional.
#[derive(Debug, Clone, Copy, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct KeyLimitsConfig {
    pub requests_per_minute: Option<u64>,
    pub tokens_per_minute: Option<u64>,
    pub max_concurrent: Option<u64>,
    /// Quotas over a calendar day and month (UTC): reserved at admission,
    /// settled to the replica's usage at the end, like the minute's.
    pub requests_per_day: Option<u64>,
    pub tokens_per_day: Option<u64>,
    pub requests_per_month: Option<u64>,
    pub tokens_per_month: Option<u64>,
}

/// A tenant's weight and limits: a key's, or the anonymous caller's (weight 1, no limits).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TenantConfig {
    pub weight: f64,
    pub limits: Option<KeyLimitsConfig>,
}

impl Default for TenantConfig {
    fn default() -> Self {
        TenantConfig { weight: 1.0, limits: None }
    }
}
