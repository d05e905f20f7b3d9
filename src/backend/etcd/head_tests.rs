//! The core's hand-over to a queue's head (`head.rs`), stepped by hand: no runtime, no
//! etcd, no clock but the `now` each step is given. Each test is a short story of the
//! mirror's changes, the core's decisions and the answers it gets.

use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use super::head::{head_answered, head_step, HeadAfter, HeadStep, Me};
use super::keys::Layout;
use super::mirror::KeyChange;
use super::rpc::{txn_answer, Error};
use super::stepping::{del, put, waiter_value, Core, Stage, BASE};
use super::values::HolderValue;
use crate::backend::WaitResult;

const FE: &str = "fe-a";

/// One front-end's core, its layout, and its clock (its mirror is set by hand).
struct Front {
    c: Core,
    layout: Layout,
    now: Instant,
}

fn holder_value(id: &str) -> String {
    let mut v = waiter_value("h-1", id, "fe-b", 0).holder(0);
    v.deadline_ms = 60_000;
    HolderValue::encode(&v)
}

impl Front {
    /// Front-end `fe-a`, whose mirror shows `x` held by `other` (created at revision 5).
    fn with_x_held() -> Front {
        let stage = Stage::new();
        let mut f = Front {
            c: stage.core(FE),
            layout: stage.layout,
            now: stage.now,
        };
        let holder = f.layout.holder("x", "h1");
        f.apply(&[put(holder, holder_value("other"), 5, 5)], 5);
        f
    }

    fn apply(&mut self, changes: &[KeyChange], rev: i64) {
        self.c
            .g
            .mirror
            .apply(&self.layout, changes, rev, self.now, 0);
    }

    /// A request of this front-end waiting on `x` under `uid`, its key written at `rev`
    /// (queued, its write answered); the receiver its answer comes on.
    fn queue(&mut self, uid: &str, slot: &str, rev: i64) -> oneshot::Receiver<WaitResult> {
        let key = self.layout.waiter("x", slot);
        let value = waiter_value(uid, "me", FE, 0);
        self.apply(&[put(key.clone(), value.encode(), rev, rev)], rev);
        self.c.waits("x", slot, key, rev, value, self.now)
    }

    /// The holder of `x` released at `rev` (its key gone, the marker written).
    fn release(&mut self, rev: i64) {
        let holder = self.layout.holder("x", "h1");
        let marker = self.layout.marker("x");
        self.apply(
            &[
                put(marker, "kind=released".into(), 2, rev),
                del(holder, rev),
            ],
            rev,
        );
    }

    fn step(&mut self) -> HeadStep {
        self.now += Duration::from_millis(10);
        let (me, g) = (
            Me {
                fe: FE,
                layout: &self.layout,
            },
            &mut self.c.g,
        );
        head_step(g, &me, "x", self.now, 0)
    }
}

fn unreachable() -> Error {
    Error::from(std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        "etcdserver: request timed out",
    ))
}

#[test]
fn a_head_that_does_not_fit_waits_and_is_tried_once_the_holder_goes() {
    let mut f = Front::with_x_held();
    let mut rx = f.queue("fe-a-1", "s1", 6);
    assert!(matches!(f.step(), HeadStep::Wait), "x is held");
    f.release(7);
    let HeadStep::Try(a) = f.step() else {
        panic!("the head fits now: its grant is tried");
    };
    assert_eq!((a.rev, a.mod_rev, a.name.as_str()), (6, 6, "x"));
    assert_eq!(a.parts.len(), 1, "one name, one part");
    // Tried once: the name has not changed, so looking again tries nothing more.
    assert!(matches!(f.step(), HeadStep::Wait));
    // Applied at revision 8: delivered with the token of that revision.
    let after = head_answered(&mut f.c.g, &a, &Ok(txn_answer(true, 8, Vec::new())), f.now);
    assert!(matches!(after, HeadAfter::Granted { token, back: None } if token == BASE + 8));
    match rx.try_recv() {
        Ok(WaitResult::Granted { token, .. }) => assert_eq!(token, BASE + 8),
        other => panic!("the waiter is told of its grant: {other:?}"),
    }
    assert!(f.c.g.waiting.is_empty() && f.c.g.by_uid.is_empty());
}

#[test]
fn a_grant_etcd_did_not_answer_is_tried_again_after_a_pause() {
    let mut f = Front::with_x_held();
    let _rx = f.queue("fe-a-1", "s1", 6);
    f.release(7);
    let HeadStep::Try(a) = f.step() else {
        panic!("tried");
    };
    let after = head_answered(&mut f.c.g, &a, &Err(unreachable()), f.now);
    assert!(matches!(
        after,
        HeadAfter::NotGranted {
            retry: true,
            pause: true
        }
    ));
    assert!(
        matches!(f.step(), HeadStep::Try(_)),
        "tried again without a change of the name"
    );
}

#[test]
fn a_grant_refused_by_its_guards_waits_for_the_name_to_change() {
    let mut f = Front::with_x_held();
    let _rx = f.queue("fe-a-1", "s1", 6);
    f.release(7);
    let HeadStep::Try(a) = f.step() else {
        panic!("tried");
    };
    // Another front-end's write came first (the marker moved): the guards failed.
    let after = head_answered(&mut f.c.g, &a, &Ok(txn_answer(false, 8, Vec::new())), f.now);
    assert!(matches!(
        after,
        HeadAfter::NotGranted {
            retry: false,
            pause: false
        }
    ));
    assert!(matches!(f.step(), HeadStep::Wait), "not before x changes");
    let marker = f.layout.marker("x");
    f.apply(&[put(marker, "kind=released".into(), 2, 8)], 8);
    assert!(
        matches!(f.step(), HeadStep::Try(_)),
        "x changed: tried again"
    );
}

#[test]
fn a_grant_to_a_waiter_that_left_meanwhile_is_taken_back_as_handed_over() {
    let mut f = Front::with_x_held();
    let mut rx = f.queue("fe-a-1", "s1", 6);
    f.release(7);
    let HeadStep::Try(a) = f.step() else {
        panic!("tried");
    };
    // Its wait ran out while the grant was out.
    let waiter = f.c.g.by_uid["fe-a-1"];
    let left = f.c.g.leave(waiter).expect("it waited");
    drop(left);
    let after = head_answered(&mut f.c.g, &a, &Ok(txn_answer(true, 8, Vec::new())), f.now);
    let HeadAfter::Granted {
        token,
        back: Some(back),
    } = after
    else {
        panic!("the grant goes back");
    };
    assert_eq!(
        (token, back.token, back.name.as_str()),
        (BASE + 8, BASE + 8, "x")
    );
    assert_eq!(back.handover, crate::backend::HandOver(8));
    assert!(rx.try_recv().is_err(), "nobody is told of it");
}

#[test]
fn another_front_ends_head_is_left_to_it_and_an_orphan_of_ours_is_forgotten() {
    let mut f = Front::with_x_held();
    f.release(7);
    // fe-b's waiter heads the queue: not ours to grant.
    let theirs = waiter_value("fe-b-1", "them", "fe-b", 0);
    let key = f.layout.waiter("x", "t1");
    f.apply(&[put(key.clone(), theirs.encode(), 8, 8)], 8);
    assert!(matches!(f.step(), HeadStep::Wait));
    // Gone; now a key of ours that no request of ours waits for.
    f.apply(&[del(key, 9)], 9);
    let orphan = waiter_value("fe-a-9", "gone", FE, 0);
    let key = f.layout.waiter("x", "s9");
    f.apply(&[put(key.clone(), orphan.encode(), 10, 10)], 10);
    match f.step() {
        HeadStep::Forget { keys, mod_rev } => assert_eq!((keys, mod_rev), (vec![key], 10)),
        _ => panic!("the orphan key goes"),
    }
}
