//! Small shared helpers: the repository, programs on PATH, OpenAI error
//! bodies, headers.

/// The repository's root.
pub fn repo() -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A program on PATH.
pub fn which(bin: &str) -> Option<std::path::PathBuf> {
    std::env::var_os("PATH").and_then(|p| std::env::split_paths(&p).map(|d| d.join(bin)).find(|f| f.is_file()))
}

/// The `error` object of an OpenAI error body; fails unless it has all four
/// members (`message`, `type`, `param`, `code`).
pub fn error_body(body: &[u8]) -> serde_json::Value {
    let v: serde_json::Value = serde_json::from_slice(body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(body)));
    for k in ["message", "type", "param", "code"] {
        assert!(v["error"].get(k).is_some(), "OpenAI error body lacks `{k}`: {v}");
    }
    v["error"].clone()
}

/// The `error.code` of an OpenAI error body.
pub fn error_code(body: &[u8]) -> String {
    error_body(body)["code"].as_str().unwrap_or_default().to_string()
}

/// A response header as text.
pub fn header<'a>(h: &'a http::HeaderMap, name: &str) -> Option<&'a str> {
    h.get(name).and_then(|v| v.to_str().ok())
}

/// A fresh self-signed certificate for `localhost`, written into `dir` as
/// `cert.pem` and `key.pem`: the certificate, and the two files' paths.
pub fn self_signed_in(dir: &std::path::Path) -> (rcgen::CertifiedKey, std::path::PathBuf, std::path::PathBuf) {
    let cert = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).expect("cert");
    let (cert_path, key_path) = (dir.join("cert.pem"), dir.join("key.pem"));
    std::fs::write(&cert_path, cert.cert.pem()).expect("write");
    std::fs::write(&key_path, cert.key_pair.serialize_pem()).expect("write");
    (cert, cert_path, key_path)
}

/// A TLS client that trusts only `cert`, offering `alpn`.
pub fn tls_trusting(cert: &rcgen::CertifiedKey, alpn: &[&[u8]]) -> tokio_rustls::TlsConnector {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(cert.cert.der().clone()).expect("root");
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let mut tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    tls.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    tokio_rustls::TlsConnector::from(std::sync::Arc::new(tls))
}
