//! Viewing the locks: `lockctl status` (one look), `lockctl top` (a live table) and `lockctl
//! watch` (the events as they come). `top` builds on `status`; `watch` on neither.

pub mod status;
pub mod top;
pub mod watch;
