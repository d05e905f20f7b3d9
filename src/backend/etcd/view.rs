//! A name of the mirror as the lock rules ([`crate::locks::rules`]) see it, and the etcd
//! backend's LOCK decisions over it (one name, and a set of names): the backend checks no
//! mode, id or limit of its own.

use crate::locks::{rules, Limits, LockRequest, TableError};

use super::mirror::NameState;

/// A name of the mirror as the lock rules see it from one front-end .
pub struct MirrorView<'a> {
    ns: &'a NameState,
    fe: &'a str,
}

impl NameState {
    /// This name as the lock rules see it from front-end `fe`.
    pub fn view<'a>(&'a self, fe: &'a str) -> MirrorView<'a> {
        MirrorView { ns: self, fe }
    }
}

impl rules::NameView for MirrorView<'_> {
    type User = str;
    /// The holder's create revision.
    type HolderKey = i64;
    /// The waiter key's create revision (one for all the keys of a set).
    type WaiterKey = i64;
    /// A set's records name its names.
    type Name = String;

    fn holders(&self) -> impl Iterator<Item = rules::HolderOf<'_, Self>> {
        self.ns.holders.values().map(|h| {
            let v = &h.value;
            // Bound to an open connection of this front-end. A session lease bound to
            // another front-end's connection is not: that connection may be gone with its
            // front-end, its client coming back through this one.
            let open_here = v.session_ms.is_some() && v.cut_ms == 0 && v.fe == self.fe;
            rules::HolderView {
                key: h.rev,
                id: &v.id,
                user: v.user.as_str(),
                mode: v.mode,
                bound_to: open_here.then_some(v.conn),
                set: &v.set,
                lingering: v.lingering(),
            }
        })
    }

    fn queue(&self) -> impl Iterator<Item = rules::WaiterOf<'_, Self>> {
        self.ns.queue.values().map(|w| rules::WaiterView {
            key: w.rev,
            id: &w.value.id,
            user: w.value.user.as_str(),
            mode: w.value.mode,
            set: &w.value.set,
        })
    }

    fn waiters(&self) -> usize {
        self.ns.queue.len()
    }
}

/// What a LOCK `req` by `user` does on `ns`, as the lock rules decide it from front-end
/// `fe`; `leases`: the holders of every name. The one decision of the etcd backend: LOCK and
/// the model test ([`super::model`]) both come here.
pub fn decide(
    ns: &NameState,
    fe: &str,
    req: &LockRequest,
    user: &str,
    limits: &Limits,
    leases: usize,
) -> Result<rules::Decision<i64, i64>, TableError> {
    rules::decide(&ns.view(fe), &ask(req, user), limits, leases)
}

/// What a LOCK `req` by `user` of the set `names` (each name's state in `states`, in the
/// request's order) does, as the lock rules decide it from front-end `fe`: LOCK of a set
/// comes here. Holders' and waiters' records name their sets: the rules compare them with
/// `names`.
pub fn decide_set(
    states: &[&NameState],
    names: &[String],
    fe: &str,
    req: &LockRequest,
    user: &str,
    limits: &Limits,
    leases: usize,
) -> Result<rules::SetDecision<i64, i64>, TableError> {
    let views: Vec<_> = states.iter().map(|ns| ns.view(fe)).collect();
    rules::decide_set(&views, names, &ask(req, user), limits, leases)
}

/// The part of `req` (by `user`) the lock rules decide on.
pub fn ask<'a>(req: &'a LockRequest, user: &'a str) -> rules::Ask<'a, str> {
    rules::Ask {
        id: &req.id,
        user,
        mode: req.mode,
        conn: req.conn,
        wait: req.wait,
        supersede: req.supersede,
    }
}
