//! TLS towards `https://` replicas (rustls): which roots are trusted, the
//! client certificate of mTLS, the name a replica's certificate is checked
//! against.
//!
//! One client configuration is built per pool when the pool is prepared, so
//! its TLS session cache is shared by the pool's replicas: a connection
//! opened after an idle one was closed resumes the session (one round trip,
//! no certificate verification) instead of a full handshake. Connections
//! themselves are kept alive and reused like plain ones.

use std::sync::{Arc, OnceLock};

use rustls::ClientConfig;
use rustls_pki_types::{CertificateDer, ServerName};

use crate::config::{pem, PoolConfig};

/// Why a pool's TLS could not be set up; names the field.
#[derive(Debug, thiserror::Error)]
#[error("{field}: {message}")]
pub struct TlsError {
    pub field: &'static str,
    pub message: String,
}

/// How one replica's connections are secured.
#[derive(Clone)]
pub(crate) struct ReplicaTls {
    pub(crate) connector: tokio_rustls::TlsConnector,
    pub(crate) server_name: ServerName<'static>,
}

/// The system's trusted roots, read once per process.
fn system_roots() -> &'static [CertificateDer<'static>] {
    static ROOTS: OnceLock<Vec<CertificateDer<'static>>> = OnceLock::new();
    ROOTS.get_or_init(|| {
        let found = rustls_native_certs::load_native_certs();
        for e in &found.errors {
            tracing::debug!(error = %e, "reading the system's CA certificates");
        }
        found.certs
    })
}

/// The client configuration of `pool`'s `https://` replicas; `None` when
/// every replica is `http://`.
pub(crate) fn client_config(pool: &PoolConfig) -> Result<Option<Arc<ClientConfig>>, TlsError> {
    if !pool.replicas.iter().any(|r| r.url.trim_start().starts_with("https://")) {
        return Ok(None);
    }
    let tls = pool.tls.clone().unwrap_or_default();
    let mut roots = rustls::RootCertStore::empty();
    let (_, unusable) = roots.add_parsable_certificates(system_roots().iter().cloned());
    if unusable > 0 {
        tracing::debug!(unusable, "system CA certificates rustls cannot use");
    }
    if let Some(ca) = &tls.ca {
        for cert in pem::certs(ca).map_err(|message| TlsError { field: "tls.ca", message })? {
            roots.add(cert).map_err(|e| TlsError { field: "tls.ca", message: format!("{}: {e}", ca.display()) })?;
        }
    }
    if roots.is_empty() {
        return Err(TlsError {
            field: "tls.ca",
            message: "no trusted roots: the system has no CA certificates; name the replicas' CA here".into(),
        });
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError { field: "tls", message: e.to_string() })?
        .with_root_certificates(roots);
    let mut config = match (&tls.cert, &tls.key) {
        (Some(cert), Some(key)) => {
            let chain = pem::certs(cert).map_err(|message| TlsError { field: "tls.cert", message })?;
            let key = pem::key(key).map_err(|message| TlsError { field: "tls.key", message })?;
            builder.with_client_auth_cert(chain, key).map_err(|e| TlsError { field: "tls.cert", message: e.to_string() })?
        }
        (None, None) => builder.with_no_client_auth(),
        (Some(_), None) => return Err(TlsError { field: "tls.key", message: "is required with tls.cert".into() }),
        (None, Some(_)) => return Err(TlsError { field: "tls.cert", message: "is required with tls.key".into() }),
    };
    // Requests to replicas are HTTP/1.1.
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Some(Arc::new(config)))
}

/// How connections to the replica at `base` are secured: `None` for
/// `http://`. `server_name` overrides the URL's host.
pub(crate) fn for_replica(
    base: &http::Uri,
    config: Option<&Arc<ClientConfig>>,
    server_name: Option<&str>,
) -> Result<Option<ReplicaTls>, TlsError> {
    if base.scheme_str() != Some("https") {
        return Ok(None);
    }
    let Some(config) = config else {
        return Err(TlsError { field: "tls", message: "an https:// replica needs a TLS configuration".into() });
    };
    let host = base.host().unwrap_or_default().trim_start_matches('[').trim_end_matches(']');
    let name = server_name.unwrap_or(host);
    let server_name = ServerName::try_from(name.to_string())
        .map_err(|e| TlsError { field: "tls.server_name", message: format!("`{name}` cannot be checked against a certificate: {e}") })?;
    Ok(Some(ReplicaTls { connector: tokio_rustls::TlsConnector::from(config.clone()), server_name }))
}
