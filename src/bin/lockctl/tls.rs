//! TLS to lockd from the flags: --tls-ca and --client-cert/--client-key made into the
//! library's [`Tls`] (which does the handshakes and explains their failures), and the
//! variables that hand them on to `run`'s command.

use std::path::Path;

use lockd::client::Tls;

use crate::cli::TlsArgs;
use crate::fail::Failure;

/// The settings the flags ask for, or `None` without TLS. Unreadable or unusable files are a
/// usage error, named.
pub fn from_args(args: &TlsArgs) -> Result<Option<Tls>, Failure> {
    if !args.wanted() {
        return Ok(None);
    }
    let identity = args.client_cert.as_deref().zip(args.client_key.as_deref());
    let tls = Tls::new(args.tls_ca.as_deref(), identity).map_err(|e| {
        // The hint is for the system bundle only when that is the file at fault.
        let bundle_failed = e.starts_with(lockd::tls::SYSTEM_CA_BUNDLE);
        let hint = if args.tls_ca.is_none() && bundle_failed {
            " (the system's CA bundle; give the CA that signed lockd's certificate with \
             --tls-ca)"
        } else {
            ""
        };
        Failure::usage(format!("cannot set up TLS: {e}{hint}"))
    })?;
    Ok(Some(tls))
}

/// The variables that make a lockctl started by `run`'s command reach lockd the same way
/// (paths made absolute: the command may change directory).
pub fn environment(tls: &Tls) -> Vec<(&'static str, String)> {
    let path = |p: &Path| {
        std::path::absolute(p)
            .unwrap_or_else(|_| p.to_path_buf())
            .display()
            .to_string()
    };
    let mut env = vec![("LOCKD_TLS", "1".to_owned())];
    if let Some(ca) = tls.ca() {
        env.push(("LOCKD_TLS_CA", path(ca)));
    }
    if let Some((cert, key)) = tls.identity() {
        env.push(("LOCKD_CLIENT_CERT", path(cert)));
        env.push(("LOCKD_CLIENT_KEY", path(key)));
    }
    env
}
