//! `cargo run -p etcd-proto-gen [OUT_DIR]`: regenerates lockd's etcd gRPC code (into
//! `crates/lockd-etcd/src/generated/` unless `OUT_DIR` is given). Needs protoc.

use std::path::PathBuf;
use std::process::ExitCode;

fn main() -> ExitCode {
    let out = std::env::args_os()
        .nth(1)
        .map(PathBuf::from)
        .unwrap_or_else(etcd_proto_gen::generated_dir);
    match etcd_proto_gen::generate(&etcd_proto_gen::proto_dir(), &out) {
        Ok(()) => {
            println!("wrote {}", out.display());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("etcd-proto-gen: {e}");
            ExitCode::FAILURE
        }
    }
}
