//! A stage for stepping front-end cores by hand in tests: the in-memory etcd, the key layout,
//! and one clock, with no runtime and no network. A test writes a core's transactions to the
//! etcd itself, hands the answers back to the core, and says when a core's watch catches up,
//! so that every interleaving it wants is one it can write down.

use std::time::Instant;

use tokio::sync::oneshot;

use super::apply::Applied;
use super::head::Me;
use super::keys::Layout;
use super::mirror::KeyChange;
use super::rpc::mem::MemEtcd;
use super::rpc::{Txn, TxnResponse};
use super::state::{ClusterState, Local};
use super::tokens::Tokens;
use super::values::WaiterValue;
use super::watched::{watched, Watched};
use super::Phase;
use crate::backend::WaitResult;
use crate::locks::{LockRequest, Mode};

/// The token base every stage's mirrors use.
pub(super) const BASE: u64 = 1000;

/// The etcd every core of a test shares, and the time.
pub(super) struct Stage {
    pub(super) etcd: MemEtcd,
    pub(super) layout: Layout,
    pub(super) now: Instant,
}

/// One front-end's core on a stage.
pub(super) struct Core {
    pub(super) fe: String,
    pub(super) g: ClusterState,
}

impl Stage {
    pub(super) fn new() -> Stage {
        Stage {
            etcd: MemEtcd::new(),
            layout: Layout::new("/p/"),
            now: Instant::now(),
        }
    }

    /// Front-end `fe`'s core, before it read anything.
    pub(super) fn core(&self, fe: &str) -> Core {
        let mut g = ClusterState::new(fe);
        g.mirror.tokens = Tokens::plain(BASE);
        Core { fe: fe.into(), g }
    }

    /// Applies `txn` at the etcd as a front-end's write would be; a refusal fails the test.
    pub(super) fn write(&mut self, txn: &Txn) -> TxnResponse {
        self.etcd.apply(txn).expect("etcd refused the write")
    }

    /// `core`'s watch catches up, and the core takes the batch in as its driver would hand
    /// it over ([`watched`]): what that leads to.
    pub(super) fn watch(&self, core: &mut Core) -> Watched {
        let (changes, rev) = self.changes_for(core);
        let me = Me {
            fe: &core.fe,
            layout: &self.layout,
        };
        watched(&mut core.g, &me, &changes, rev, (self.now, 0))
    }

    /// `core`'s mirror catches up (the mirror alone: nothing is decided).
    pub(super) fn sync(&self, core: &mut Core) -> Applied {
        let (changes, rev) = self.changes_for(core);
        core.g
            .mirror
            .apply(&self.layout, &changes, rev, self.now, 0)
    }

    /// Every change of the prefix since `core`'s mirror's revision, and etcd's revision.
    fn changes_for(&self, core: &Core) -> (Vec<KeyChange>, i64) {
        let prefix = self.layout.prefix().as_bytes();
        let mut end = prefix.to_vec();
        if let Some(last) = end.last_mut() {
            *last += 1;
        }
        let from = core.g.mirror.rev + 1;
        let events = self.etcd.watch(prefix, &end, from).expect("not compacted");
        let changes: Vec<KeyChange> = events
            .iter()
            .filter_map(|e| {
                let kv = e.kv.as_ref()?;
                let put = e.r#type == super::rpc::EventType::Put as i32;
                Some(super::watch::change(kv, put))
            })
            .collect();
        (changes, self.etcd.revision())
    }
}

/// The record of a request of `id` waiting on `name` through front-end `fe` under `uid` (its
/// grant on etcd lease `lease`).
pub(super) fn waiter_value(uid: &str, id: &str, fe: &str, lease: i64) -> WaiterValue {
    WaiterValue {
        uid: uid.into(),
        id: id.into(),
        user: String::new(),
        mode: Mode::Exclusive,
        ttl_ms: 9000,
        session_ms: None,
        fe: fe.into(),
        conn: 1,
        lease,
        queued_ms: 0,
        peer: String::new(),
        note: String::new(),
        set: Vec::new(),
        delay_ms: 0,
    }
}

impl Core {
    /// Enters request `value` (on one name, `name`), whose key `key` was written at `rev`,
    /// in this core's tables as queued (its write answered); the receiver its answer comes on.
    pub(super) fn waits(
        &mut self,
        name: &str,
        slot: &str,
        key: String,
        rev: i64,
        value: WaiterValue,
        now: Instant,
    ) -> oneshot::Receiver<WaitResult> {
        let (tx, rx) = oneshot::channel();
        let waiter = rev as u64;
        self.g.by_uid.insert(value.uid.clone(), waiter);
        self.g.waiting.insert(
            waiter,
            Local {
                name: name.into(),
                uid: value.uid.clone(),
                slot: slot.into(),
                key,
                rev,
                mod_rev: rev,
                tx,
                req: LockRequest {
                    name: name.into(),
                    id: value.id.clone(),
                    ..Default::default()
                },
                value,
                queued: now,
                phase: Phase::Queued { failed_at: None },
                set: Vec::new(),
                timer: None,
            },
        );
        rx
    }
}

/// A put of `key` as the watch shows it (created at `create`, written at `modr`, on no etcd
/// lease): for tests that set a mirror by hand.
pub(super) fn put(key: String, value: String, create: i64, modr: i64) -> KeyChange {
    KeyChange {
        put: true,
        key: key.into_bytes(),
        value: value.into_bytes(),
        create_rev: create,
        mod_rev: modr,
        lease: 0,
    }
}

/// A delete of `key` at revision `rev`, as the watch shows it.
pub(super) fn del(key: String, rev: i64) -> KeyChange {
    KeyChange {
        put: false,
        key: key.into_bytes(),
        value: Vec::new(),
        create_rev: 0,
        mod_rev: rev,
        lease: 0,
    }
}
