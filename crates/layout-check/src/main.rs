//! Fails if one lockd connection's task, in this build, weighs more than its bound
//! (`lockd::task_size`): run it on the release build, as .ci/run does:
//!
//!     cargo run --release -p layout-check

use std::process::ExitCode;

use lockd::task_size::{connection_task, TASK_BOUND};

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let size = match connection_task().await {
        Ok(size) => size,
        Err(e) => {
            eprintln!("layout-check: could not make a connection on loopback: {e}");
            return ExitCode::FAILURE;
        }
    };
    if cfg!(debug_assertions) {
        eprintln!(
            "layout-check: a debug build lays futures out differently: run it with --release"
        );
        return ExitCode::FAILURE;
    }
    println!("a connection's task: {size} bytes (bound {TASK_BOUND})");
    if size > TASK_BOUND {
        eprintln!(
            "layout-check: a connection's task grew to {size} bytes (bound {TASK_BOUND}): box the new rare path's state"
        );
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}
