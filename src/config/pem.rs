//! PEM files named by the config (the listener's certificate, a pool's CA,
//! its client certificate): read here once, so `slogate check` and a start
//! find the same problems in them.

use std::path::Path;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// Every certificate in a PEM file; an error when there is none.
pub(crate) fn certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(|e| format!("{}: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!("{}: no certificate found", path.display()));
    }
    Ok(certs)
}

/// The private key in a PEM file.
pub(crate) fn key(path: &Path) -> Result<PrivateKeyDer<'static>, String> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| format!("{}: {e}", path.display()))
}
