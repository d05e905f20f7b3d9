//! Running a job under a lock: `lockctl run` and `lockctl elect`.
//!
//! - [`run`]: `lockctl run`: the LOCK, then the job under it, then the release.
//! - [`supervise`]: the lock held while the job runs: signals passed on, the lease watched, the
//!   job stopped when the lease is lost.
//! - [`keeper`]: the library's renewal loop as lockctl uses it: its kill schedule and its -v
//!   messages.
//! - [`child`]: the job (the command and everything it starts), as lockctl sees it;
//!   [`supervisor`] (Linux): the job's supervisor process, lockctl re-executed; [`group`]: the
//!   command's process group and terminal, set up before exec by either.
//! - [`set_env`]: the job's `LOCKD_TOKEN*` variables.
//! - [`elect`]: `lockctl elect` (a `run` by another name) and `lockctl leader`.
//!
//! Imports go one way: `group`; `supervisor` -> `group`; `child` -> `group`, `supervisor`;
//! `keeper`, `set_env` none of them; `supervise` -> `child`, `keeper`; `run` -> all of those;
//! `elect` -> `run`.

pub mod child;
pub mod elect;
mod group;
pub mod keeper;
pub mod run;
pub mod set_env;
pub mod supervise;
#[cfg(target_os = "linux")]
pub mod supervisor;
