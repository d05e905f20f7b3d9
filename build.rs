//! Tells lockd which commit it is built from, for `lockd_build_info` and `--version`:
//! `LOCKD_COMMIT` if set (a package built from a source tarball has no git), else
//! `git rev-parse`, else "unknown". A build never fails for want of git.

use std::path::Path;
use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    let text = String::from_utf8(out.stdout).ok()?;
    let text = text.trim();
    (out.status.success() && !text.is_empty()).then(|| text.to_owned())
}

fn main() {
    println!("cargo:rerun-if-env-changed=LOCKD_COMMIT");
    let commit = match std::env::var("LOCKD_COMMIT") {
        Ok(c) if !c.trim().is_empty() => c.trim().to_owned(),
        _ => {
            // Rebuild when HEAD moves: HEAD itself (a checkout), the branch it names (a
            // commit), and packed-refs (a gc packs the branch there).
            for path in ["HEAD", "packed-refs"]
                .iter()
                .filter_map(|p| git(&["rev-parse", "--git-path", p]))
                .chain(
                    git(&["symbolic-ref", "-q", "HEAD"])
                        .and_then(|r| git(&["rev-parse", "--git-path", &r])),
                )
            {
                if Path::new(&path).exists() {
                    println!("cargo:rerun-if-changed={path}");
                }
            }
            git(&["rev-parse", "--short=12", "HEAD"]).unwrap_or_else(|| "unknown".to_owned())
        }
    };
    println!("cargo:rustc-env=LOCKD_COMMIT={commit}");
}
