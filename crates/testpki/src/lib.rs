//! Throwaway certificates, made at run time so that no key is ever committed: a CA, server
//! certificates for 127.0.0.1 and localhost (or for host names only), and client
//! certificates whose common name is a user. lockd's tests and its load generator
//! (contrib/bench) both need them; one crate keeps the two from drifting apart.
//!
//! Keys are ECDSA P-256, rcgen's default, as a production lockd would likely use.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, Certificate, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, SanType,
};
use rustls_pki_types::{pem::PemObject, CertificateDer};

/// The CA's certificate in a [`Pki`]'s directory.
pub const CA_FILE: &str = "ca.pem";
/// The certificate of [`Pki::server`] in a [`Pki`]'s directory.
pub const SERVER_CERT_FILE: &str = "server.pem";
/// The private key of [`Pki::server`] in a [`Pki`]'s directory.
pub const SERVER_KEY_FILE: &str = "server.key";

/// A CA and the files of the certificates it signed, in one directory.
pub struct Pki {
    /// Where the files are: `ca.pem`, and `<file>.pem` with `<file>.key` for each certificate.
    pub dir: PathBuf,
    ca: Certificate,
    ca_key: KeyPair,
    /// Made by [`Pki::new`]: removed when the `Pki` is dropped.
    temporary: bool,
}

fn err(what: &str, e: impl std::fmt::Display) -> String {
    format!("{what}: {e}")
}

impl Pki {
    /// A new CA called `<name> test CA`, in a directory of its own under the system's
    /// temporary directory, removed when the `Pki` is dropped. For tests: panics on failure.
    pub fn new(name: &str) -> Pki {
        let dir = std::env::temp_dir().join(format!(
            "lockd-pki-{name}-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos()
        ));
        let mut pki = Pki::create(&dir, &format!("{name} test CA")).unwrap();
        pki.temporary = true;
        pki
    }

    /// A new CA whose common name is `common_name`, its certificate written to
    /// `<dir>/ca.pem` (`dir` is created if missing, and kept).
    pub fn create(dir: &Path, common_name: &str) -> Result<Pki, String> {
        std::fs::create_dir_all(dir).map_err(|e| err(&dir.display().to_string(), e))?;
        let ca_key = KeyPair::generate().map_err(|e| err("CA key", e))?;
        let mut params =
            CertificateParams::new(Vec::<String>::new()).map_err(|e| err("CA params", e))?;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        let ca = params
            .self_signed(&ca_key)
            .map_err(|e| err("CA certificate", e))?;
        let pki = Pki {
            dir: dir.to_path_buf(),
            ca,
            ca_key,
            temporary: false,
        };
        pki.write(CA_FILE, &pki.ca.pem())?;
        Ok(pki)
    }

    /// The CA's certificate file (PEM).
    pub fn ca(&self) -> PathBuf {
        self.dir.join(CA_FILE)
    }

    fn write(&self, file: &str, pem: &str) -> Result<PathBuf, String> {
        let path = self.dir.join(file);
        std::fs::write(&path, pem).map_err(|e| err(&path.display().to_string(), e))?;
        Ok(path)
    }

    /// A certificate signed by this CA: `(<file>.pem, <file>.key)`.
    fn issue(&self, file: &str, params: CertificateParams) -> Result<(PathBuf, PathBuf), String> {
        let key = KeyPair::generate().map_err(|e| err("key", e))?;
        let cert = params
            .signed_by(&key, &self.ca, &self.ca_key)
            .map_err(|e| err("certificate", e))?;
        Ok((
            self.write(&format!("{file}.pem"), &cert.pem())?,
            self.write(&format!("{file}.key"), &key.serialize_pem())?,
        ))
    }

    /// A server certificate for 127.0.0.1 and localhost (common name `lockd`):
    /// `(server.pem, server.key)`, or why not.
    pub fn try_server(&self) -> Result<(PathBuf, PathBuf), String> {
        let mut params = CertificateParams::new(vec!["localhost".to_string()])
            .map_err(|e| err("server params", e))?;
        params
            .subject_alt_names
            .push(SanType::IpAddress(std::net::Ipv4Addr::LOCALHOST.into()));
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.distinguished_name.push(DnType::CommonName, "lockd");
        let stem = SERVER_CERT_FILE.trim_end_matches(".pem");
        debug_assert_eq!(format!("{stem}.key"), SERVER_KEY_FILE);
        self.issue(stem, params)
    }

    /// [`Pki::try_server`], for tests: panics on failure.
    pub fn server(&self) -> (PathBuf, PathBuf) {
        self.try_server().unwrap()
    }

    /// A server certificate for the host names `names` only (no IP address): a connection
    /// is trusted only if it was made to one of those names.
    pub fn server_named(&self, file: &str, names: &[&str]) -> (PathBuf, PathBuf) {
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let mut params = CertificateParams::new(names).unwrap();
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.distinguished_name.push(DnType::CommonName, "lockd");
        self.issue(file, params).unwrap()
    }

    /// A client certificate whose subject's common name is `user`:
    /// `(client-<user>.pem, client-<user>.key)`.
    pub fn client(&self, user: &str) -> (PathBuf, PathBuf) {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        params.distinguished_name.push(DnType::CommonName, user);
        self.issue(&format!("client-{user}"), params).unwrap()
    }

    /// The DER bytes of a PEM certificate file.
    pub fn der(path: &Path) -> Vec<u8> {
        CertificateDer::from_pem_file(path).unwrap().to_vec()
    }
}

impl Drop for Pki {
    fn drop(&mut self) {
        if self.temporary {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_temporary_pki_writes_its_files_and_removes_them() {
        let pki = Pki::new("testpki");
        let dir = pki.dir.clone();
        let (cert, key) = pki.server();
        assert_eq!(cert, dir.join(SERVER_CERT_FILE));
        assert_eq!(key, dir.join(SERVER_KEY_FILE));
        let (user, _) = pki.client("alice");
        assert!(!Pki::der(&user).is_empty() && !Pki::der(&pki.ca()).is_empty());
        drop(pki);
        assert!(!dir.exists());
    }

    #[test]
    fn a_created_pki_is_kept() {
        let parent = Pki::new("testpki-parent");
        let dir = parent.dir.join("kept");
        drop(Pki::create(&dir, "kept CA").unwrap());
        assert!(dir.join(CA_FILE).exists());
    }
}
