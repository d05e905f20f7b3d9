//! TLS and authentication toward etcd (`--etcd-ca`, `--etcd-cert`/`--etcd-key`,
//! `--etcd-user` with its password): the one place where lockd's settings become the etcd
//! client's connect options, and where a start that etcd refuses for good ends with one line.
//!
//! Three steps, kept apart so that each can be read (and ported to another client) alone:
//! - [`load`]: the files and the password, read and checked before any connection (a PEM
//!   that doesn't parse, a key that isn't the certificate's, an empty password): an
//!   [`EtcdRefused`] naming the flag. No client call.
//! - [`apply`]: what was loaded, as the client's `ConnectOptions`.
//! - [`connect`]: the client, and a first request that proves this front-end may read and
//!   write its prefix, tried again while etcd is merely unreachable (as the start's other
//!   steps are) and given up at once when etcd refuses the certificates, the user or the
//!   rights (`refusal::refusal` tells which, in one sentence).

use std::error::Error;
use std::fmt;
use std::path::Path;
use std::time::Instant;

use super::rpc::{Client, Compare, CompareOp, ConnectOptions, GetOptions, TlsOptions, Txn, TxnOp};
use tokio_rustls::rustls::crypto::ring::default_provider;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::sign::CertifiedKey;
use tokio_rustls::rustls::RootCertStore;

use super::cause;
use super::keys::Layout;
use super::refusal;
use crate::backend::{EtcdConfig, EtcdRefused, EtcdSecurity, ETCD_PASSWORD_ENV};

/// What [`load`] read: PEM text as the client takes it, and the user with its password.
pub struct Loaded {
    ca: Option<Vec<u8>>,
    identity: Option<(Vec<u8>, Vec<u8>)>,
    user: Option<(String, String)>,
}

impl fmt::Debug for Loaded {
    /// Never the password, nor the key.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Loaded")
            .field("ca", &self.ca.is_some())
            .field("identity", &self.identity.is_some())
            .field("user", &self.user.as_ref().map(|(user, _)| user))
            .finish()
    }
}

fn refused(message: String) -> EtcdRefused {
    EtcdRefused(message)
}

/// Reads and checks the files `sec` names, and the password (from [`ETCD_PASSWORD_ENV`]
/// or `--etcd-password-file`).
pub fn load(sec: &EtcdSecurity) -> Result<Loaded, EtcdRefused> {
    load_with(sec, std::env::var(ETCD_PASSWORD_ENV).ok())
}

/// [`load`] with the environment's password given, for tests.
pub fn load_with(sec: &EtcdSecurity, env_password: Option<String>) -> Result<Loaded, EtcdRefused> {
    let ca = match &sec.ca {
        Some(path) => Some(ca_file(path)?),
        None => None,
    };
    let identity = match &sec.identity {
        Some((cert, key)) => Some(identity_files(cert, key)?),
        None => None,
    };
    let user = match &sec.user {
        Some(user) => Some((
            user.clone(),
            password(sec.password_file.as_deref(), env_password)?,
        )),
        None => None,
    };
    Ok(Loaded { ca, identity, user })
}

fn read(flag: &str, path: &Path) -> Result<Vec<u8>, EtcdRefused> {
    std::fs::read(path).map_err(|e| refused(format!("{flag} {}: {e}", path.display())))
}

fn certificates(
    flag: &str,
    path: &Path,
    pem: &[u8],
) -> Result<Vec<CertificateDer<'static>>, EtcdRefused> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| refused(format!("{flag} {}: not PEM ({e})", path.display())))?;
    if certs.is_empty() {
        return Err(refused(format!(
            "{flag} {}: no certificate in it (no BEGIN CERTIFICATE block)",
            path.display()
        )));
    }
    Ok(certs)
}

/// `--etcd-ca`: PEM certificates, each usable as a CA to check etcd's certificate against.
fn ca_file(path: &Path) -> Result<Vec<u8>, EtcdRefused> {
    let pem = read("--etcd-ca", path)?;
    let mut roots = RootCertStore::empty();
    for cert in certificates("--etcd-ca", path, &pem)? {
        roots.add(cert).map_err(|e| {
            refused(format!(
                "--etcd-ca {}: not a usable CA certificate ({e})",
                path.display()
            ))
        })?;
    }
    Ok(pem)
}

/// `--etcd-cert` and `--etcd-key`: a certificate chain and the private key of its first
/// certificate.
fn identity_files(cert: &Path, key: &Path) -> Result<(Vec<u8>, Vec<u8>), EtcdRefused> {
    let cert_pem = read("--etcd-cert", cert)?;
    let key_pem = read("--etcd-key", key)?;
    let chain = certificates("--etcd-cert", cert, &cert_pem)?;
    let private = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| {
        refused(format!(
            "--etcd-key {}: no private key in it ({e})",
            key.display()
        ))
    })?;
    CertifiedKey::from_der(chain, private, &default_provider()).map_err(|e| {
        refused(format!(
            "--etcd-cert {} and --etcd-key {} are not a pair ({e})",
            cert.display(),
            key.display()
        ))
    })?;
    Ok((cert_pem, key_pem))
}

/// The password of `--etcd-user`: the first line of `file`, or the environment's. The
/// flags' check refuses both or neither already; this says so again for other callers.
fn password(file: Option<&Path>, env: Option<String>) -> Result<String, EtcdRefused> {
    match (file, env) {
        (Some(_), Some(_)) => Err(refused(format!(
            "the etcd password is given twice: {ETCD_PASSWORD_ENV} and --etcd-password-file; keep one"
        ))),
        (None, None) => Err(refused(format!(
            "--etcd-user needs its password, in {ETCD_PASSWORD_ENV} or --etcd-password-file"
        ))),
        (None, Some(password)) if password.is_empty() => {
            Err(refused(format!("{ETCD_PASSWORD_ENV} is empty")))
        }
        (None, Some(password)) => Ok(password),
        (Some(path), None) => {
            let text = std::fs::read_to_string(path).map_err(|e| {
                refused(format!("--etcd-password-file {}: {e}", path.display()))
            })?;
            let line = text.lines().next().unwrap_or("");
            if line.is_empty() {
                return Err(refused(format!(
                    "--etcd-password-file {}: its first line is empty",
                    path.display()
                )));
            }
            Ok(line.to_owned())
        }
    }
}

/// `options` with what [`load`] read: TLS with etcd's CA (and the client certificate), and
/// the user, whose token is renewed when etcd lets it expire (`--auth-token-ttl`, five
/// minutes by default) instead of failing every request from then on.
pub fn apply(options: ConnectOptions, loaded: &Loaded) -> ConnectOptions {
    let mut options = options;
    if let Some(ca) = &loaded.ca {
        let mut tls = TlsOptions::new().with_ca_pem(ca.clone());
        if let Some((cert, key)) = &loaded.identity {
            tls = tls.with_identity_pem(cert.clone(), key.clone());
        }
        options = options.with_tls(tls);
    }
    if let Some((user, password)) = &loaded.user {
        if loaded.ca.is_none() {
            tracing::warn!(
                user,
                "--etcd-user over http://: the password crosses the network in clear text (use https:// with --etcd-ca)"
            );
        }
        // The client asks for a new token when etcd refuses an expired one.
        options = options.with_user(user.clone(), password.clone());
    }
    options
}

/// Waits between attempts to reach etcd at start.
const RETRY: std::time::Duration = std::time::Duration::from_millis(200);

/// Connects with `options` made secure by `config.security`, and checks with a first
/// request that etcd lets this front-end read and write its prefix. While etcd is only
/// unreachable or without a leader it tries again, until `--etcd-connect-timeout`; a
/// refusal (certificates, user, rights) ends the start at once, as an [`EtcdRefused`].
pub async fn connect(
    config: &EtcdConfig,
    options: ConnectOptions,
) -> Result<Client, Box<dyn Error + Send + Sync>> {
    let sec = &config.security;
    let options = apply(options, &load(sec)?);
    let endpoints = config.endpoints.join(",");
    let cx = cause::Context {
        endpoints: &config.endpoints,
        request_timeout: config.request_timeout,
    };
    let layout = Layout::new(&config.prefix);
    let who = refusal::Who {
        ca: sec.ca.as_deref(),
        cert: sec.identity.as_ref().map(|(cert, _)| cert.as_path()),
        user: sec.user.as_deref(),
        prefix: layout.prefix(),
    };
    let deadline = Instant::now() + config.connect_timeout;
    let mut last = None::<String>;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let attempt = async {
            let client = Client::connect(&config.endpoints, Some(options.clone())).await?;
            first_request(&client, layout.prefix()).await?;
            Ok::<_, super::rpc::Error>(client)
        };
        let e = match tokio::time::timeout(left, attempt).await {
            Ok(Ok(client)) => return Ok(client),
            Ok(Err(e)) => e,
            Err(_) => {
                let why = last.map_or_else(String::new, |why| format!(": {why}"));
                return Err(format!("etcd at {endpoints}: no quorum (timed out){why}").into());
            }
        };
        tracing::debug!(error = ?e, "etcd connect failed");
        if let Some(why) = refusal::refusal(&e, &who) {
            return Err(refused(format!("etcd at {endpoints}: {why}")).into());
        }
        let cause = cause::cause(&e, &cx);
        if !matches!(
            cause.kind,
            cause::Kind::Unavailable | cause::Kind::Timeout | cause::Kind::NoLeader
        ) {
            return Err(format!("etcd at {endpoints}: {}", cause.sentence).into());
        }
        last = Some(cause.sentence);
        tokio::time::sleep(RETRY.min(deadline.saturating_duration_since(Instant::now()))).await;
    }
}

/// One transaction that writes nothing (its comparison, a key created before revision 0,
/// never holds) but that etcd checks every part of against the user's rights: the put
/// needs write on the prefix, the range read of the other branch read on all of it. So a
/// role without readwrite on the whole prefix is told here, by name, instead of as the
/// first grant's "permission denied".
async fn first_request(client: &Client, prefix: &str) -> Result<(), super::rpc::Error> {
    let txn = Txn::new()
        .when([Compare::create_revision(prefix, CompareOp::Less, 0)])
        .and_then([TxnOp::put(prefix, "", None)])
        .or_else([TxnOp::get(
            prefix,
            Some(GetOptions::new().with_prefix().with_count_only()),
        )]);
    client.clone().txn(txn).await.map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A directory of its own, removed at the end.
    struct Dir(std::path::PathBuf);

    impl Dir {
        fn new(name: &str) -> Dir {
            let dir = std::env::temp_dir().join(format!(
                "lockd-secure-{name}-{}-{:?}",
                std::process::id(),
                std::thread::current().id()
            ));
            std::fs::create_dir_all(&dir).expect("dir");
            Dir(dir)
        }

        fn file(&self, name: &str, text: &str) -> std::path::PathBuf {
            let path = self.0.join(name);
            std::fs::write(&path, text).expect("write");
            path
        }
    }

    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn user(file: Option<std::path::PathBuf>) -> EtcdSecurity {
        EtcdSecurity {
            user: Some("lockd".into()),
            password_file: file,
            ..EtcdSecurity::default()
        }
    }

    #[test]
    fn nothing_to_load_is_plain() {
        let loaded = load_with(&EtcdSecurity::default(), Some("ignored".into())).expect("plain");
        assert!(loaded.ca.is_none() && loaded.identity.is_none() && loaded.user.is_none());
    }

    #[test]
    fn the_password_is_the_first_line_of_its_file_or_the_environment() {
        let dir = Dir::new("password");
        let file = dir.file("pw", "s3cret\nnot this\n");
        let loaded = load_with(&user(Some(file.clone())), None).expect("from the file");
        assert_eq!(loaded.user, Some(("lockd".into(), "s3cret".into())));
        let loaded = load_with(&user(None), Some("env-pw".into())).expect("from the env");
        assert_eq!(loaded.user, Some(("lockd".into(), "env-pw".into())));
        // Never shown.
        assert!(!format!("{loaded:?}").contains("env-pw"));
        let e = load_with(&user(Some(file)), Some("x".into())).expect_err("twice");
        assert!(e.0.contains("given twice"), "{e}");
        let e = load_with(&user(None), None).expect_err("none");
        assert!(e.0.starts_with("--etcd-user needs its password"), "{e}");
        let e = load_with(&user(Some(dir.file("empty", "\nx\n"))), None).expect_err("empty");
        assert!(e.0.ends_with("its first line is empty"), "{e}");
        let e = load_with(&user(None), Some(String::new())).expect_err("empty env");
        assert_eq!(e.0, "LOCKD_ETCD_PASSWORD is empty");
        let e = load_with(&user(Some(dir.0.join("missing"))), None).expect_err("missing");
        assert!(e.0.starts_with("--etcd-password-file "), "{e}");
    }

    #[test]
    fn a_ca_file_must_hold_certificates() {
        let dir = Dir::new("ca");
        let sec = |path| EtcdSecurity {
            ca: Some(path),
            ..EtcdSecurity::default()
        };
        let e = load_with(&sec(dir.file("text.pem", "hello\n")), None).expect_err("no PEM");
        assert!(e.0.contains("no certificate in it"), "{e}");
        let e = load_with(&sec(dir.0.join("missing.pem")), None).expect_err("missing");
        assert!(e.0.starts_with("--etcd-ca "), "{e}");
        let bad = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n";
        let e = load_with(&sec(dir.file("bad.pem", bad)), None).expect_err("not a cert");
        assert!(e.0.contains("--etcd-ca"), "{e}");
        assert!(!e.0.contains('\n'), "{e}");
    }

    #[test]
    fn a_client_key_must_be_its_certificate_s() {
        let dir = Dir::new("identity");
        let pki = testpki::Pki::new("secure-unit");
        let (cert, key) = pki.client("lockd");
        let (_, other_key) = pki.client("other");
        let sec = |cert: &Path, key: &Path| EtcdSecurity {
            ca: Some(pki.ca()),
            identity: Some((cert.to_path_buf(), key.to_path_buf())),
            ..EtcdSecurity::default()
        };
        let loaded = load_with(&sec(&cert, &key), None).expect("a pair");
        assert!(loaded.ca.is_some() && loaded.identity.is_some());
        let e = load_with(&sec(&cert, &other_key), None).expect_err("not a pair");
        assert!(e.0.contains("are not a pair"), "{e}");
        let e = load_with(&sec(&cert, &dir.file("k", "no key\n")), None).expect_err("no key");
        assert!(e.0.starts_with("--etcd-key "), "{e}");
        let e = load_with(&sec(&key, &key), None).expect_err("a key as the cert");
        assert!(e.0.starts_with("--etcd-cert "), "{e}");
    }
}
