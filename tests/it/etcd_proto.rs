//! The checked-in etcd gRPC code (`crates/lockd-etcd/src/generated/`) is what its trimmed
//! protos give: regenerated into a temporary directory with protoc and compared file by
//! file, so a `.proto` edited without `cargo run -p etcd-proto-gen` (or a hand edit of the
//! generated code) fails here. Needs protoc (skips visibly without it; CI has it).

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;

use crate::common::durable::TempDir;
use crate::common::needs::{have, Need};

fn files(dir: &Path) -> BTreeMap<String, String> {
    fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
        .map(|e| {
            let path = e.expect("directory entry").path();
            let name = path
                .file_name()
                .expect("file name")
                .to_string_lossy()
                .into_owned();
            let text = fs::read_to_string(&path)
                .unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
            (name, text)
        })
        .collect()
}

#[test]
fn checked_in_code_is_what_the_protos_give() {
    if !have(Need::Protoc) {
        return;
    }
    let tmp = TempDir::new("etcd-proto");
    etcd_proto_gen::generate(&etcd_proto_gen::proto_dir(), &tmp.0)
        .expect("etcd-proto-gen runs protoc");
    let fresh = files(&tmp.0);
    let checked_in = files(&etcd_proto_gen::generated_dir());
    assert_eq!(
        fresh.keys().collect::<Vec<_>>(),
        checked_in.keys().collect::<Vec<_>>(),
        "the generated files"
    );
    for (name, text) in &fresh {
        assert!(
            checked_in[name] == *text,
            "crates/lockd-etcd/src/generated/{name} is not what the protos give: run \
             `cargo run -p etcd-proto-gen` and commit the result"
        );
    }
}
