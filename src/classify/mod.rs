//! Classification: who is calling (API key, hence tenant) and which SLO
//! class the request runs under (`x-slo-class`, else the key's first class,
//! else `default_class`). Keys are compared as SHA-256 digests in constant
//! time and never logged. Without keys every caller is one tenant,
//! `anonymous`, or, behind the Inference Extension, its fairness id's
//! (docs/endpoint-picker.md, rule 10).

pub(crate) mod grant;

use std::sync::Arc;
use std::time::Duration;

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::admission::{ClassControl, Controls};
use crate::config::{Config, Endpoint, TenantConfig, Tier};
use crate::error::GatewayError;
use crate::limits::tenants::ANONYMOUS;
use crate::limits::{Tenant, Tenants};

pub(crate) use grant::Grant;

/// The header a caller names its class with. (A name, not a `&str`:
/// looked up with a string, it is parsed again at every request.)
const X_SLO_CLASS: http::HeaderName = http::HeaderName::from_static("x-slo-class");

/// A class as the request path needs it.
#[derive(Clone)]
pub(crate) struct Class {
    pub(crate) name: Arc<str>,
    /// Its name as the `x-slogate-class` response header's value, made
    /// once (`None` for a name that is no header value: not sent).
    pub(crate) header: Option<http::HeaderValue>,
    pub(crate) tier: Tier,
    pub(crate) ttft: Duration,
    pub(crate) itl: Duration,
    /// Its rolling windows, breaker and reduction trigger.
    pub(crate) control: Arc<ClassControl>,
}

impl std::fmt::Debug for Class {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Class").field("name", &self.name).field("tier", &self.tier).finish()
    }
}

/// One configured API key, stored only as its digest.
pub(crate) struct ApiKey {
    digest: [u8; 32],
    /// Allowed classes, in the configured order (the first is the default).
    pub(crate) classes: Vec<Arc<Class>>,
    pub(crate) tenant: Arc<Tenant>,
    pub(crate) grant: Arc<Grant>,
}

/// Who a request is for: its class, its tenant, and what its key may use.
#[derive(Debug, Clone)]
pub(crate) struct Caller {
    pub(crate) class: Arc<Class>,
    pub(crate) tenant: Arc<Tenant>,
    pub(crate) grant: Arc<Grant>,
}

/// The flow the Inference Extension put a request in
/// (`x-llm-d-inference-fairness-id`), as a request extension.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct FairnessId(Box<str>);

impl FairnessId {
    /// The id a header value carries: printable ASCII, at most 128 bytes
    /// once trimmed; anything else is no id.
    pub(crate) fn of(v: &http::HeaderValue) -> Option<FairnessId> {
        let s = v.to_str().ok()?.trim();
        let fits = !s.is_empty() && s.len() <= 128 && s.bytes().all(|b| b.is_ascii_graphic());
        fits.then(|| FairnessId(s.into()))
    }
}

/// Why a config's keys or classes cannot be used (the config parsed, but
/// something it names is not there).
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("default_class `{0}` is not a class")]
    DefaultClass(String),
    #[error("auth key `{key}`: environment variable {var} is not set")]
    EnvUnset {
        key: String,
        var: String,
        #[source]
        source: std::env::VarError,
    },
    #[error("auth key `{key}`: key_sha256 is not hex")]
    NotHex {
        key: String,
        #[source]
        source: hex::FromHexError,
    },
    #[error("auth key `{key}`: key_sha256 must be 32 bytes")]
    DigestLength { key: String },
    #[error("auth key `{key}` has no key")]
    NoKey { key: String },
    #[error("auth key `{key}`: unknown class `{class}`")]
    UnknownClass { key: String, class: String },
}

/// The token the admin listener requires (`server.admin_token_env`), kept
/// as its SHA-256 digest and compared in constant time.
pub(crate) struct AdminToken {
    digest: [u8; 32],
    /// `Bearer <token>`, marked sensitive: what this instance sends to its fleet peers.
    bearer: Option<http::HeaderValue>,
}

impl AdminToken {
    /// The token in environment variable `var`; `None` when it is unset or empty.
    pub(crate) fn from_env(var: &str) -> Option<AdminToken> {
        std::env::var(var).ok().filter(|t| !t.trim().is_empty()).map(|t| {
            let t = t.trim();
            let bearer = http::HeaderValue::from_str(&format!("Bearer {t}")).ok().map(|mut v| {
                v.set_sensitive(true);
                v
            });
            AdminToken { digest: Sha256::digest(t.as_bytes()).into(), bearer }
        })
    }

    /// The `Authorization` value that carries this token.
    pub(crate) fn bearer(&self) -> Option<&http::HeaderValue> {
        self.bearer.as_ref()
    }

    /// Does the request carry the token as `Authorization: Bearer`?
    pub(crate) fn admits(&self, headers: &http::HeaderMap) -> bool {
        bearer(headers).is_some_and(|t| bool::from(self.digest.ct_eq(&<[u8; 32]>::from(Sha256::digest(t.as_bytes())))))
    }
}

/// The token of LiteLLM's `x-litellm-api-key` (with or without `Bearer `:
/// it comes first, as LiteLLM reads it, since `Authorization` may then
/// carry something else), else of `Authorization: Bearer <token>`, else of
/// `x-api-key` (how Anthropic's SDKs send a key).
fn bearer(headers: &http::HeaderMap) -> Option<&str> {
    headers
        .get(X_LITELLM_API_KEY)
        .and_then(|v| v.to_str().ok())
        .map(|v| without_scheme(v).unwrap_or(v))
        .or_else(|| headers.get(http::header::AUTHORIZATION).and_then(|v| v.to_str().ok()).and_then(without_scheme))
        .or_else(|| headers.get(X_API_KEY).and_then(|v| v.to_str().ok()))
        .map(str::trim)
}

fn without_scheme(v: &str) -> Option<&str> {
    v.strip_prefix("Bearer ").or_else(|| v.strip_prefix("bearer "))
}

const X_API_KEY: http::HeaderName = http::HeaderName::from_static("x-api-key");
const X_LITELLM_API_KEY: http::HeaderName = http::HeaderName::from_static("x-litellm-api-key");

/// A configured key as `/key/info` shows it.
pub(crate) struct KeyView {
    /// Its SHA-256, hex (what LiteLLM calls the key's token).
    pub(crate) token: String,
    pub(crate) tenant: Arc<Tenant>,
    pub(crate) grant: Arc<Grant>,
}

/// Everything classification needs, built once per config snapshot.
pub(crate) struct Classifier {
    classes: Vec<Arc<Class>>,
    default_class: Arc<Class>,
    /// The class of a request that names none, by endpoint kind.
    endpoint_classes: Vec<(Endpoint, Arc<Class>)>,
    keys: Vec<ApiKey>,
    /// Every caller's tenant when there are no keys, and its grant (everything).
    anonymous: Arc<Tenant>,
    anonymous_grant: Arc<Grant>,
    /// The tenants of this config with their settings (installed with it).
    tenants: Vec<(Arc<Tenant>, TenantConfig)>,
    /// Every tenant known (fairness ids' tenants are made there).
    registry: Arc<Tenants>,
}

impl Classifier {
    /// Build the classifier of `config`. Checks every key first and fails
    /// before anything is built; the class controls it takes are prepared,
    /// not installed (see [`Controls::prepare`]).
    pub(crate) fn new(config: &Config, controls: &Controls) -> Result<Classifier, KeyError> {
        if !config.classes.contains_key(&config.default_class) {
            return Err(KeyError::DefaultClass(config.default_class.clone()));
        }
        let mut digests = Vec::with_capacity(config.auth.keys.len());
        for k in &config.auth.keys {
            let digest: [u8; 32] = match (&k.key_env, &k.key_sha256) {
                (Some(env), _) => {
                    let v = std::env::var(env).map_err(|source| KeyError::EnvUnset { key: k.name.clone(), var: env.clone(), source })?;
                    // Trimmed, as a caller's bearer token is: a key file's
                    // trailing newline must not make the key unusable.
                    Sha256::digest(v.trim().as_bytes()).into()
                }
                (None, Some(h)) => {
                    let raw = hex::decode(h).map_err(|source| KeyError::NotHex { key: k.name.clone(), source })?;
                    raw.try_into().map_err(|_| KeyError::DigestLength { key: k.name.clone() })?
                }
                (None, None) => return Err(KeyError::NoKey { key: k.name.clone() }),
            };
            if let Some(c) = k.classes.iter().find(|c| !config.classes.contains_key(*c)) {
                return Err(KeyError::UnknownClass { key: k.name.clone(), class: c.clone() });
            }
            digests.push(digest);
        }
        let classes: Vec<Arc<Class>> = config
            .classes
            .iter()
            .map(|(name, c)| {
                Arc::new(Class {
                    name: name.as_str().into(),
                    header: http::HeaderValue::from_str(name).ok(),
                    tier: c.tier,
                    ttft: c.ttft.get(),
                    itl: c.itl.get(),
                    control: controls.prepare(name, c, config),
                })
            })
            .collect();
        let find = |n: &str| classes.iter().find(|c| &*c.name == n).cloned();
        let Some(default_class) = find(&config.default_class) else {
            return Err(KeyError::DefaultClass(config.default_class.clone()));
        };
        let endpoint_classes =
            Endpoint::ALL.iter().filter_map(|e| config.endpoint_class(*e).and_then(|c| find(&c)).map(|c| (*e, c))).collect();
        let keys: Vec<ApiKey> = config
            .auth
            .keys
            .iter()
            .zip(digests)
            .map(|(k, digest)| ApiKey {
                digest,
                classes: k.classes.iter().filter_map(|c| find(c)).collect(),
                tenant: controls.tenants.prepare(&k.name, &k.tenant()),
                grant: Arc::new(Grant::of(k, config.auth.cache_isolation)),
            })
            .collect();
        let anonymous = controls.tenants.prepare(ANONYMOUS, &TenantConfig::default());
        let tenants = if keys.is_empty() {
            vec![(anonymous.clone(), TenantConfig::default())]
        } else {
            keys.iter().zip(&config.auth.keys).map(|(k, c)| (k.tenant.clone(), c.tenant())).collect()
        };
        let anonymous_grant = Arc::new(Grant::all(ANONYMOUS));
        let registry = controls.tenants.clone();
        Ok(Classifier { classes, default_class, endpoint_classes, keys, anonymous, anonymous_grant, tenants, registry })
    }

    /// The tenants callers can be, with their weights and limits.
    pub(crate) fn tenants(&self) -> &[(Arc<Tenant>, TenantConfig)] {
        &self.tenants
    }

    /// Are callers authenticated by slogate's own keys?
    pub(crate) fn has_keys(&self) -> bool {
        !self.keys.is_empty()
    }

    pub(crate) fn classes(&self) -> &[Arc<Class>] {
        &self.classes
    }

    pub(crate) fn class(&self, name: &str) -> Option<&Arc<Class>> {
        self.classes.iter().find(|c| &*c.name == name)
    }

    /// With `auth.keys`: the caller's key must be one of them (listing the
    /// models needs a key like any other call); what it may use. Without
    /// keys, anyone, with everything.
    pub(crate) fn authenticate(&self, headers: &http::HeaderMap) -> Result<Arc<Grant>, GatewayError> {
        if self.keys.is_empty() {
            return Ok(self.anonymous_grant.clone());
        }
        self.key_of(headers).map(|k| k.grant.clone())
    }

    /// The configured key the request carries, for `/key/info`
    /// (401 without one, or without keys configured).
    pub(crate) fn key_view(&self, headers: &http::HeaderMap) -> Result<KeyView, GatewayError> {
        let k = self.key_of(headers)?;
        let token = k.digest.iter().map(|b| format!("{b:02x}")).collect();
        Ok(KeyView { token, tenant: k.tenant.clone(), grant: k.grant.clone() })
    }

    /// The configured key the request's `Authorization: Bearer` carries.
    fn key_of(&self, headers: &http::HeaderMap) -> Result<&ApiKey, GatewayError> {
        let token = bearer(headers).ok_or(GatewayError::Unauthorized)?;
        let digest: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        // Compare against every key so timing does not reveal which matched.
        let mut found: Option<&ApiKey> = None;
        for k in &self.keys {
            if bool::from(k.digest.ct_eq(&digest)) {
                found = Some(k);
            }
        }
        found.ok_or(GatewayError::Unauthorized)
    }

    /// Decide the class and the tenant of a request from its headers.
    pub(crate) fn classify(&self, headers: &http::HeaderMap, endpoint: Endpoint) -> Result<Caller, GatewayError> {
        self.classify_flow(headers, endpoint, None)
    }

    /// As [`Classifier::classify`], for a request in the Inference
    /// Extension's flow `flow`: without keys, the flow is its tenant; with
    /// keys, the key is (a header cannot move a caller into another's share).
    pub(crate) fn classify_flow(
        &self,
        headers: &http::HeaderMap,
        endpoint: Endpoint,
        flow: Option<&FairnessId>,
    ) -> Result<Caller, GatewayError> {
        let wanted = headers.get(X_SLO_CLASS).map(|v| v.to_str().map(str::trim).unwrap_or(""));
        let by_endpoint = self.endpoint_classes.iter().find(|(e, _)| *e == endpoint).map(|(_, c)| c);
        if self.keys.is_empty() {
            let class = match wanted {
                None => by_endpoint.unwrap_or(&self.default_class).clone(),
                Some(n) => self.class(n).cloned().ok_or_else(|| GatewayError::UnknownClass(n.to_string()))?,
            };
            let tenant = flow.map_or_else(|| self.anonymous.clone(), |f| self.registry.flow(&f.0));
            return Ok(Caller { class, tenant, grant: self.anonymous_grant.clone() });
        }
        let key = self.key_of(headers)?;
        let class = match wanted {
            // The endpoint's class if the key may use it, else the key's first.
            None => by_endpoint
                .filter(|c| key.classes.iter().any(|k| Arc::ptr_eq(k, c)))
                .or(key.classes.first())
                .cloned()
                .ok_or(GatewayError::Unauthorized)?,
            Some(n) => {
                if self.class(n).is_none() {
                    return Err(GatewayError::UnknownClass(n.to_string()));
                }
                key.classes.iter().find(|c| &*c.name == n).cloned().ok_or_else(|| GatewayError::ClassForbidden(n.to_string()))?
            }
        };
        Ok(Caller { class, tenant: key.tenant.clone(), grant: key.grant.clone() })
    }
}
