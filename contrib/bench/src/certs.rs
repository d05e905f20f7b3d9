//! The TLS pass's certificates: a throwaway CA and a server certificate for 127.0.0.1 and
//! localhost, made at the start of a run with the workspace's testpki (as lockd's tests make
//! theirs) and written to its output directory, so that no key is ever committed; and the
//! client side that trusts that CA alone.

use std::path::Path;
use std::sync::Arc;

use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::CertificateDer;
use tokio_rustls::rustls::{self, ClientConfig, RootCertStore};
use tokio_rustls::TlsConnector;

fn err(what: &str, e: impl std::fmt::Display) -> String {
    format!("{what}: {e}")
}

/// Makes a CA and a server certificate it signed (ECDSA P-256, rcgen's default key, as a
/// production lockd would likely use) into `dir`: `ca.pem` (the load generator's `--tls-ca`),
/// `server.pem` and `server.key` (lockd's `--tls-cert` and `--tls-key`; run.sh names them).
pub fn write(dir: &Path) -> Result<(), String> {
    testpki::Pki::create(dir, "lockbench throwaway CA")?.try_server()?;
    Ok(())
}

/// A client that trusts the CA in `ca` (PEM) and nothing else, with the ring provider, as
/// lockd's own client is made.
pub fn connector(ca: &Path) -> Result<TlsConnector, String> {
    let what = ca.display().to_string();
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(ca).map_err(|e| err(&what, e))? {
        roots
            .add(cert.map_err(|e| err(&what, e))?)
            .map_err(|e| err(&what, e))?;
    }
    if roots.is_empty() {
        return Err(err(&what, "no CA certificate"));
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| err("TLS versions", e))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(TlsConnector::from(Arc::new(config)))
}
