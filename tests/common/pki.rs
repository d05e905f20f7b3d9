//! Test certificates made at run time with rcgen: a CA, a server certificate for 127.0.0.1
//! and localhost, and client certificates whose common name is a user. Nothing is committed.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, Certificate, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, SanType,
};
use tokio_rustls::rustls::pki_types::{pem::PemObject, CertificateDer};

/// A CA and the files of the certificates it signed, in a temporary directory.
pub struct Pki {
    pub dir: PathBuf,
    ca: Certificate,
    ca_key: KeyPair,
}

impl Pki {
    /// A new CA called `name`, its certificate in `<dir>/<name>-ca.pem`.
    pub fn new(name: &str) -> Pki {
        let dir = std::env::temp_dir().join(format!(
            "lockd-pki-{name}-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let ca_key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, format!("{name} test CA"));
        let ca = params.self_signed(&ca_key).unwrap();
        std::fs::write(dir.join("ca.pem"), ca.pem()).unwrap();
        Pki { dir, ca, ca_key }
    }

    pub fn ca(&self) -> PathBuf {
        self.dir.join("ca.pem")
    }

    /// A certificate signed by this CA: `(cert.pem, key.pem)`.
    fn issue(&self, file: &str, params: CertificateParams) -> (PathBuf, PathBuf) {
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.ca, &self.ca_key).unwrap();
        let (cert_file, key_file) = (
            self.dir.join(format!("{file}.pem")),
            self.dir.join(format!("{file}.key")),
        );
        std::fs::write(&cert_file, cert.pem()).unwrap();
        std::fs::write(&key_file, key.serialize_pem()).unwrap();
        (cert_file, key_file)
    }

    /// A server certificate for 127.0.0.1 and localhost.
    pub fn server(&self) -> (PathBuf, PathBuf) {
        let mut params = CertificateParams::new(vec!["localhost".to_string()]).unwrap();
        params
            .subject_alt_names
            .push(SanType::IpAddress("127.0.0.1".parse().unwrap()));
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.distinguished_name.push(DnType::CommonName, "lockd");
        self.issue("server", params)
    }

    /// A server certificate for the host names `names` only (no IP address): a connection
    /// is trusted only if it was made to one of those names.
    pub fn server_named(&self, file: &str, names: &[&str]) -> (PathBuf, PathBuf) {
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let mut params = CertificateParams::new(names).unwrap();
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.distinguished_name.push(DnType::CommonName, "lockd");
        self.issue(file, params)
    }

    /// A client certificate whose subject's common name is `user`.
    pub fn client(&self, user: &str) -> (PathBuf, PathBuf) {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        params.distinguished_name.push(DnType::CommonName, user);
        self.issue(&format!("client-{user}"), params)
    }

    /// The DER bytes of a PEM certificate file.
    pub fn der(path: &Path) -> Vec<u8> {
        CertificateDer::from_pem_file(path).unwrap().to_vec()
    }
}

impl Drop for Pki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
