//! The lock rules: what a LOCK does on one name or a set of names, where it waits and whom it
//! ends, and who may hold a name beside whom.
//!
//! This is the one place they are written. The embedded table ([`super::Locks`]) and the
//! etcd backend (over its mirror of the cluster) each show their state of one name through
//! [`NameView`] (with the sets its holders and waiters belong to) and carry out the
//! [`Decision`] or [`SetDecision`]: the place a request waits in and the waiters it ends
//! come from here too. Neither backend checks a mode, an id, a limit or a set of its own. A
//! rule that lived in two places would one day differ, and mutual exclusion is the product:
//! the model test drives this module through both views.
//!
//! Pure: no clock, no I/O; the views are borrowed, nothing is copied but the answer.

use std::sync::Arc;
use std::time::Duration;

use super::{ConnId, Limits, Mode, TableError};

/// A holder of the name, as a [`NameView`] shows it. `N`: how the backend names a name of a
/// set ([`NameView::Name`]).
pub struct HolderView<'a, U: ?Sized, K, N> {
    /// How the backend finds this holder again (a token, a key revision).
    pub key: K,
    /// The client's id (`LOCK <name> <id>`).
    pub id: &'a str,
    /// The user it authenticated as.
    pub user: &'a U,
    /// The mode it holds the name in.
    pub mode: Mode,
    /// The open connection of this server a session lease is bound to: only that
    /// connection may take it up again by the same id. `None` for a plain lease, a session
    /// lease in its grace (its connection closed), or one bound to another server's
    /// connection (in cluster mode it moves here, as a RENEW through this server would move
    /// it: whether that connection still lives can't be known from here).
    pub bound_to: Option<ConnId>,
    /// The names its lease holds when it is a set (`and=`), in any order; empty when it
    /// holds this name alone. A retry of a set is one only as this very set.
    pub set: &'a [N],
    /// Over for its holder (a BREAK, or its lock-delay after its time ran out), but still in
    /// its place on the name: nobody's to take up again (a LOCK by its id waits like anyone's).
    pub lingering: bool,
}

/// A waiter of the name, as a [`NameView`] shows it.
pub struct WaiterView<'a, U: ?Sized, K, N> {
    /// How the backend finds this waiter again (a ticket, a key revision): a set waiter has
    /// the same key in every one of its queues.
    pub key: K,
    /// The client's id.
    pub id: &'a str,
    /// The user it authenticated as.
    pub user: &'a U,
    /// The mode it asks for.
    pub mode: Mode,
    /// The names it waits for as one set (`and=`), in any order; empty when it waits for
    /// this name alone. A LOCK of the very same set keeps its place.
    pub set: &'a [N],
}

/// A [`HolderView`] of the name a [`NameView`] `V` shows.
pub type HolderOf<'a, V> =
    HolderView<'a, <V as NameView>::User, <V as NameView>::HolderKey, <V as NameView>::Name>;
/// A [`WaiterView`] of the name a [`NameView`] `V` shows.
pub type WaiterOf<'a, V> =
    WaiterView<'a, <V as NameView>::User, <V as NameView>::WaiterKey, <V as NameView>::Name>;

/// One name's holders (in the order they were granted) and queue (first in line first).
pub trait NameView {
    /// Who a request is from: the same id is the same client only within one user.
    type User: PartialEq + ?Sized;
    /// What [`HolderView::key`] is: one lease has one key on every name it holds.
    type HolderKey: PartialEq;
    /// What [`WaiterView::key`] is: one waiting request has one key on every name it waits
    /// for.
    type WaiterKey: PartialEq + Clone;
    /// How the backend names a name of a set in [`HolderView::set`] and [`WaiterView::set`]
    /// (the table: its slot; etcd: the name itself).
    type Name: Ord;

    /// The holders, in the order they were granted.
    fn holders(&self) -> impl Iterator<Item = HolderOf<'_, Self>>;
    /// The waiters, first in line first.
    fn queue(&self) -> impl Iterator<Item = WaiterOf<'_, Self>>;
    /// How many wait (the queue's length, without walking it).
    fn waiters(&self) -> usize;
}

/// The part of a LOCK the rules look at.
pub struct Ask<'a, U: ?Sized> {
    /// The client's id.
    pub id: &'a str,
    /// The user it authenticated as.
    pub user: &'a U,
    /// The mode it asks for.
    pub mode: Mode,
    /// The connection it came on.
    pub conn: ConnId,
    /// `None` waits without bound; zero does not wait.
    pub wait: Option<Duration>,
    /// `supersede`: if it has to wait, it takes the whole queue (newest wins).
    pub supersede: bool,
}

/// What a LOCK does.
#[derive(Debug, PartialEq, Eq)]
pub enum Decision<H, W> {
    /// The same id (and user) already holds it: the same grant again, with a new lease.
    Again(H),
    /// A new holder, now.
    Grant,
    /// Wait in line, at `place`, once the waiters it ends are gone.
    Queue {
        /// Where it waits: `None` at the back of the queue (a new place), else in the place
        /// of this waiter, the same id's older request (the first of `replaced`): a client
        /// that asks again keeps its place in line.
        place: Option<W>,
        /// The same id's older requests on the name, first in line first: each is answered
        /// `ERR REPLACED` (a set leaves all its queues). One at most, but a cluster may
        /// briefly show more, written through two front-ends at once.
        replaced: Vec<W>,
        /// For a `supersede` LOCK, every other waiter of the name, first in line first: each
        /// is answered `ERR SUPERSEDED`, and this request, at the back of the emptied queue,
        /// waits at its head.
        superseded: Vec<W>,
    },
}

/// Decides a LOCK `ask` on the name `view` shows. `leases`: how many leases are held in all
/// (a new holder must stay within [`Limits::max_locks`]). The same id holding the name as
/// part of a set holds no lease of it alone: a one-name LOCK of it is `Conflict` (release
/// the set first), not a retry. The same id waiting as part of a set is replaced: this
/// LOCK takes the set's place on this name, and the set leaves its other queues.
pub fn decide<V: NameView>(
    view: &V,
    ask: &Ask<'_, V::User>,
    limits: &Limits,
    leases: usize,
) -> Result<Decision<V::HolderKey, V::WaiterKey>, TableError> {
    match decide_name(view, ask, limits, leases)? {
        (Decision::Again(_), set) if !set.is_empty() => Err(TableError::Conflict),
        (decision, _) => Ok(decision),
    }
}

/// A [`Decision`] about the name a [`NameView`] shows.
type NameDecision<V> = Decision<<V as NameView>::HolderKey, <V as NameView>::WaiterKey>;

/// [`decide`] for one name, alone or of a set; with an [`Decision::Again`], the names of the
/// set the lease that holds it is ([`HolderView::set`]; empty: this name alone).
fn decide_name<'v, V: NameView>(
    view: &'v V,
    ask: &Ask<'_, V::User>,
    limits: &Limits,
    leases: usize,
) -> Result<(NameDecision<V>, &'v [V::Name]), TableError> {
    // The name's mode is its holders', or while a hand-over is on its way (cluster mode), its
    // queue's: exclusive and shared are the two sides of one read/write lock; a semaphore
    // only mixes with the same semaphore.
    let held = match view.holders().next() {
        Some(h) => Some(h.mode),
        None => view.queue().next().map(|w| w.mode),
    };
    if let Some(held) = held {
        if !held.same_kind(ask.mode) {
            return Err(TableError::WrongMode {
                held,
                asked: ask.mode,
            });
        }
    }

    // A repeat by a holder (typically a retry after a lost reply): same grant, new lease.
    // Two processes can't share it through one id while the first one's session connection
    // is open; a session lease in its grace has none, so its holder coming back takes it up.
    if let Some(same) = view
        .holders()
        .find(|h| !h.lingering && h.id == ask.id && h.user == ask.user)
    {
        if same.mode != ask.mode {
            return Err(TableError::WrongMode {
                held: same.mode,
                asked: ask.mode,
            });
        }
        if matches!(same.bound_to, Some(c) if c != ask.conn) {
            return Err(TableError::Conflict);
        }
        return Ok((Decision::Again(same.key), same.set));
    }

    // Granted at once only without overtaking anyone.
    if view.waiters() == 0 && admits(view.holders().map(|h| h.mode), ask.mode) {
        if leases >= limits.max_locks {
            return Err(TableError::TooManyLocks {
                max: limits.max_locks,
            });
        }
        return Ok((Decision::Grant, &[]));
    }

    if ask.wait == Some(Duration::ZERO) {
        let holder = view.holders().next().map_or("(queue)", |h| h.id);
        return Err(TableError::WouldBlock {
            holder: Arc::from(holder),
        });
    }

    // A LOCK by an id that already waits takes over that place; only a new one lengthens
    // the queue.
    let replaced: Vec<V::WaiterKey> = same_waiters(view, ask).collect();
    if ask.supersede {
        // Newest wins: the whole queue goes (the same id's own older request as REPLACED,
        // the others as SUPERSEDED), so it never grows past this one request, which waits
        // at the back of the emptied queue: its head.
        let mut replaced = replaced;
        replaced.truncate(1);
        let superseded = superseded_waiters(view, ask).collect();
        let queue = Decision::Queue {
            place: None,
            replaced,
            superseded,
        };
        return Ok((queue, &[]));
    }
    if replaced.is_empty() && view.waiters() >= limits.max_waiters {
        return Err(TableError::TooManyWaiters {
            max: limits.max_waiters,
        });
    }
    let place = replaced.first().cloned();
    let queue = Decision::Queue {
        place,
        replaced,
        superseded: Vec::new(),
    };
    Ok((queue, &[]))
}

/// What a LOCK of a set of names (`and=`) does: one answer for all of them.
#[derive(Debug, PartialEq, Eq)]
pub enum SetDecision<H, W> {
    /// The same id (and user) already holds every name (a retry after a lost reply): the
    /// same grants again, in the request's order, with one new lease.
    Again(Vec<H>),
    /// New holders of every name, now.
    Grant,
    /// Wait in line on every name at once, the free ones too (nobody may take one of them
    /// meanwhile: that is what makes the set first in line everywhere in the end), at
    /// `place`, once the waiters it ends are gone.
    Queue {
        /// Where it waits: `None` at the back of every queue (a new place), else in the
        /// place of this waiter in every queue: the same id's one older request, waiting for
        /// the very same names, in any order. Keeping places name by name for a different
        /// set could put two requests in opposite orders in two queues, which is a
        /// deadlock.
        place: Option<W>,
        /// The same id's older requests on any of the names, each once (a set has one key in
        /// all its queues), in the request's order of names, first in line first: each is
        /// answered `ERR REPLACED` and leaves all its queues.
        replaced: Vec<W>,
    },
}

/// Decides a LOCK of the set of names `views` show (in the request's order, no name twice):
/// every name as [`decide`] would, then one answer for all. Any refusal of any name (its
/// shape, CONFLICT, LIMIT, `wait=0` finding it held or queued) refuses the whole set, and
/// nothing changes. `leases`: as for [`decide`]; a grant adds one lease per name.
///
/// `names`: the asked names as the views' [`HolderView::set`] and [`WaiterView::set`] name
/// them, in any order. A backend that has no name for one of them (the table: a name
/// without an entry, which no set holds or waits for) leaves it out: then no held or
/// waiting set is this very set.
///
/// Why no set ever deadlocks: a set joins the queue of every one of its names in one step
/// (the table is serialized; etcd orders by revision), and is granted only when nobody waits
/// before it in any of them ([`set_ready`]). So queues agree on the order of any two
/// requests, and the earliest request still waiting is first in each of its queues: it
/// waits for holders only, which leave. FIFO per name is kept as for one name: nobody
/// overtakes a set, and a set overtakes nobody.
pub fn decide_set<V: NameView>(
    views: &[V],
    names: &[V::Name],
    ask: &Ask<'_, V::User>,
    limits: &Limits,
    leases: usize,
) -> Result<SetDecision<V::HolderKey, V::WaiterKey>, TableError> {
    // The protocol refuses `supersede` with `and=`: taking several queues at once would end
    // waiters that never asked for this set.
    let plain = Ask {
        id: ask.id,
        user: ask.user,
        mode: ask.mode,
        conn: ask.conn,
        wait: ask.wait,
        supersede: false,
    };
    // Every name named: a held or waiting set may be this very set.
    let this_set = |set: &[V::Name]| names.len() == views.len() && same_set(set, names);
    let mut again = Vec::new();
    let mut held_set: &[V::Name] = &[];
    let mut queued = false;
    let mut replaced: Vec<V::WaiterKey> = Vec::new();
    for view in views {
        match decide_name(view, &plain, limits, leases)? {
            (Decision::Again(key), set) => {
                again.push(key);
                held_set = set;
            }
            (Decision::Grant, _) => {}
            (Decision::Queue { replaced: r, .. }, _) => {
                queued = true;
                for key in r {
                    if !replaced.contains(&key) {
                        replaced.push(key);
                    }
                }
            }
        }
    }
    if !again.is_empty() {
        // A set is one lease: an id that holds some of its names (alone, or in another
        // set) can't make them part of a new one. The same id holding all of them is a
        // retry only as this very set: one lease on every name (one key), a set of exactly
        // these names, not separate leases or a larger set.
        let one_lease = again.windows(2).all(|w| w[0] == w[1]);
        if again.len() != views.len() || !one_lease || !this_set(held_set) {
            return Err(TableError::Conflict);
        }
        return Ok(SetDecision::Again(again));
    }
    if !queued {
        if leases.saturating_add(views.len()) > limits.max_locks {
            return Err(TableError::TooManyLocks {
                max: limits.max_locks,
            });
        }
        return Ok(SetDecision::Grant);
    }
    // (With `wait=0` no name queues: `decide` refused it as `WouldBlock` above.)
    // The same id's one older request for these very names keeps its place (its key, in
    // every queue) for this one; any other is replaced from the back.
    let place = match replaced.as_slice() {
        [old] => views
            .iter()
            .flat_map(|v| v.queue())
            .find(|w| &w.key == old)
            .filter(|w| this_set(w.set))
            .map(|w| w.key),
        _ => None,
    };
    Ok(SetDecision::Queue { place, replaced })
}

/// Whether a request waiting as `places` (per name of its set: that name's view and the
/// request's waiter key in it) in `mode` is granted now: first in line in every one of its
/// names' queues, and fitting beside each name's holders. A single name is the set of one.
pub fn set_ready<'v, V, I>(places: I, mode: Mode) -> bool
where
    V: NameView + 'v,
    I: IntoIterator<Item = (&'v V, &'v V::WaiterKey)>,
{
    places.into_iter().all(|(view, key)| {
        view.queue().next().is_some_and(|first| &first.key == key)
            && admits(view.holders().map(|h| h.mode), mode)
    })
}

/// Whether a waiter of `id` (and `user`) whose key left the name without a grant (and with
/// no other word of why) was replaced: the name shows a waiter of that id, the newer LOCK
/// that took its place over in the same write (the `place` of its [`Decision::Queue`]).
pub fn replaced_by_own_id<V: NameView>(view: &V, id: &str, user: &V::User) -> bool {
    view.queue().any(|w| w.id == id && w.user == user)
}

/// The waiters a `supersede` LOCK `ask` ends as SUPERSEDED: every waiter but the same id's
/// (and user's) first one, which it replaces. (Further waiters of the same id, which a
/// cluster may briefly show, are superseded too: one of them is the request it replaces.)
fn superseded_waiters<'v, V: NameView>(
    view: &'v V,
    ask: &'v Ask<'_, V::User>,
) -> impl Iterator<Item = V::WaiterKey> + 'v {
    let mut first_same = true;
    view.queue()
        .filter(move |w| {
            if first_same && w.id == ask.id && w.user == ask.user {
                first_same = false;
                return false;
            }
            true
        })
        .map(|w| w.key)
}

/// Which leases a BREAK of the name `view` shows ends: every holder's, or with `only` the
/// one holder whose key it is. A free name, or a key that is not one of its holders:
/// `NotHeld`. The queue then moves as after a release (each backend's release does it).
pub fn breaks<V: NameView>(
    view: &V,
    only: Option<&V::HolderKey>,
) -> Result<Vec<V::HolderKey>, TableError> {
    let ended: Vec<_> = view
        .holders()
        .map(|h| h.key)
        .filter(|key| only.is_none_or(|only| key == only))
        .collect();
    if ended.is_empty() {
        return Err(TableError::NotHeld);
    }
    Ok(ended)
}

/// The waiters of the same id (and user) as `ask`, first in line first: a LOCK takes the
/// first one's place. (A cluster may briefly show more than one, written through two
/// front-ends at once; the ones after the first go.)
fn same_waiters<'v, V: NameView>(
    view: &'v V,
    ask: &'v Ask<'_, V::User>,
) -> impl Iterator<Item = V::WaiterKey> + 'v {
    view.queue()
        .filter(move |w| w.id == ask.id && w.user == ask.user)
        .map(|w| w.key)
}

/// Whether one more holder in `mode` fits beside holders in the modes `holding` (the queue
/// aside): anyone fits a free name; then all shared holders together, or a semaphore's
/// holders up to its limit; an exclusive holder alone.
pub fn admits(holding: impl Iterator<Item = Mode>, mode: Mode) -> bool {
    let mut n = 0usize;
    for held in holding {
        if held != mode {
            return false;
        }
        n += 1;
    }
    n == 0
        || match mode {
            Mode::Exclusive => false,
            Mode::Shared => true,
            Mode::Limit(limit) => n < limit as usize,
        }
}

/// Whether a held or waiting set and a new LOCK of the same id ask for the same names, in
/// any order: then the new LOCK is a retry of the held set, or takes over the waiting set's
/// place in every queue (its one ticket, or in etcd its keys' create revision), as a LOCK of
/// one name takes over its own older wait. Any other older request of the id is replaced by
/// a request at the back.
fn same_set<T: Ord>(set: &[T], asked: &[T]) -> bool {
    if set.len() != asked.len() {
        return false;
    }
    let mut a: Vec<&T> = set.iter().collect();
    let mut b: Vec<&T> = asked.iter().collect();
    a.sort();
    b.sort();
    a == b
}

/// The note a holder keeps when its own id LOCKs again (a retry, [`Decision::Again`]), and
/// a waiter when its id's newer LOCK takes its place: the new LOCK's note if it carries one,
/// else the one it had. A retry that forgot its note must not wipe what people read in
/// STATUS; one that says something new is the holder's latest word.
pub fn note_again<'n, N: ?Sized>(had: Option<&'n N>, asked: Option<&'n N>) -> Option<&'n N> {
    asked.or(had)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A name as plain vectors: (id, user, mode, bound connection). Names of sets are
    /// numbers.
    #[derive(Default)]
    struct Plain {
        holders: Vec<(&'static str, u32, Mode, Option<ConnId>)>,
        queue: Vec<(&'static str, u32, Mode)>,
        /// Every holder's lease is this set (empty: no set).
        set: Vec<u8>,
        /// The sets of the waiters, by their place in `queue` (missing: none).
        waiting_sets: Vec<Vec<u8>>,
        /// A number added to every waiter's key: a set waiter has one key in all queues.
        first_key: usize,
    }

    impl NameView for Plain {
        type User = u32;
        type HolderKey = usize;
        type WaiterKey = usize;
        type Name = u8;

        fn holders(&self) -> impl Iterator<Item = HolderOf<'_, Self>> {
            self.holders
                .iter()
                .enumerate()
                .map(|(key, (id, user, mode, bound_to))| HolderView {
                    key,
                    id,
                    user,
                    mode: *mode,
                    bound_to: *bound_to,
                    set: &self.set,
                    lingering: false,
                })
        }

        fn queue(&self) -> impl Iterator<Item = WaiterOf<'_, Self>> {
            self.queue
                .iter()
                .enumerate()
                .map(|(i, (id, user, mode))| WaiterView {
                    key: self.first_key + i,
                    id,
                    user,
                    mode: *mode,
                    set: self.waiting_sets.get(i).map_or(&[][..], Vec::as_slice),
                })
        }

        fn waiters(&self) -> usize {
            self.queue.len()
        }
    }

    fn limits(max_waiters: usize) -> Limits {
        Limits {
            max_waiters,
            ..Limits::default()
        }
    }

    fn ask(id: &'static str, mode: Mode, wait: Option<Duration>) -> Ask<'static, u32> {
        Ask {
            id,
            user: &0,
            mode,
            conn: 1,
            wait,
            supersede: false,
        }
    }

    #[test]
    fn free_name_is_granted_within_max_locks() {
        let free = Plain::default();
        let a = ask("p", Mode::Exclusive, None);
        assert_eq!(decide(&free, &a, &limits(1), 0), Ok(Decision::Grant));
        let full = decide(
            &free,
            &a,
            &Limits {
                max_locks: 1,
                ..limits(1)
            },
            1,
        );
        assert_eq!(full, Err(TableError::TooManyLocks { max: 1 }));
    }

    #[test]
    fn same_id_gets_the_same_grant_unless_bound_elsewhere() {
        let held = Plain {
            holders: vec![("p", 0, Mode::Exclusive, Some(2))],
            ..Plain::default()
        };
        let a = ask("p", Mode::Exclusive, None);
        assert_eq!(decide(&held, &a, &limits(1), 1), Err(TableError::Conflict));
        let on_2 = Ask {
            conn: 2,
            ..ask("p", Mode::Exclusive, None)
        };
        assert_eq!(decide(&held, &on_2, &limits(1), 1), Ok(Decision::Again(0)));
        let other_user = Ask {
            user: &7,
            ..ask("p", Mode::Exclusive, Some(Duration::ZERO))
        };
        assert!(matches!(
            decide(&held, &other_user, &limits(1), 1),
            Err(TableError::WouldBlock { .. })
        ));
    }

    #[test]
    fn modes_and_the_queue() {
        let shared = Plain {
            holders: vec![("p", 0, Mode::Shared, None)],
            ..Plain::default()
        };
        let s = ask("q", Mode::Shared, None);
        assert_eq!(decide(&shared, &s, &limits(1), 1), Ok(Decision::Grant));
        let x = ask("q", Mode::Exclusive, None);
        assert_eq!(
            decide(&shared, &x, &limits(1), 1),
            Ok(Decision::Queue {
                place: None,
                replaced: vec![],
                superseded: vec![]
            })
        );
        let sem = ask("q", Mode::Limit(2), None);
        assert!(matches!(
            decide(&shared, &sem, &limits(1), 1),
            Err(TableError::WrongMode { .. })
        ));
        // Nobody overtakes a waiter, and a full queue takes only a replacement.
        let queued = Plain {
            holders: vec![("p", 0, Mode::Shared, None)],
            queue: vec![("w", 0, Mode::Exclusive)],
            ..Plain::default()
        };
        assert_eq!(
            decide(&queued, &s, &limits(1), 1),
            Err(TableError::TooManyWaiters { max: 1 })
        );
        let again = ask("w", Mode::Exclusive, None);
        assert_eq!(
            decide(&queued, &again, &limits(1), 1),
            Ok(Decision::Queue {
                place: Some(0),
                replaced: vec![0],
                superseded: vec![]
            })
        );
    }

    #[test]
    fn a_retry_keeps_its_note_unless_it_brings_one() {
        assert_eq!(note_again(Some("old"), None), Some("old"));
        assert_eq!(note_again(Some("old"), Some("new")), Some("new"));
        assert_eq!(note_again::<str>(None, None), None);
        assert_eq!(note_again(None, Some("new")), Some("new"));
    }

    #[test]
    fn a_break_ends_every_holder_or_the_one_named() {
        let shared = Plain {
            holders: vec![("p", 0, Mode::Shared, None), ("q", 0, Mode::Shared, None)],
            queue: vec![("w", 0, Mode::Exclusive)],
            ..Plain::default()
        };
        assert_eq!(breaks(&shared, None), Ok(vec![0, 1]));
        assert_eq!(breaks(&shared, Some(&1)), Ok(vec![1]));
        assert_eq!(breaks(&shared, Some(&7)), Err(TableError::NotHeld));
        assert_eq!(breaks(&Plain::default(), None), Err(TableError::NotHeld));
    }

    #[test]
    fn supersede_takes_the_queue_but_never_a_grant() {
        let queued = Plain {
            holders: vec![("p", 0, Mode::Exclusive, None)],
            queue: vec![
                ("a", 0, Mode::Exclusive),
                ("me", 0, Mode::Exclusive),
                ("b", 0, Mode::Exclusive),
            ],
            ..Plain::default()
        };
        let me = Ask {
            supersede: true,
            ..ask("me", Mode::Exclusive, None)
        };
        // A full queue (max 1) is no refusal: the queue becomes this one request.
        assert_eq!(
            decide(&queued, &me, &limits(1), 1),
            Ok(Decision::Queue {
                place: None,
                replaced: vec![1],
                superseded: vec![0, 2]
            })
        );
        // wait=0 refuses, and a refused request supersedes nobody.
        let now = Ask {
            wait: Some(Duration::ZERO),
            ..me
        };
        assert!(matches!(
            decide(&queued, &now, &limits(1), 1),
            Err(TableError::WouldBlock { .. })
        ));
        // The shape is checked first.
        let sem = Ask {
            supersede: true,
            ..ask("me", Mode::Limit(2), None)
        };
        assert!(matches!(
            decide(&queued, &sem, &limits(1), 1),
            Err(TableError::WrongMode { .. })
        ));
        // On a free name it is a plain grant.
        let free = Plain::default();
        assert_eq!(decide(&free, &me, &limits(1), 0), Ok(Decision::Grant));
    }

    /// The names of a set of two: names 0 and 1.
    const AB: [u8; 2] = [0, 1];

    #[test]
    fn a_set_is_granted_refused_or_queued_as_one() {
        let free = Plain::default();
        let held = Plain {
            holders: vec![("p", 0, Mode::Exclusive, None)],
            ..Plain::default()
        };
        let me = ask("me", Mode::Exclusive, None);
        let two_free = [Plain::default(), Plain::default()];
        assert_eq!(
            decide_set(&two_free, &AB, &me, &limits(4), 0),
            Ok(SetDecision::Grant)
        );
        // One lease per name: the set must fit within max_locks whole.
        let few = Limits {
            max_locks: 3,
            ..limits(4)
        };
        assert_eq!(
            decide_set(&two_free, &AB, &me, &few, 2),
            Err(TableError::TooManyLocks { max: 3 })
        );
        // One name held: the set waits on both, the free one too, at the back.
        assert_eq!(
            decide_set(&[free, held], &AB, &me, &limits(4), 1),
            Ok(SetDecision::Queue {
                place: None,
                replaced: vec![]
            })
        );
        // wait=0: any name held or queued refuses the whole set.
        let now = ask("me", Mode::Exclusive, Some(Duration::ZERO));
        let held = Plain {
            holders: vec![("p", 0, Mode::Exclusive, None)],
            ..Plain::default()
        };
        assert!(matches!(
            decide_set(&[Plain::default(), held], &AB, &now, &limits(4), 1),
            Err(TableError::WouldBlock { .. })
        ));
        // Any name's refusal refuses the set: a full queue, a shape the name is not in.
        let queued = Plain {
            holders: vec![("p", 0, Mode::Exclusive, None)],
            queue: vec![("w", 0, Mode::Exclusive)],
            ..Plain::default()
        };
        assert_eq!(
            decide_set(&[Plain::default(), queued], &AB, &me, &limits(1), 1),
            Err(TableError::TooManyWaiters { max: 1 })
        );
        let shared = Plain {
            holders: vec![("p", 0, Mode::Shared, None)],
            ..Plain::default()
        };
        let sem = ask("me", Mode::Limit(2), None);
        assert!(matches!(
            decide_set(&[Plain::default(), shared], &AB, &sem, &limits(4), 1),
            Err(TableError::WrongMode { .. })
        ));
    }

    #[test]
    fn a_set_retried_is_the_same_grants_or_a_conflict() {
        let mine = |set: &[u8]| Plain {
            holders: vec![("me", 0, Mode::Exclusive, None)],
            set: set.to_vec(),
            ..Plain::default()
        };
        let me = ask("me", Mode::Exclusive, None);
        assert_eq!(
            decide_set(&[mine(&AB), mine(&AB)], &[1, 0], &me, &limits(4), 2),
            Ok(SetDecision::Again(vec![0, 0]))
        );
        // Holding every name, but as separate leases or another set: no retry of this one.
        assert_eq!(
            decide_set(&[mine(&[]), mine(&[])], &AB, &me, &limits(4), 2),
            Err(TableError::Conflict)
        );
        for other in [&[0, 1, 2][..], &[0, 2], &[0]] {
            assert_eq!(
                decide_set(&[mine(other), mine(other)], &AB, &me, &limits(4), 2),
                Err(TableError::Conflict),
                "held as the set {other:?}"
            );
        }
        // A name the backend could not name is no name of a held set.
        assert_eq!(
            decide_set(&[mine(&AB), mine(&AB)], &[0], &me, &limits(4), 2),
            Err(TableError::Conflict)
        );
        // A one-name LOCK of a name the same id holds inside a set: release the set first.
        assert_eq!(
            decide(&mine(&AB), &me, &limits(4), 2),
            Err(TableError::Conflict)
        );
        // Holding one of the names is no part of a new set.
        assert_eq!(
            decide_set(&[mine(&[]), Plain::default()], &AB, &me, &limits(4), 1),
            Err(TableError::Conflict)
        );
        // Waiting already for one of the names alone: that request is replaced, and the
        // set waits at the back of every queue.
        let waiting = Plain {
            holders: vec![("p", 0, Mode::Exclusive, None)],
            queue: vec![("me", 0, Mode::Exclusive)],
            ..Plain::default()
        };
        assert_eq!(
            decide_set(&[Plain::default(), waiting], &AB, &me, &limits(4), 1),
            Ok(SetDecision::Queue {
                place: None,
                replaced: vec![0]
            })
        );
    }

    /// Two names each held by "p", with the queues `a` and `b` (first in line first) whose
    /// waiters of set `sets[i]` share key 10 + i on both names; a waiter in one queue only
    /// has a key of its own there (20 + its place).
    fn two_queues(waiting: &[(&'static str, &[u8])], only_b: &[&'static str]) -> [Plain; 2] {
        let held = vec![("p", 0, Mode::Exclusive, None)];
        let a = Plain {
            holders: held.clone(),
            queue: waiting.iter().map(|w| (w.0, 0, Mode::Exclusive)).collect(),
            waiting_sets: waiting.iter().map(|w| w.1.to_vec()).collect(),
            first_key: 10,
            ..Plain::default()
        };
        let mut b = Plain {
            holders: held,
            queue: waiting.iter().map(|w| (w.0, 0, Mode::Exclusive)).collect(),
            waiting_sets: waiting.iter().map(|w| w.1.to_vec()).collect(),
            first_key: 10,
            ..Plain::default()
        };
        if !only_b.is_empty() {
            // Only for a queue without sets: keys stay unique.
            b.queue = only_b.iter().map(|id| (*id, 0, Mode::Exclusive)).collect();
            b.waiting_sets = Vec::new();
            b.first_key = 20;
        }
        [a, b]
    }

    #[test]
    fn a_set_keeps_the_place_of_the_very_same_set_only() {
        let me = ask("me", Mode::Exclusive, None);
        // Set over set: the same id's waiting set of the same names, in any order, keeps
        // its place (key 11, behind "w") for the new LOCK.
        let views = two_queues(&[("w", &AB), ("me", &[1, 0])], &[]);
        assert_eq!(
            decide_set(&views, &AB, &me, &limits(4), 2),
            Ok(SetDecision::Queue {
                place: Some(11),
                replaced: vec![11]
            })
        );
        // Set over another set (one name more, or one less, or another one): replaced,
        // and the new LOCK waits at the back of every queue.
        for other in [&[0, 1, 2][..], &[0], &[0, 2]] {
            let views = two_queues(&[("w", &AB), ("me", other)], &[]);
            assert_eq!(
                decide_set(&views, &AB, &me, &limits(4), 2),
                Ok(SetDecision::Queue {
                    place: None,
                    replaced: vec![11]
                }),
                "waiting as the set {other:?}"
            );
        }
        // Two older requests of the id (one name each): both replaced, a new place.
        let views = two_queues(&[("me", &[])], &["w", "me"]);
        assert_eq!(
            decide_set(&views, &AB, &me, &limits(4), 2),
            Ok(SetDecision::Queue {
                place: None,
                replaced: vec![10, 21]
            })
        );
    }

    #[test]
    fn one_name_takes_the_place_of_its_ids_waiting_set() {
        // One-name over set: the same id waits as the set {0, 1}; a LOCK of name 0 alone
        // replaces the set and takes its place on name 0.
        let [a, _] = two_queues(&[("w", &AB), ("me", &AB), ("x", &[])], &[]);
        let me = ask("me", Mode::Exclusive, None);
        assert_eq!(
            decide(&a, &me, &limits(4), 2),
            Ok(Decision::Queue {
                place: Some(11),
                replaced: vec![11],
                superseded: vec![]
            })
        );
        // A cluster showing the id twice: the first's place, both replaced.
        let [a, _] = two_queues(&[("me", &[]), ("w", &[]), ("me", &AB)], &[]);
        assert_eq!(
            decide(&a, &me, &limits(4), 2),
            Ok(Decision::Queue {
                place: Some(10),
                replaced: vec![10, 12],
                superseded: vec![]
            })
        );
    }

    #[test]
    fn a_waiting_set_is_ready_when_first_everywhere_and_fitting() {
        let first = Plain {
            queue: vec![("me", 0, Mode::Exclusive)],
            ..Plain::default()
        };
        let second = Plain {
            queue: vec![("a", 0, Mode::Exclusive), ("me", 0, Mode::Exclusive)],
            ..Plain::default()
        };
        let held = Plain {
            holders: vec![("p", 0, Mode::Exclusive, None)],
            queue: vec![("me", 0, Mode::Exclusive)],
            ..Plain::default()
        };
        assert!(set_ready([(&first, &0), (&first, &0)], Mode::Exclusive));
        assert!(!set_ready([(&first, &0), (&second, &1)], Mode::Exclusive));
        assert!(!set_ready([(&first, &0), (&held, &0)], Mode::Exclusive));
        let shared = Plain {
            holders: vec![("p", 0, Mode::Shared, None)],
            queue: vec![("me", 0, Mode::Shared)],
            ..Plain::default()
        };
        assert!(set_ready([(&first, &0), (&shared, &0)], Mode::Shared));
    }

    #[test]
    fn admits_by_mode() {
        use Mode::*;
        assert!(admits([].into_iter(), Exclusive));
        assert!(!admits([Exclusive].into_iter(), Exclusive));
        assert!(admits([Shared, Shared].into_iter(), Shared));
        assert!(!admits([Shared].into_iter(), Exclusive));
        assert!(admits([Limit(2)].into_iter(), Limit(2)));
        assert!(!admits([Limit(2), Limit(2)].into_iter(), Limit(2)));
        assert!(!admits([Limit(3)].into_iter(), Limit(2)));
    }
}
