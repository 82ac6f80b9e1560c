//! What a key may use: its models (`auth.keys[].models`, names or `*`
//! patterns) and its endpoint kinds (`auth.keys[].endpoints`). A gateway
//! without keys grants everything to its one caller, `anonymous`.

use std::sync::Arc;

use crate::config::{Endpoint, KeyConfig};
use crate::error::GatewayError;

/// One caller's permissions, built once per config snapshot.
#[derive(Debug)]
pub(crate) struct Grant {
    /// The key's name (`anonymous` without keys): what `pools[].extra_paths` names.
    pub(crate) key: Arc<str>,
    /// `None`: every model.
    models: Option<Vec<String>>,
    /// `None`: every kind.
    endpoints: Option<Vec<Endpoint>>,
    /// The `cache_salt` its requests carry when its cache is kept apart.
    pub(crate) cache_salt: Option<Arc<str>>,
}

impl Grant {
    /// Everything, for `key`.
    pub(crate) fn all(key: &str) -> Grant {
        Grant { key: key.into(), models: None, endpoints: None, cache_salt: None }
    }

    /// Key `k`'s grant; `isolate`: `auth.cache_isolation`, where the key names none.
    pub(crate) fn of(k: &KeyConfig, isolate: bool) -> Grant {
        let cache_salt = k.cache_isolation.unwrap_or(isolate).then(|| salt_of(&k.name));
        Grant { key: k.name.as_str().into(), models: k.models.clone(), endpoints: k.endpoints.clone(), cache_salt }
    }

    /// The models (names or patterns) it may use; `None`: every one.
    pub(crate) fn models(&self) -> Option<&[String]> {
        self.models.as_deref()
    }

    /// May the key use `model`?
    pub(crate) fn allows_model(&self, model: &str) -> bool {
        self.models.as_ref().is_none_or(|ms| ms.iter().any(|p| matches(p, model)))
    }

    /// The model check of the request path: 403 `model_not_allowed`, naming it.
    pub(crate) fn model(&self, model: &str) -> Result<(), GatewayError> {
        if self.allows_model(model) {
            Ok(())
        } else {
            Err(GatewayError::ModelNotAllowed(model.to_string()))
        }
    }

    /// The endpoint check: 403 `endpoint_not_allowed`.
    pub(crate) fn endpoint(&self, e: Endpoint) -> Result<(), GatewayError> {
        if self.endpoints.as_ref().is_none_or(|es| es.contains(&e)) {
            Ok(())
        } else {
            Err(GatewayError::EndpointNotAllowed(e.as_str()))
        }
    }
}

/// The `cache_salt` of key `name`: its own, the same on every gateway of
/// a fleet and across restarts (a replica's cache stays warm for it), and
/// never one a caller chose (the gateway sets it on every request).
fn salt_of(name: &str) -> Arc<str> {
    use sha2::{Digest, Sha256};
    let digest = Sha256::digest(format!("slogate cache_salt\0{name}").as_bytes());
    format!("slogate-{}", hex::encode(&digest[..16])).into()
}

/// Does `name` match `pattern`, where `*` stands for any run of characters
/// (none included) and everything else for itself?
pub(crate) fn matches(pattern: &str, name: &str) -> bool {
    let mut parts = pattern.split('*');
    let first = parts.next().unwrap_or_default();
    let Some(mut rest) = name.strip_prefix(first) else { return false };
    let mut parts: Vec<&str> = parts.collect();
    let Some(last) = parts.pop() else { return rest.is_empty() };
    for p in parts {
        match rest.find(p) {
            Some(i) => rest = &rest[i + p.len()..],
            None => return false,
        }
    }
    rest.len() >= last.len() && rest.ends_with(last)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_match_names_and_stars() {
        let cases = [
            ("llama-8b", "llama-8b", true),
            ("llama-8b", "llama-8b-instruct", false),
            ("llama-*", "llama-8b", true),
            ("llama-*", "llama-", true),
            ("llama-*", "mistral", false),
            ("*", "anything", true),
            ("*-instruct", "qwen-7b-instruct", true),
            ("*-instruct", "qwen-7b", false),
            ("a*b*c", "a-x-b-y-c", true),
            ("a*b*c", "a-x-c-y-b", false),
            ("a*a", "a", false),
            ("a*a", "aa", true),
        ];
        for (p, n, want) in cases {
            assert_eq!(matches(p, n), want, "{p} ~ {n}");
        }
    }

    #[test]
    fn a_grant_checks_models_and_endpoints() {
        let g =
            Grant { key: "k".into(), models: Some(vec!["small-*".into()]), endpoints: Some(vec![Endpoint::Embeddings]), cache_salt: None };
        assert!(g.model("small-1").is_ok());
        assert!(matches!(g.model("big"), Err(GatewayError::ModelNotAllowed(m)) if m == "big"));
        assert!(g.endpoint(Endpoint::Embeddings).is_ok());
        assert!(matches!(g.endpoint(Endpoint::Chat), Err(GatewayError::EndpointNotAllowed("chat"))));
        let all = Grant::all("anonymous");
        assert!(all.model("x").is_ok() && all.endpoint(Endpoint::Speech).is_ok());
    }

    #[test]
    fn each_isolated_key_has_a_salt_of_its_own() {
        let (a, b) = (salt_of("team-a"), salt_of("team-b"));
        assert_ne!(a, b);
        assert_eq!(a, salt_of("team-a"), "the same on every gateway and restart");
        assert!(a.starts_with("slogate-") && a.len() == 40, "{a}");
    }
}
