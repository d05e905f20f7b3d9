//! The table's storage, laid out for memory per held lock (see the module map in
//! `locks/mod.rs`): a slab of compact entries, 24-byte timers, and ticks instead of `Instant`s.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::rules::{HolderOf, HolderView, NameView, WaiterOf, WaiterView};
use super::types::{ConnId, Mode, Note, Origin, Token, UserId, WaiterId};

/// Instants inside the table: nanoseconds since the table's epoch, the `now` of the first call
/// that passed one. 8 bytes instead of an `Instant`'s 16, and exact: an `Instant` at or after
/// the epoch converts back to itself. Earlier instants (callers pass monotonic times, so only a
/// caller's bug makes one) count as the epoch itself.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Clock {
    pub(super) epoch: Option<Instant>,
}

impl Clock {
    pub(super) fn start(&mut self, now: Instant) {
        self.epoch.get_or_insert(now);
    }

    /// `at` as ticks; `None` if it lies beyond what 64 bits of nanoseconds reach (584 years).
    pub(super) fn ticks(self, at: Instant) -> Option<u64> {
        let Some(epoch) = self.epoch else {
            return Some(0);
        };
        match at.checked_duration_since(epoch) {
            Some(since) => u64::try_from(since.as_nanos()).ok(),
            None => Some(0),
        }
    }

    /// The instant of `ticks`; `None` only before the first `now` (no ticks exist yet).
    pub(super) fn instant(self, ticks: u64) -> Option<Instant> {
        self.epoch?.checked_add(Duration::from_nanos(ticks))
    }

    /// The time from `since` (ticks) to `now`.
    pub(super) fn held(self, now: Instant, since: u64) -> Duration {
        let now = self.ticks(now).unwrap_or(u64::MAX);
        Duration::from_nanos(now.saturating_sub(since))
    }

    /// `now + ttl`, as an instant and as ticks; `None` if it can't be represented.
    pub(super) fn after(self, now: Instant, ttl: Duration) -> Option<(Instant, u64)> {
        let at = now.checked_add(ttl)?;
        Some((at, self.ticks(at)?))
    }
}

/// A duration in nanoseconds, saturating (durations the table stores are bounded by a deadline
/// that fits in ticks, so they fit too).
pub(super) fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

#[derive(Debug)]
pub(super) struct Holder {
    /// Interned: shared by every lock and waiter of this id.
    pub(super) id: Arc<str>,
    pub(super) token: Token,
    /// Lease length in nanoseconds (a RENEW without ttl reuses it).
    pub(super) ttl: u64,
    /// In [`Clock`] ticks.
    pub(super) deadline: u64,
    /// When the lease was granted (or restored), in [`Clock`] ticks: for hold times.
    pub(super) granted: u64,
    /// The connection a session lease is bound to; 0 when it is bound to none (see `bond`).
    /// Packed with `grace_ms` and `bond` rather than an enum with a payload, which would
    /// push the slot past 96 bytes.
    pub(super) conn: ConnId,
    /// A session lease's grace in milliseconds (saturating: 49 days at most).
    pub(super) grace_ms: u32,
    /// Who holds it ([`super::NO_USER`]: nobody in particular).
    pub(super) user: UserId,
    pub(super) bond: Bond,
    /// A BREAK (without `force`) ended the lease for its holder: it can no longer be renewed,
    /// and its holder has been told. It keeps its place on the name until its holder lets go
    /// (UNLOCK: its job is gone) or its deadline passes, so that the next holder never runs
    /// beside a job that is still being stopped.
    pub(super) broken: bool,
    /// Its lock-delay: its deadline passed, and it keeps its place for this long more
    /// ([`Holder::delay_ms`]) before the name passes on; over for its holder meanwhile.
    pub(super) delaying: bool,
    /// Its lock-delay (`LOCK ... delay=`) in milliseconds (saturating: 49 days at most).
    pub(super) delay_ms: u32,
    /// Who took it, by name and address: shared with its connection's other records.
    pub(super) origin: Origin,
    /// The wall clock of the grant in Unix milliseconds (0: not known), as the caller told
    /// the table ([`super::Locks::wall_clock`]); `granted` is on the monotonic clock.
    pub(super) granted_unix_ms: u64,
    /// The holder's note: boxed once more so that it is a thin 8-byte pointer, and a holder
    /// without one (most) pays 8 bytes, not the 16 of an `Option<Arc<str>>`.
    #[allow(clippy::redundant_allocation)]
    pub(super) note: Option<Box<Note>>,
}

/// How a holder's lease is tied to a connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Bond {
    /// A plain lease: only UNLOCK or its deadline ends it.
    Plain,
    /// A session lease bound to the open connection `conn`.
    Open,
    /// A session lease whose connection closed, in its grace: it ends at its deadline unless
    /// a RENEW binds it to another connection. `cut`: the grace moved the deadline earlier,
    /// so its end is reported as `dropped` rather than `expired`.
    Orphan { cut: bool },
}

impl Holder {
    /// A plain lease of `user`'s `id` (times in [`Clock`] ticks; `granted` with its wall
    /// clock), taken by `origin`; its token is set when it is granted, a session binding by
    /// [`Holder::bind`].
    pub(super) fn new(
        id: Arc<str>,
        ttl: u64,
        deadline: u64,
        (granted, granted_unix_ms): (u64, u64),
        user: UserId,
        origin: Origin,
    ) -> Holder {
        Holder {
            id,
            token: 0,
            ttl,
            deadline,
            granted,
            conn: 0,
            grace_ms: 0,
            user,
            bond: Bond::Plain,
            broken: false,
            delaying: false,
            delay_ms: 0,
            origin,
            granted_unix_ms,
            note: None,
        }
    }

    /// The holder's note, shared.
    pub(super) fn note(&self) -> Option<Note> {
        self.note.as_deref().cloned()
    }

    /// Sets the note (`None`: none).
    pub(super) fn set_note(&mut self, note: Option<Note>) {
        self.note = note.map(Box::new);
    }

    /// Over for its holder but still in its place: broken, or in its lock-delay. It can't
    /// be renewed or taken up again; its holder's UNLOCK, or its deadline, ends it.
    pub(super) fn lingering(&self) -> bool {
        self.broken || self.delaying
    }

    /// The connection a lease is bound to right now, if any.
    pub(super) fn open_conn(&self) -> Option<ConnId> {
        (self.bond == Bond::Open).then_some(self.conn)
    }

    /// Binds the lease as a LOCK asked: a session lease to `conn` with `grace`, or plain.
    /// Returns the connection it was bound to before, if any.
    pub(super) fn bind(&mut self, session: Option<Duration>, conn: ConnId) -> Option<ConnId> {
        let was = self.open_conn();
        match session {
            Some(grace) => {
                self.bond = Bond::Open;
                self.conn = conn;
                self.grace_ms = u32::try_from(grace.as_millis()).unwrap_or(u32::MAX);
            }
            None => {
                self.bond = Bond::Plain;
                self.conn = 0;
                self.grace_ms = 0;
            }
        }
        was
    }
}

#[derive(Debug)]
pub(super) struct Waiter {
    pub(super) waiter: WaiterId,
    pub(super) id: Arc<str>,
    pub(super) ttl: Duration,
    /// The grace of the session lease it asked for; `None` for a plain lease.
    pub(super) session: Option<Duration>,
    pub(super) conn: ConnId,
    /// When its wait ends, in [`Clock`] ticks; `None` waits without bound.
    pub(super) deadline: Option<u64>,
    /// When it joined the queue (or took over a place in it), in [`Clock`] ticks.
    pub(super) queued: u64,
    pub(super) mode: Mode,
    pub(super) user: UserId,
    /// Who asked: 8 bytes, the connection's shared record.
    pub(super) origin: Origin,
    /// The note it will hold with, carried until its grant.
    pub(super) note: Option<Note>,
    /// The lock-delay of the lease it will hold, in milliseconds.
    pub(super) delay_ms: u32,
}

/// FIFO by ticket; a replacing request keeps the ticket of the one it replaced.
pub(super) type Queue = BTreeMap<u64, Waiter>;

/// One held or waited-for name: 120 bytes in the slab (112 until holders kept a note, 96 until
/// they recorded who took them and when).
#[derive(Debug)]
pub(super) struct Entry {
    /// The same allocation as the index's key.
    pub(super) name: Arc<str>,
    /// The holder granted first among those still holding: the only one of an exclusive lock.
    /// `None` while nobody holds the name but a set waits for it (a set waits on every one of
    /// its names, the free ones too); then `more.others` is empty and the queue is not.
    /// (`Option` costs nothing: the id's pointer is the niche.)
    pub(super) holder: Option<Holder>,
    /// Waiters, further holders, a mode other than exclusive. `None` for a lone exclusive
    /// holder nobody waits for, which is most locks most of the time: 8 bytes.
    pub(super) more: Option<Box<More>>,
}

/// What a lock has beyond one exclusive holder.
#[derive(Debug, Default)]
pub(super) struct More {
    pub(super) queue: Queue,
    /// Holders beside `Entry::holder`, in the order they were granted.
    pub(super) others: Vec<Holder>,
    /// The holders' mode (all hold it in the same one).
    pub(super) mode: Mode,
}

impl Entry {
    pub(super) fn mode(&self) -> Mode {
        self.more.as_ref().map_or(Mode::Exclusive, |m| m.mode)
    }

    pub(super) fn holders(&self) -> impl Iterator<Item = &Holder> {
        self.holder
            .iter()
            .chain(self.more.iter().flat_map(|m| m.others.iter()))
    }

    pub(super) fn holder_count(&self) -> usize {
        usize::from(self.holder.is_some()) + self.more.as_ref().map_or(0, |m| m.others.len())
    }

    /// Nobody holds the name: only waiters keep the entry.
    pub(super) fn is_vacant(&self) -> bool {
        self.holder.is_none()
    }

    pub(super) fn holder(&self, token: Token) -> Option<&Holder> {
        self.holders().find(|h| h.token == token)
    }

    pub(super) fn holder_mut(&mut self, token: Token) -> Option<&mut Holder> {
        if self.holder.as_ref().is_some_and(|h| h.token == token) {
            return self.holder.as_mut();
        }
        self.more
            .as_mut()?
            .others
            .iter_mut()
            .find(|h| h.token == token)
    }

    pub(super) fn queue(&self) -> Option<&Queue> {
        self.more.as_ref().map(|m| &m.queue)
    }

    pub(super) fn waiters(&self) -> usize {
        self.queue().map_or(0, |q| q.len())
    }

    /// The first waiter, if a holder in its mode could join those holding now.
    pub(super) fn head_fits(&self) -> bool {
        let Some(more) = self.more.as_deref() else {
            return false;
        };
        let Some((_, head)) = more.queue.first_key_value() else {
            return false;
        };
        let holding = std::iter::repeat_n(more.mode, self.holder_count());
        super::rules::admits(holding, head.mode)
    }

    /// The `More` to add to, made if needed.
    pub(super) fn more_mut(&mut self) -> &mut More {
        self.more.get_or_insert_with(Box::default)
    }

    /// Drops `more` once it says nothing a lone exclusive holder wouldn't.
    pub(super) fn tidy(&mut self) {
        if self
            .more
            .as_ref()
            .is_some_and(|m| m.queue.is_empty() && m.others.is_empty() && m.mode == Mode::Exclusive)
        {
            self.more = None;
        }
    }
}

// The layout above is what keeps a held lock under 256 bytes: growing these is a choice.
// The audit trail took 16 bytes of a holder: its origin (a shared pointer) and wall clock;
// the note 8 more (a thin pointer, null without a note).
const _: () = assert!(std::mem::size_of::<Option<Entry>>() <= 120);
const _: () = assert!(std::mem::size_of::<(u64, Timer)>() <= 24);

/// What a timer is for; the `u32` is the slot of the lease's entry. `Wait` sorts before
/// `Lease`, so a waiter whose patience ends at the same instant as the lease it waits for
/// gives up rather than being granted. Slots are reused, so a lease timer counts only while
/// the slot's holder still has its token.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Timer {
    Wait(WaiterId),
    Lease(Token, u32),
}

/// Slots per slab chunk: 448 KiB of entries. Past the first chunk the slab grows a chunk at a
/// time, so its spare capacity stays under one chunk instead of up to the whole table.
const SLAB_CHUNK: usize = 4096;

/// The entries, addressed by a `u32` slot; freed slots are reused.
#[derive(Debug, Default)]
pub(super) struct Slab {
    /// Full chunks of [`SLAB_CHUNK`] slots, then the one being filled. The first grows like
    /// any `Vec` (a small table stays small); the later ones are allocated whole.
    pub(super) chunks: Vec<Vec<Option<Entry>>>,
    /// Slots whose entry was removed.
    pub(super) free: Vec<u32>,
}

impl Slab {
    pub(super) fn get(&self, slot: u32) -> Option<&Entry> {
        let slot = slot as usize;
        self.chunks
            .get(slot / SLAB_CHUNK)?
            .get(slot % SLAB_CHUNK)?
            .as_ref()
    }

    pub(super) fn get_mut(&mut self, slot: u32) -> Option<&mut Entry> {
        self.place(slot)?.as_mut()
    }

    pub(super) fn place(&mut self, slot: u32) -> Option<&mut Option<Entry>> {
        let slot = slot as usize;
        self.chunks
            .get_mut(slot / SLAB_CHUNK)?
            .get_mut(slot % SLAB_CHUNK)
    }

    /// Stores `entry` in a free slot; `None` when all 2^32 slots are taken.
    pub(super) fn insert(&mut self, entry: Entry) -> Option<u32> {
        if let Some(slot) = self.free.pop() {
            if let Some(place) = self.place(slot) {
                *place = Some(entry);
                return Some(slot);
            }
        }
        let used = match self.chunks.last() {
            Some(last) => (self.chunks.len() - 1) * SLAB_CHUNK + last.len(),
            None => 0,
        };
        let slot = u32::try_from(used).ok()?;
        match self.chunks.last_mut() {
            Some(last) if last.len() < SLAB_CHUNK => last.push(Some(entry)),
            Some(_) => {
                let mut chunk = Vec::with_capacity(SLAB_CHUNK);
                chunk.push(Some(entry));
                self.chunks.push(chunk);
            }
            None => self.chunks.push(vec![Some(entry)]),
        }
        Some(slot)
    }

    pub(super) fn remove(&mut self, slot: u32) -> Option<Entry> {
        let entry = self.place(slot)?.take()?;
        self.free.push(slot);
        Some(entry)
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = &Entry> {
        self.chunks.iter().flatten().flatten()
    }
}

/// A name of the table as the lock rules see it (`None`: the name is free), with the table's
/// held sets (token -> the slots of its names) and waiting sets (waiter -> the slots of its
/// names), which say which holders' leases and which waiters are sets, and of which names.
pub(super) struct TableView<'a>(
    pub(super) Option<&'a Entry>,
    pub(super) &'a HashMap<Token, Box<[u32]>>,
    pub(super) &'a HashMap<WaiterId, Box<[u32]>>,
);

/// Where a waiter of the table is: its ticket in the queue, its number and its wait's end.
pub(super) type WaiterPlace = (u64, WaiterId, Option<u64>);

impl NameView for TableView<'_> {
    type User = UserId;
    type HolderKey = Token;
    type WaiterKey = WaiterPlace;
    /// A set names its names by their slots.
    type Name = u32;

    fn holders(&self) -> impl Iterator<Item = HolderOf<'_, Self>> {
        let sets = self.1;
        self.0.into_iter().flat_map(move |entry| {
            let mode = entry.mode();
            entry.holders().map(move |h| HolderView {
                key: h.token,
                id: &h.id,
                user: &h.user,
                mode,
                bound_to: h.open_conn(),
                lingering: h.lingering(),
                set: slots_of(sets, &h.token),
            })
        })
    }

    fn queue(&self) -> impl Iterator<Item = WaiterOf<'_, Self>> {
        let set_waiters = self.2;
        let queue = self.0.and_then(Entry::queue).into_iter().flatten();
        queue.map(move |(ticket, w)| WaiterView {
            key: (*ticket, w.waiter, w.deadline),
            id: &w.id,
            user: &w.user,
            mode: w.mode,
            set: slots_of(set_waiters, &w.waiter),
        })
    }

    fn waiters(&self) -> usize {
        self.0.map_or(0, Entry::waiters)
    }
}

/// The slots of the names of the set `key` is in `sets` (empty: not a set). No lookup
/// while there is no set (most tables, always).
fn slots_of<'a, K: Eq + std::hash::Hash>(sets: &'a HashMap<K, Box<[u32]>>, key: &K) -> &'a [u32] {
    if sets.is_empty() {
        return &[];
    }
    sets.get(key).map_or(&[], |slots| slots)
}
