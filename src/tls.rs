//! TLS set-up with rustls (ring provider; no OpenSSL): the server's acceptor from PEM files,
//! optionally requiring client certificates signed by a CA (mutual TLS), the client's
//! connector, and the name a client certificate gives its holder.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio_rustls::rustls::server::WebPkiClientVerifier;
use tokio_rustls::rustls::{self, ClientConfig, RootCertStore, ServerConfig};
use tokio_rustls::{TlsAcceptor, TlsConnector};

/// Where a client looks for CA certificates when it is given none (Debian's bundle).
pub const SYSTEM_CA_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";

/// The server's TLS: certificate, key, and the CA client certificates must be signed by.
/// Clones share one acceptor, which [`ServerTls::reload`] replaces (SIGHUP: a certificate
/// rotated without a restart, which would forget every in-memory lease).
#[derive(Clone)]
pub struct ServerTls {
    /// Accepts a connection's TLS handshake with the certificate and key now in force. A
    /// std lock: read (a clone taken) per handshake, never held across an `.await`.
    acceptor: Arc<RwLock<TlsAcceptor>>,
    /// The same certificate and key, asking no client for a certificate: the HTTP port's
    /// (`--metrics-tls`), where browsers and scrapers log in their own way.
    open_acceptor: Arc<RwLock<TlsAcceptor>>,
    /// Clients must present a certificate signed by `--tls-client-ca`.
    pub mutual: bool,
    /// The files it was made of, read again by a reload.
    files: (PathBuf, PathBuf, Option<PathBuf>),
}

impl ServerTls {
    /// The acceptor in force: a new handshake starts with it.
    pub fn acceptor(&self) -> TlsAcceptor {
        self.acceptor
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }

    /// The acceptor in force that asks for no client certificate (see `open_acceptor`).
    pub fn acceptor_without_client_auth(&self) -> TlsAcceptor {
        self.open_acceptor
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }

    /// Reads the certificate, key and client CA files again; new handshakes use them from
    /// now on (connections open already keep theirs). Files that fail to make a server
    /// identity leave the one in force, and say why.
    pub fn reload(&self) -> Result<(), String> {
        let (cert, key, ca) = &self.files;
        let fresh = server(cert, key, ca.as_deref())?;
        for (mine, new) in [
            (&self.acceptor, fresh.acceptor()),
            (&self.open_acceptor, fresh.acceptor_without_client_auth()),
        ] {
            *mine
                .write()
                .unwrap_or_else(|poisoned| poisoned.into_inner()) = new;
        }
        Ok(())
    }

    /// The certificate file, for the log.
    pub fn cert_file(&self) -> &Path {
        &self.files.0
    }
}

impl fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServerTls")
            .field("mutual", &self.mutual)
            .finish_non_exhaustive()
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// An error that names the file at fault.
fn file_error(path: &Path, what: &str, e: impl fmt::Display) -> String {
    format!("{}: {what}: {e}", path.display())
}

fn certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| file_error(path, "cannot read certificates", e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| file_error(path, "bad PEM", e))?;
    if certs.is_empty() {
        return Err(file_error(
            path,
            "no certificate",
            "the file has no CERTIFICATE block",
        ));
    }
    Ok(certs)
}

fn key(path: &Path) -> Result<PrivateKeyDer<'static>, String> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| file_error(path, "cannot read a private key", e))
}

fn roots(path: &Path) -> Result<RootCertStore, String> {
    let mut roots = RootCertStore::empty();
    for cert in certs(path)? {
        roots
            .add(cert)
            .map_err(|e| file_error(path, "not a usable CA certificate", e))?;
    }
    Ok(roots)
}

/// The server side: `cert` and `key` (PEM); with `client_ca`, clients must present a
/// certificate it signed.
pub fn server(cert: &Path, key_file: &Path, client_ca: Option<&Path>) -> Result<ServerTls, String> {
    let builder = || {
        ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())
    };
    let open = builder()?
        .with_no_client_auth()
        .with_single_cert(certs(cert)?, key(key_file)?)
        .map_err(|e| file_error(cert, "certificate and key do not make a server identity", e))?;
    let builder = builder()?;
    let builder = match client_ca {
        Some(ca) => {
            let verifier =
                WebPkiClientVerifier::builder_with_provider(Arc::new(roots(ca)?), provider())
                    .build()
                    .map_err(|e| file_error(ca, "cannot verify clients with it", e))?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let config = builder
        .with_single_cert(certs(cert)?, key(key_file)?)
        .map_err(|e| file_error(cert, "certificate and key do not make a server identity", e))?;
    Ok(ServerTls {
        acceptor: Arc::new(RwLock::new(TlsAcceptor::from(Arc::new(config)))),
        open_acceptor: Arc::new(RwLock::new(TlsAcceptor::from(Arc::new(open)))),
        mutual: client_ca.is_some(),
        files: (
            cert.to_path_buf(),
            key_file.to_path_buf(),
            client_ca.map(Path::to_path_buf),
        ),
    })
}

/// A client's TLS: trusts the CAs in `ca` (default: the system bundle), and presents
/// `identity` (certificate and key, PEM) when the server asks for one.
pub fn client(ca: Option<&Path>, identity: Option<(&Path, &Path)>) -> Result<TlsConnector, String> {
    let ca = ca.unwrap_or(Path::new(SYSTEM_CA_BUNDLE));
    let builder = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots(ca)?);
    let config = match identity {
        Some((cert, key_file)) => builder
            .with_client_auth_cert(certs(cert)?, key(key_file)?)
            .map_err(|e| {
                file_error(cert, "certificate and key do not make a client identity", e)
            })?,
        None => builder.with_no_client_auth(),
    };
    Ok(TlsConnector::from(Arc::new(config)))
}

/// The name the server's certificate must carry for `host` (a DNS name or an IP address).
pub fn server_name(host: &str) -> io::Result<ServerName<'static>> {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    ServerName::try_from(host.to_owned())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, format!("{host}: {e}")))
}

/// The common names of the client certificate a server-side TLS stream verified (mutual
/// TLS), in the subject's order; `None` for plain streams, for TLS without client
/// certificates, and for a subject this can't read.
pub fn client_cns(stream: &crate::stream::Stream) -> Option<Vec<String>> {
    let crate::stream::Stream::Server(tls) = stream else {
        return None;
    };
    let cert = tls.get_ref().1.peer_certificates()?.first()?;
    subject_cns(cert.as_ref())
}

/// The common name (CN) in a certificate's subject: the user a client certificate stands for.
/// `None` without one, and with more than one: a subject that names two users names none (a
/// login never picks one of them; see [`subject_cns`]).
pub fn subject_cn(der: &[u8]) -> Option<String> {
    let mut cns = subject_cns(der)?;
    match cns.len() {
        1 => cns.pop(),
        _ => None,
    }
}

/// Every common name (CN) in a certificate's subject, in order. `der` is a certificate the
/// TLS layer already verified; this only reads it, and gives `None` for anything it does not
/// understand (a CN that is not UTF-8 included).
pub fn subject_cns(der: &[u8]) -> Option<Vec<String>> {
    // Certificate ::= SEQUENCE { tbsCertificate SEQUENCE { [0] version OPTIONAL,
    //   serialNumber, signature, issuer, validity, subject, ... } ... }
    let (cert, _) = der_take(der, 0x30)?;
    let (mut tbs, _) = der_take(cert, 0x30)?;
    if tbs.first() == Some(&0xa0) {
        tbs = der_take(tbs, 0xa0)?.1;
    }
    // serialNumber, signature, issuer, validity: skip four elements.
    for tag in [0x02, 0x30, 0x30, 0x30] {
        tbs = der_take(tbs, tag)?.1;
    }
    let (mut subject, _) = der_take(tbs, 0x30)?;
    // Name ::= SEQUENCE OF RelativeDistinguishedName (SET OF AttributeTypeAndValue)
    let mut cns = Vec::new();
    while !subject.is_empty() {
        let (mut rdn, rest) = der_take(subject, 0x31)?;
        subject = rest;
        while !rdn.is_empty() {
            let (attr, rest) = der_take(rdn, 0x30)?;
            rdn = rest;
            let (oid, value) = der_take(attr, 0x06)?;
            // 2.5.4.3, commonName
            if oid == [0x55, 0x04, 0x03] {
                let (&tag, _) = value.split_first()?;
                let (text, _) = der_take(value, tag)?;
                cns.push(String::from_utf8(text.to_vec()).ok()?);
            }
        }
    }
    Some(cns)
}

/// Splits one DER element with tag `tag` off the front of `der`: its contents and the rest.
fn der_take(der: &[u8], tag: u8) -> Option<(&[u8], &[u8])> {
    let (&t, rest) = der.split_first()?;
    if t != tag {
        return None;
    }
    let (&first, mut rest) = rest.split_first()?;
    let len = if first < 0x80 {
        usize::from(first)
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 || rest.len() < n {
            return None;
        }
        let len = rest[..n]
            .iter()
            .fold(0usize, |acc, b| (acc << 8) | usize::from(*b));
        rest = &rest[n..];
        len
    };
    if rest.len() < len {
        return None;
    }
    Some(rest.split_at(len))
}

/// Why a client's certificate was refused, in words, if that is why `e` (a failed
/// handshake) failed: the client is told only an alert, so the log says the rest.
pub fn refused_certificate(e: &std::io::Error) -> Option<String> {
    use tokio_rustls::rustls::{CertificateError as C, Error};
    let error = e.get_ref()?.downcast_ref::<Error>()?;
    Some(match error {
        Error::NoCertificatesPresented => {
            "it sent none (mutual TLS: --tls-client-ca requires one)".into()
        }
        Error::InvalidCertificate(C::UnknownIssuer) => {
            "it is not signed by a CA lockd trusts (--tls-client-ca)".into()
        }
        Error::InvalidCertificate(C::Expired | C::ExpiredContext { .. }) => "it has expired".into(),
        Error::InvalidCertificate(C::NotValidYet | C::NotValidYetContext { .. }) => {
            "it is not valid yet".into()
        }
        Error::InvalidCertificate(C::BadSignature) => {
            "its signature does not check out against a CA lockd trusts".into()
        }
        Error::InvalidCertificate(C::InvalidPurpose | C::InvalidPurposeContext { .. }) => {
            "it is not made for client authentication (clientAuth)".into()
        }
        Error::InvalidCertificate(other) => format!("{other:?}"),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn der_lengths_are_checked() {
        assert_eq!(
            der_take(&[0x30, 0x01, 0xff], 0x30),
            Some((&[0xff][..], &[][..]))
        );
        assert_eq!(der_take(&[0x30, 0x02, 0xff], 0x30), None);
        assert_eq!(der_take(&[0x31, 0x00], 0x30), None);
        assert_eq!(
            der_take(&[0x30, 0x81, 0x01, 0x07], 0x30),
            Some((&[0x07][..], &[][..]))
        );
        assert_eq!(der_take(&[0x30, 0x85, 1, 1, 1, 1, 1], 0x30), None);
        assert_eq!(subject_cn(&[]), None);
        assert_eq!(subject_cn(&[0x30, 0x00]), None);
    }
}
