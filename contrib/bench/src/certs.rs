//! The TLS pass's certificates: a throwaway CA and a server certificate for 127.0.0.1 and
//! localhost, made with rcgen at the start of a run and written to its output directory, so
//! that no key is ever committed; and the client side that trusts that CA alone.

use std::path::Path;
use std::sync::Arc;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair, SanType,
};
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::CertificateDer;
use tokio_rustls::rustls::{self, ClientConfig, RootCertStore};
use tokio_rustls::TlsConnector;

/// The files `write` makes in its directory: what lockd's `--tls-cert`, `--tls-key` and the
/// load generator's `--tls-ca` are given.
pub const CA: &str = "ca.pem";
pub const CERT: &str = "server.pem";
pub const KEY: &str = "server.key";

fn err(what: &str, e: impl std::fmt::Display) -> String {
    format!("{what}: {e}")
}

/// Makes a CA and a server certificate it signed (ECDSA P-256, rcgen's default key, as a
/// production lockd would likely use) into `dir`.
pub fn write(dir: &Path) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| err(&dir.display().to_string(), e))?;
    let ca_key = KeyPair::generate().map_err(|e| err("CA key", e))?;
    let mut params =
        CertificateParams::new(Vec::<String>::new()).map_err(|e| err("CA params", e))?;
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(DnType::CommonName, "lockbench throwaway CA");
    let ca = params
        .self_signed(&ca_key)
        .map_err(|e| err("CA certificate", e))?;

    let key = KeyPair::generate().map_err(|e| err("server key", e))?;
    let mut params = CertificateParams::new(vec!["localhost".to_string()])
        .map_err(|e| err("server params", e))?;
    params
        .subject_alt_names
        .push(SanType::IpAddress(std::net::Ipv4Addr::LOCALHOST.into()));
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    params.distinguished_name.push(DnType::CommonName, "lockd");
    let cert = params
        .signed_by(&key, &ca, &ca_key)
        .map_err(|e| err("server certificate", e))?;

    for (file, pem) in [
        (CA, ca.pem()),
        (CERT, cert.pem()),
        (KEY, key.serialize_pem()),
    ] {
        let path = dir.join(file);
        std::fs::write(&path, pem).map_err(|e| err(&path.display().to_string(), e))?;
    }
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
