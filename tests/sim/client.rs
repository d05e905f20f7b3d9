//! A simulated client: LOCKs (one name or a set; alone, shared or a semaphore's slot; plain,
//! session or detach; now and then with a note; `wait=` of all kinds; the
//! same LOCK sent again after `UNAVAILABLE`, through any front-end, or after `TIMEOUT`,
//! through the same one), holds, RENEWs, CHECKs
//! and UNLOCKs; now and then it vanishes (its connections close). Every LOCK and UNLOCK goes
//! into the history with its invoke and complete times.
//!
//! A client holds a lock only as long as the lease surely lasts: from its `OK` until its
//! UNLOCK, ended early enough that the ttl (counted from the first send of that LOCK) has
//! not run out. A session lease hangs on its front-end's etcd lease as well: if that lease
//! expired meanwhile, the client's hold is taken to have ended then (lockd ends such leases
//! by design; a real holder learns of it at its next RENEW).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use lockd::backend::etcd::sim;
use lockd::backend::{Backend, BackendError, Locked, WaitResult};
use lockd::locks::{
    ConnId, LockRequest, Mode, Note, Origin, RenewRequest, TableError, Tie, Token, WaitEnd, NO_USER,
};
use lockd_etcd::sim::Rng;
use tokio::time::{sleep, timeout};

use crate::etcd_order::Mark;
use crate::history::{Call, Op, Sharing};
use crate::run::{Front, World};

const NAMES: [&str; 3] = ["a", "b", "c"];

/// How often a client sends the same LOCK again (after `UNAVAILABLE` or `TIMEOUT`) before
/// giving up.
const RESENDS: u32 = 3;

/// A grant the client holds.
struct Held {
    names: Vec<String>,
    token: Token,
    /// How: alone, a share, a semaphore's slot.
    sharing: Sharing,
    /// When the hold must end, at the latest (since the start).
    until: Duration,
    /// For a session lease, the front-ends whose etcd lease it may hang on: the one that
    /// granted it, and each one a RENEW went through (a RENEW binds it to its connection).
    session_on: Vec<usize>,
    /// When the `OK` came (since the start).
    since: Duration,
    /// When its LOCK was first sent: the grant came after.
    asked: Duration,
    /// Its lock-delay (`delay=`; zero for none).
    delay: Duration,
}

pub async fn client(world: Arc<World>, me: usize, mut rng: Rng) {
    let mut conns: BTreeMap<usize, ConnId> = BTreeMap::new();
    let mut n = 0;
    while !world.stop.is_cancelled() {
        if rng.chance(250) {
            // A cron tick: jobs on several machines start on the same second, so requests of
            // one name come to a front-end at once (group commit must keep them apart).
            let now = world.since_start();
            sleep(Duration::from_secs(now.as_secs() + 1) - now).await;
        } else {
            sleep(rng.upto(Duration::from_millis(400))).await;
        }
        if rng.chance(40) {
            world.note(format!("c{me}: vanishes (its connections close)"));
            close_all(&world, &mut conns);
            continue;
        }
        if rng.chance(20) {
            break_one(&world, &mut rng, me).await;
            continue;
        }
        n += 1;
        let id = format!("c{me}.{n}");
        if let Some(held) = lock(&world, &mut rng, &mut conns, me, &id).await {
            hold(&world, &mut rng, &mut conns, me, held).await;
        }
    }
    close_all(&world, &mut conns);
}

fn close_all(world: &World, conns: &mut BTreeMap<usize, ConnId>) {
    let fronts = world.fronts.lock().unwrap().clone();
    for (fe, conn) in std::mem::take(conns) {
        if let Some(Some(front)) = fronts.get(fe) {
            front.backend.closed(conn);
        }
    }
}

fn conn_of(conns: &mut BTreeMap<usize, ConnId>, fe: usize, b: &Backend) -> ConnId {
    *conns.entry(fe).or_insert_with(|| b.connection_id())
}

/// A LOCK, sent again with the same id after `UNAVAILABLE` or `TIMEOUT`; the grant, if any.
async fn lock(
    world: &World,
    rng: &mut Rng,
    conns: &mut BTreeMap<usize, ConnId>,
    me: usize,
    id: &str,
) -> Option<Held> {
    let name = NAMES[rng.below(3) as usize].to_owned();
    let and: Vec<String> = if rng.chance(150) {
        let other = NAMES[rng.below(3) as usize];
        (other != name)
            .then(|| other.to_owned())
            .into_iter()
            .collect()
    } else {
        Vec::new()
    };
    let ttl = Duration::from_millis(8000 + rng.below(7000));
    let wait = match rng.below(5) {
        0 => Duration::ZERO,
        1..=3 => rng.upto(Duration::from_secs(4)),
        _ => rng.upto(Duration::from_secs(10)),
    };
    let session = rng.chance(300).then(|| rng.upto(Duration::from_secs(2)));
    // `detach`: the wait ends with the connection, the lease is plain.
    let tie = match session {
        Some(grace) => Tie::Session(grace),
        None if rng.chance(150) => Tie::Detach,
        None => Tie::Plain,
    };
    // Alone mostly; now and then a share, or a slot of a semaphore of two.
    let (mode, sharing) = match rng.below(10) {
        0 | 1 => (Mode::Shared, Sharing::Shared),
        2 | 3 => (Mode::Limit(2), Sharing::Slots(2)),
        _ => (Mode::Exclusive, Sharing::Alone),
    };
    let note: Option<Note> = rng.chance(200).then(|| format!("c{me}'s job").into());
    let delay = rng.chance(300).then(|| rng.upto(Duration::from_secs(3)));
    // newest wins: every waiter of the name is answered SUPERSEDED (one name only).
    let supersede = and.is_empty() && rng.chance(80);
    // Now and then the client vanishes while it waits: how long into its wait.
    let vanish = (!wait.is_zero() && rng.chance(100)).then(|| rng.upto(wait));
    let first_sent = world.since_start();
    // After a `TIMEOUT`, the front-end the same LOCK is sent again through.
    let mut again_via: Option<usize> = None;
    for attempt in 0..=RESENDS {
        let (fe, front) = match again_via {
            Some(fe) => world.pick_again(rng, fe)?,
            None => world.pick(rng)?,
        };
        let backend = &front.backend;
        let conn = conn_of(conns, fe, backend);
        let req = LockRequest {
            name: name.as_str().into(),
            id: id.to_owned(),
            ttl: Some(ttl),
            wait: Some(wait),
            tie,
            conn,
            mode,
            note: note.clone(),
            supersede,
            and: and.clone().into_boxed_slice(),
            delay,
            ..LockRequest::default()
        };
        let call = Call::Lock {
            name: name.clone(),
            and: and.clone(),
            id: id.to_owned(),
            again: attempt > 0,
            sharing,
        };
        let invoke = world.since_start();
        let now = world.net.revision();
        world.etcd_order.mark(id, Mark::Sent(fe), now);
        let answer = front
            .call(ask(&front, req, wait, vanish))
            .await
            .unwrap_or(Answer::Lost);
        let complete = world.since_start();
        let names: Vec<String> = std::iter::once(name.clone()).chain(and.clone()).collect();
        let record = |reply: Option<String>| {
            world.note(format!(
                "c{me}: LOCK {} {id} via fe{fe} (ttl {ttl:?}, wait {wait:?}{}{}{}{}{}) -> {}",
                names.join("+"),
                match mode {
                    Mode::Exclusive => String::new(),
                    Mode::Shared => ", shared".into(),
                    Mode::Limit(n) => format!(", limit={n}"),
                },
                delay.map_or(String::new(), |d| format!(", delay {d:?}")),
                vanish.map_or(String::new(), |v| format!(", vanishes after {v:?} of it")),
                match tie {
                    Tie::Session(_) => ", session",
                    Tie::Detach => ", detach",
                    Tie::Plain => "",
                },
                if supersede { ", supersede" } else { "" },
                reply.as_deref().unwrap_or("(no answer)")
            ));
            world.ops.lock().unwrap().push(Op {
                client: me,
                call: call.clone(),
                invoke,
                complete,
                reply,
            });
        };
        match answer {
            Answer::Granted(token) => {
                // The lease surely lasts until the ttl from the first send, less a margin.
                let until = first_sent + ttl.saturating_sub(Duration::from_millis(1500));
                let lapsed = session
                    .is_some()
                    .then(|| world.net.lapsed(fe, ms(first_sent)))
                    .flatten();
                if complete >= until || lapsed.is_some() {
                    record(Some(format!("LATE {token}")));
                    let _ = backend.unlock(&name, token, NO_USER).await;
                    return None;
                }
                let tokens = vec![token.to_string(); names.len()].join(" ");
                record(Some(format!("OK {tokens}")));
                world
                    .delays
                    .grants
                    .lock()
                    .unwrap()
                    .push(crate::delays::Grant {
                        client: me,
                        names: names.clone(),
                        token,
                        rev: lockd::backend::etcd::sim::revision_of(backend, token),
                        fe,
                        at: complete,
                        sharing,
                    });
                return Some(Held {
                    names,
                    token,
                    sharing,
                    until,
                    session_on: session.map(|_| fe).into_iter().collect(),
                    since: complete,
                    asked: first_sent,
                    delay: delay.unwrap_or_default(),
                });
            }
            Answer::Ended(why) => {
                // Now and then a client whose wait ran out sends the same LOCK again at once,
                // through the same front-end, while its old waiter key may still be there: a
                // request that takes over its own id's key (1e81fa2).
                let again = why == "ERR TIMEOUT" && attempt < RESENDS && rng.chance(300);
                if crate::history::told_it_left(&why) {
                    let now = world.net.revision();
                    world.etcd_order.mark(id, Mark::Told, now);
                }
                record(Some(why));
                if !again {
                    return None;
                }
                again_via = Some(fe);
                sleep(rng.upto(Duration::from_millis(50))).await;
            }
            Answer::Unavailable(why) => {
                if why.contains("timed out") {
                    let gave_up = (id.to_owned(), fe, invoke);
                    world.gave_up.lock().unwrap().push(gave_up);
                }
                // A BREAK of its grant before its front-end confirmed it is an operator's,
                // not a fault: the grant is not the client's any more. (A BREAK takes a few
                // requests: one sent a little before this LOCK may reach its grant; seed
                // 66096.)
                let names: Vec<String> = std::iter::once(name.clone()).chain(and.clone()).collect();
                let since = first_sent.saturating_sub(Duration::from_secs(6));
                if !world.broken_since(&names, since) {
                    world.unavailable(format!("c{me}'s LOCK {id} was answered UNAVAILABLE: {why}"));
                }
                record(Some(format!("ERR UNAVAILABLE {why}")));
            }
            Answer::Lost => {
                record(None);
                conns.remove(&fe);
            }
            Answer::Vanished => {
                // A session or detach waiter leaves the queue with its connection: lockd
                // knows it left (`LEFT`, judged as a wait told it ended). A plain one does
                // not: it may still be granted, and the grant, written to a closed connection,
                // taken back; if its front-end dies first, the grant sits out its ttl, as any
                // grant whose answer was lost may (`VANISHED`).
                let left = if tie.wait_ends_on_close() {
                    "LEFT"
                } else {
                    "VANISHED"
                };
                record(Some(left.into()));
                // The waiting connection closes when its wait is over (`ask`); the others now.
                conns.remove(&fe);
                close_all(world, conns);
                return None;
            }
        }
    }
    None
}

enum Answer {
    Granted(Token),
    Ended(String),
    Unavailable(String),
    /// No answer in time: the connection is taken as lost.
    Lost,
    /// The client vanished while it waited (told nothing).
    Vanished,
}

/// A LOCK through `front`; with `vanish`, the client goes that far into its wait, as a
/// connection that breaks does in lockd's handler: a waiter tied to its connection
/// (`session`, `detach`) leaves the queue at once; a plain one stays in it (lockd can't tell a client
/// that went from one that only half-closed), and when it is granted, the grant can't be
/// written and is taken back. Either way its connection is closed once its wait is over.
async fn ask(front: &Front, req: LockRequest, wait: Duration, vanish: Option<Duration>) -> Answer {
    let limit = wait + Duration::from_secs(20);
    let backend = &front.backend;
    let (conn, tied) = (req.conn, req.tie.wait_ends_on_close());
    let asked = async {
        let mut w = match backend.lock(req).await {
            Ok(Locked::Granted { token, .. }) => return Answer::Granted(token),
            Ok(Locked::Waiting(w)) => w,
            Err(BackendError::Unavailable(why)) => return Answer::Unavailable(why),
            Err(BackendError::Table(TableError::WouldBlock { .. })) => {
                return Answer::Ended("ERR WOULDBLOCK".into())
            }
            Err(e) => return Answer::Ended(format!("ERR {e}")),
        };
        let Some(after) = vanish else {
            return waited(w.result().await);
        };
        tokio::select! {
            result = w.result() => waited(result),
            () = sleep(after) => {
                let front = front.clone();
                let name = w.name().clone();
                tokio::spawn(async move {
                    let gone = async {
                        if tied {
                            drop(w);
                        } else if let WaitResult::Granted { token, handover, .. } = w.result().await {
                            front.backend.revoke(&name, token, handover).await;
                        }
                        front.backend.closed(conn);
                    };
                    front.call(gone).await
                });
                Answer::Vanished
            }
        }
    };
    timeout(limit, asked).await.unwrap_or(Answer::Lost)
}

/// A wait's end as the client is told it.
fn waited(result: WaitResult) -> Answer {
    match result {
        WaitResult::Granted { token, .. } => Answer::Granted(token),
        WaitResult::Ended(WaitEnd::TimedOut) => Answer::Ended("ERR TIMEOUT".into()),
        WaitResult::Ended(WaitEnd::Replaced) => Answer::Ended("ERR REPLACED".into()),
        WaitResult::Ended(WaitEnd::Superseded { by }) => {
            Answer::Ended(format!("ERR SUPERSEDED by {by}"))
        }
        WaitResult::Failed(e) => Answer::Unavailable(e.to_string()),
    }
}

fn ms(d: Duration) -> u64 {
    d.as_millis() as u64
}

/// Holds a grant for a while (RENEWing and CHECKing now and then), then UNLOCKs it.
async fn hold(
    world: &World,
    rng: &mut Rng,
    conns: &mut BTreeMap<usize, ConnId>,
    me: usize,
    mut held: Held,
) {
    let end = (world.since_start() + rng.upto(Duration::from_millis(2000))).min(held.until);
    let name = held.names[rng.below(held.names.len() as u64) as usize].clone();
    if rng.chance(400) {
        sleep(end.saturating_sub(world.since_start()) / 2).await;
        if let Some((fe, front)) = world.pick(rng) {
            let backend = &front.backend;
            let conn = conn_of(conns, fe, backend);
            let renew = rng.chance(500);
            if renew && !held.session_on.is_empty() {
                held.session_on.push(fe);
            }
            let asked = async {
                if renew {
                    let req = RenewRequest {
                        name: name.clone(),
                        token: held.token,
                        ttl: None,
                        detach: false,
                    };
                    backend.renew(&req, conn, NO_USER).await.map(|_| ())
                } else {
                    backend.check(&name, held.token).await.map(|_| ())
                }
            };
            let asked = front.call(asked).await.unwrap_or_else(crashed);
            world.note(format!(
                "c{me}: RENEW/CHECK {name} {} via fe{fe} -> {asked:?}",
                held.token
            ));
            if let Err(BackendError::Unavailable(why)) = &asked {
                world.unavailable(format!(
                    "c{me}'s RENEW/CHECK of {name} was answered UNAVAILABLE: {why}"
                ));
            }
            if let Err(BackendError::Table(e)) = asked {
                let lapsed = lapsed(world, &held);
                // (A BREAK may reach etcd seconds after it was sent: a slow request.)
                let since = held.asked.saturating_sub(Duration::from_secs(6));
                let broken = world.broken_since(&held.names, since);
                // A CHECK through a front-end says the least of its wall clock and its own
                // count (proto.md): a clock ahead may make it say NOTHELD early; a RENEW
                // must not be refused.
                if renew && lapsed.is_none() && !broken && world.since_start() < held.until {
                    world.violation(format!(
                        "c{me}'s lease of {name} (token {}) was refused within its ttl: {e:?}",
                        held.token
                    ));
                }
            }
        }
    }
    sleep(end.saturating_sub(world.since_start())).await;
    // A session lease whose front-end's etcd lease expired ended then: so did the hold.
    let lapsed = lapsed(world, &held);
    let invoke = match lapsed {
        Some(at) => Duration::from_millis(at),
        None => world.since_start(),
    };

    let call = Call::Unlock {
        name: name.clone(),
        token: held.token,
    };
    let mut reply = None;
    for _ in 0..=RESENDS {
        let Some((fe, front)) = world.pick(rng) else {
            break;
        };
        let unlock = front.call(front.backend.unlock(&name, held.token, NO_USER));
        let answer = timeout(Duration::from_secs(20), unlock)
            .await
            .map(|a| a.unwrap_or_else(crashed));
        world.note(format!(
            "c{me}: UNLOCK {name} {} via fe{fe} -> {answer:?}",
            held.token
        ));
        if let Ok(Err(BackendError::Unavailable(why))) = &answer {
            world.unavailable(format!(
                "c{me}'s UNLOCK of {name} was answered UNAVAILABLE: {why}"
            ));
        }
        match answer {
            Ok(Ok(())) => {
                reply = Some("OK".to_owned());
                break;
            }
            Ok(Err(BackendError::Unavailable(_))) | Err(_) => continue,
            Ok(Err(e)) => {
                reply = Some(format!("ERR {e}"));
                break;
            }
        }
    }
    // For the lock-delay's check: whether its key went with an etcd lease's expiry is
    // known at the end of the run.
    let rev = world
        .any_front()
        .and_then(|front| sim::revision_of(&front.backend, held.token));
    if let (Some(rev), false) = (rev, held.delay.is_zero()) {
        let hold = crate::delays::Hold {
            client: me,
            names: held.names.clone(),
            rev,
            delay: held.delay,
            sharing: held.sharing,
        };
        world.delays.holds.lock().unwrap().push(hold);
    }
    world.ops.lock().unwrap().push(Op {
        client: me,
        call,
        invoke,
        complete: world.since_start(),
        reply,
    });
}

/// When the etcd lease a session lease hung on expired during the hold, if it did.
fn lapsed(world: &World, held: &Held) -> Option<u64> {
    held.session_on
        .iter()
        .filter_map(|fe| world.net.lapsed(*fe, ms(held.since)))
        .min()
}

/// The answer of a request whose front-end crashed before it answered.
fn crashed<T>() -> Result<T, BackendError> {
    Err(BackendError::Unavailable("the front-end crashed".into()))
}

/// An operator's BREAK of a name (never `force`: a broken holder keeps the lock until it
/// lets go or its lease runs out, so no two holders may follow from it).
async fn break_one(world: &World, rng: &mut Rng, me: usize) {
    let name = NAMES[rng.below(3) as usize];
    let Some((fe, front)) = world.pick(rng) else {
        return;
    };
    world.broke(name);
    let operator = Origin::default();
    let asked = front.backend.break_lock(name, None, &operator, false);
    let answer = front.call(asked).await.unwrap_or_else(crashed);
    world.note(format!("c{me}: BREAK {name} via fe{fe} -> {answer:?}"));
    if let Err(BackendError::Unavailable(why)) = &answer {
        world.unavailable(format!(
            "c{me}'s BREAK of {name} was answered UNAVAILABLE: {why}"
        ));
    }
}
