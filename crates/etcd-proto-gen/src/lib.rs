//! Writes lockd's etcd v3 gRPC code (`crates/lockd-etcd/src/generated/`) from the trimmed
//! `.proto` files beside it (`crates/lockd-etcd/src/proto/`). The output is checked in so
//! that building lockd needs no protoc; running this needs one (on `PATH`, or `PROTOC`).
//!
//! Regenerate, from the workspace root: `cargo run -p etcd-proto-gen`.

use std::io;
use std::path::{Path, PathBuf};

/// The `.proto` files, relative to [`proto_dir`].
pub const PROTOS: [&str; 2] = ["kv.proto", "rpc.proto"];

/// Where lockd keeps its trimmed etcd protos.
pub fn proto_dir() -> PathBuf {
    workspace().join("crates/lockd-etcd/src/proto")
}

/// Where lockd keeps the generated code.
pub fn generated_dir() -> PathBuf {
    workspace().join("crates/lockd-etcd/src/generated")
}

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Generates the client code (messages and gRPC clients, no servers) into `out`: one file per
/// proto package and a `mod.rs` that includes them.
pub fn generate(protos: &Path, out: &Path) -> io::Result<()> {
    std::fs::create_dir_all(out)?;
    let files: Vec<PathBuf> = PROTOS.iter().map(|p| protos.join(p)).collect();
    tonic_prost_build::configure()
        .build_server(false)
        .build_client(true)
        // The clients are built over lockd's own channel: no `connect` helper that would need
        // tonic's transport feature in the generated code.
        .build_transport(false)
        .emit_rerun_if_changed(false)
        .include_file("mod.rs")
        .out_dir(out)
        .compile_protos(&files, &[protos.to_path_buf()])
}
