//! The request id: one name for a request in the caller's hands, slogate's
//! access log and spans, and the replica's own logs (vLLM takes
//! `X-Request-Id` as its request id).
//!
//! A caller's `x-request-id` is kept when it is well-formed: 1 to 128
//! characters of letters, digits and `-_.:/+=@`, and not carrying the
//! caller's own key (a key never reaches a log). Anything else gets a new
//! id: 32 hex digits, a random per-process half and a mixed counter, unique
//! without coordination.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

use http::{HeaderMap, HeaderName, HeaderValue};

pub(crate) const X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// The longest caller id kept.
const MAX_LEN: usize = 128;

/// The id of the request with `headers`: the caller's, or a new one. The
/// caller's is copied: the request keeps its id as long as it lives (its
/// stream), and a value as parsed is a slice of the client connection's
/// read buffer, which it would keep from being reused.
pub(crate) fn of(headers: &HeaderMap) -> HeaderValue {
    match headers.get(X_REQUEST_ID) {
        Some(v) if well_formed(v.as_bytes()) && !carries_key(v.as_bytes(), headers) => {
            HeaderValue::from_bytes(v.as_bytes()).unwrap_or_else(|_| generate())
        }
        _ => generate(),
    }
}

fn well_formed(id: &[u8]) -> bool {
    (1..=MAX_LEN).contains(&id.len()) && id.iter().all(|b| b.is_ascii_alphanumeric() || b"-_.:/+=@".contains(b))
}

/// Does `id` hold the token of the request's `Authorization` header?
fn carries_key(id: &[u8], headers: &HeaderMap) -> bool {
    let Some(auth) = headers.get(http::header::AUTHORIZATION) else { return false };
    let token = auth.as_bytes().rsplit(|b| *b == b' ').next().unwrap_or_default().trim_ascii();
    !token.is_empty() && id.windows(token.len()).any(|w| w == token)
}

/// A new id, unique in this process and (by its random half) across processes.
fn generate() -> HeaderValue {
    static SEED: OnceLock<u64> = OnceLock::new();
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let seed = *SEED.get_or_init(|| {
        use std::hash::{BuildHasher, Hasher};
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u32(std::process::id());
        h.finish()
    });
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let mut buf = [0u8; 32];
    hex_into(&mut buf[..16], seed);
    // splitmix64's finaliser: a bijection, so distinct counters give distinct ids.
    hex_into(&mut buf[16..], mix(n.wrapping_add(seed)));
    // Owned as one shared allocation from the start: the id is cloned into
    // the replica's request, the response and the access log, and a value
    // copied from a slice would allocate again at its first clone.
    HeaderValue::from_maybe_shared(bytes::Bytes::from_owner(buf)).unwrap_or_else(|_| HeaderValue::from_static("0"))
}

fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn hex_into(out: &mut [u8], v: u64) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    for (i, o) in out.iter_mut().enumerate() {
        *o = HEX[((v >> (60 - 4 * i)) & 0xf) as usize];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(HeaderName::from_bytes(k.as_bytes()).expect("name"), HeaderValue::from_str(v).expect("value"));
        }
        h
    }

    #[test]
    fn a_well_formed_caller_id_is_kept() {
        assert_eq!(of(&with(&[("x-request-id", "req_42-a.b:c")])), "req_42-a.b:c");
    }

    #[test]
    fn a_malformed_or_key_carrying_id_is_replaced() {
        let long = "a".repeat(MAX_LEN + 1);
        for bad in ["", "has space", "quote\"", long.as_str()] {
            let h = with(&[("x-request-id", bad)]);
            let id = of(&h);
            assert_ne!(id, bad);
            assert_eq!(id.len(), 32, "{id:?}");
        }
        let h = with(&[("x-request-id", "trace-sk-secret123"), ("authorization", "Bearer sk-secret123")]);
        assert_ne!(of(&h), "trace-sk-secret123", "the caller's key never becomes the id");
    }

    #[test]
    fn new_ids_are_distinct_hex() {
        let ids: std::collections::HashSet<_> = (0..10_000).map(|_| of(&HeaderMap::new())).collect();
        assert_eq!(ids.len(), 10_000);
        assert!(ids.iter().all(|i| i.len() == 32 && i.as_bytes().iter().all(u8::is_ascii_hexdigit)));
    }
}
