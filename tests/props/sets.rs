//! The rule for a LOCK of several names (`and=`), `rules::decide_set` and `rules::set_ready`,
//! run over random histories of a plain simulated table: sets and single names of up to
//! three names, exclusive and shared, arriving, leaving their queues, replacing the same
//! id's older requests (which leave all their queues) and releasing. After
//! every step: no name has a second exclusive holder (nor readers beside a writer), every
//! grant was of a request first in line in each of its queues (FIFO per name: nobody
//! overtakes a set, a set overtakes nobody), a set is granted all its names at once, and
//! nothing deadlocks: the earliest request still waiting is first in each of its queues and
//! waits for a holder.
//!
//! Both backends carry out these rules through the same `NameView` (the table in
//! `locks/set_tests.rs` and the model test, etcd in the model test and the simulator); this
//! checks the rules alone, where a set waits and whom it replaces included, against a table
//! simple enough to read.

use lockd::locks::rules::{
    self, Ask, Decision, HolderOf, HolderView, NameView, SetDecision, WaiterOf, WaiterView,
};
use lockd::locks::{Limits, Mode, TableError};
use proptest::prelude::*;

const NAMES: usize = 3;

/// One name of the simulated table: holders (request numbers) and queue (request numbers,
/// first in line first).
#[derive(Clone, Default, Debug)]
struct Name {
    holders: Vec<(u64, Mode)>,
    queue: Vec<(u64, Mode)>,
}

/// The ids: request `n` is the client `r<n>`.
struct Ids(Vec<String>);

struct View<'a> {
    name: &'a Name,
    ids: &'a Ids,
    /// Per request: the names of its set (empty: one name).
    sets: &'a [Vec<usize>],
}

impl NameView for View<'_> {
    type User = u32;
    type HolderKey = u64;
    type WaiterKey = u64;
    type Name = usize;

    fn holders(&self) -> impl Iterator<Item = HolderOf<'_, Self>> {
        self.name.holders.iter().map(|&(key, mode)| HolderView {
            key,
            id: &self.ids.0[key as usize],
            user: &0,
            mode,
            bound_to: None,
            set: &self.sets[key as usize],
            lingering: false,
        })
    }

    fn queue(&self) -> impl Iterator<Item = WaiterOf<'_, Self>> {
        self.name.queue.iter().map(|&(key, mode)| WaiterView {
            key,
            id: &self.ids.0[key as usize],
            user: &0,
            mode,
            set: &self.sets[key as usize],
        })
    }

    fn waiters(&self) -> usize {
        self.name.queue.len()
    }
}

#[derive(Clone, Debug)]
enum Op {
    /// A new request for the names of the mask (bit i: name i), shared or not.
    Lock { mask: u8, shared: bool },
    /// The holder granted k-th (mod their number) releases all its names.
    Release(usize),
    /// The waiter that came k-th (mod their number) leaves every queue (wait= ran out).
    Leave(usize),
    /// A new request by the same id as the waiter that came k-th: it replaces every older
    /// request of that id on its names (those leave all their queues).
    Again { k: usize, mask: u8, shared: bool },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (1u8..8, any::<bool>()).prop_map(|(mask, shared)| Op::Lock { mask, shared }),
        2 => any::<usize>().prop_map(Op::Release),
        1 => any::<usize>().prop_map(Op::Leave),
        1 => (any::<usize>(), 1u8..8, any::<bool>())
            .prop_map(|(k, mask, shared)| Op::Again { k, mask, shared }),
    ]
}

#[derive(Default)]
struct Table {
    names: Vec<Name>,
    /// Per request: its names (in its order), its mode.
    requests: Vec<(Vec<usize>, Mode)>,
    ids: Vec<String>,
    /// Per request: its place in line, the same in every one of its queues (lower is
    /// earlier). A new request's is its number; one of a single name that replaced the same
    /// id's older request there takes that one's place, and so does the very same set asked
    /// again (its one place is the same in every queue); any other set goes to the back (a
    /// place kept on one name of a set would put it before others on another: two sets could
    /// each wait for the other).
    places: Vec<u64>,
    holding: Vec<u64>,
    waiting: Vec<u64>,
}

impl Table {
    fn new() -> Table {
        Table {
            names: vec![Name::default(); NAMES],
            ..Table::default()
        }
    }

    fn views<'a>(&'a self, names: &[usize], ids: &'a Ids, sets: &'a [Vec<usize>]) -> Vec<View<'a>> {
        names
            .iter()
            .map(|&n| View {
                sets,
                name: &self.names[n],
                ids,
            })
            .collect()
    }

    /// Per request: the names of its set (empty: one name).
    fn sets(&self) -> Vec<Vec<usize>> {
        self.requests
            .iter()
            .map(|(names, _)| match names.len() {
                1 => Vec::new(),
                _ => names.clone(),
            })
            .collect()
    }

    fn grant(&mut self, r: u64) {
        let (names, mode) = self.requests[r as usize].clone();
        for n in names {
            let name = &mut self.names[n];
            // The request's names are granted together, each while it is first in line
            // there or nobody waits.
            assert!(
                name.queue.first().is_none_or(|&(w, _)| w == r),
                "request {r} granted name {n} past an earlier waiter"
            );
            name.queue.retain(|&(w, _)| w != r);
            name.holders.push((r, mode));
        }
        self.waiting.retain(|&w| w != r);
        self.holding.push(r);
    }

    /// Grants every waiting request that is ready, earliest first, until none is.
    fn settle(&mut self) {
        loop {
            let ids = Ids(self.ids.clone());
            let sets = self.sets();
            let ready = self.waiting.iter().copied().find(|&r| {
                let (names, mode) = &self.requests[r as usize];
                let views = self.views(names, &ids, &sets);
                rules::set_ready(views.iter().map(|v| (v, &r)), *mode)
            });
            match ready {
                Some(r) => self.grant(r),
                None => return,
            }
        }
    }

    fn lock(&mut self, mask: u8, shared: bool, same_id_as: Option<u64>) {
        let names: Vec<usize> = (0..NAMES).filter(|i| mask & (1 << i) != 0).collect();
        let mode = if shared {
            Mode::Shared
        } else {
            Mode::Exclusive
        };
        let r = self.requests.len() as u64;
        let id = match same_id_as {
            Some(old) => self.ids[old as usize].clone(),
            None => format!("r{r}"),
        };
        self.ids.push(id.clone());
        self.requests.push((names.clone(), mode));
        self.places.push(r);
        let ids = Ids(self.ids.clone());
        let ask = Ask {
            id: &id,
            user: &0,
            mode,
            conn: 1,
            wait: None,
            supersede: false,
        };
        let decision = {
            let sets = self.sets();
            let views = self.views(&names, &ids, &sets);
            let leases = self.holding.len();
            // A LOCK of one name is decided as one (as both backends do), a set as a set.
            match &views[..] {
                [one] => rules::decide(one, &ask, &Limits::default(), leases).map(|d| match d {
                    Decision::Again(k) => SetDecision::Again(vec![k]),
                    Decision::Grant => SetDecision::Grant,
                    Decision::Queue {
                        place, replaced, ..
                    } => SetDecision::Queue { place, replaced },
                }),
                _ => rules::decide_set(&views, &names, &ask, &Limits::default(), leases),
            }
        };
        match decision {
            Ok(SetDecision::Grant) => self.grant(r),
            Ok(SetDecision::Queue { place, replaced }) => {
                assert!(
                    same_id_as.is_some() || replaced.is_empty(),
                    "a new id replaced"
                );
                let mut old: Vec<u64> = replaced.clone();
                old.sort_unstable();
                old.dedup();
                assert_eq!(old.len(), replaced.len(), "replaced twice: {replaced:?}");
                // Every older request of the id on these names, and nothing else.
                let mut want: Vec<u64> = (0..r)
                    .filter(|o| self.ids[*o as usize] == id && self.waiting.contains(o))
                    .filter(|o| {
                        self.requests[*o as usize]
                            .0
                            .iter()
                            .any(|n| names.contains(n))
                    })
                    .collect();
                want.sort_unstable();
                assert_eq!(old, want, "replaced");
                // One name, or the very same set again (its names in any order), takes the
                // older request's place; any other set goes to the back.
                let keeps = match old[..] {
                    [o] if names.len() == 1 || same_names(&self.requests[o as usize].0, &names) => {
                        Some(o)
                    }
                    _ => None,
                };
                assert_eq!(place, keeps, "the place of {names:?} over {old:?}");
                for &o in &old {
                    assert_eq!(self.ids[o as usize], id, "replaced another id's request");
                    self.waiting.retain(|&w| w != o);
                    for name in &mut self.names {
                        name.queue.retain(|w| w.0 != o);
                    }
                }
                // Where the rules say.
                if let Some(o) = place {
                    self.places[r as usize] = self.places[o as usize];
                }
                // One step: every queue at once, each in order of place.
                for &n in &names {
                    let place = self.places[r as usize];
                    let q = &mut self.names[n].queue;
                    let at = q
                        .iter()
                        .position(|w| self.places[w.0 as usize] > place)
                        .unwrap_or(q.len());
                    q.insert(at, (r, mode));
                }
                self.waiting.push(r);
                // Its leaving others' queues, or a mode its older request did not have,
                // may let someone in.
                self.settle();
            }
            // The same id may hold what it asks for (alone, in another set, in another mode).
            Ok(SetDecision::Again(_))
            | Err(TableError::Conflict | TableError::WrongMode { .. })
                if same_id_as.is_some() => {}
            Ok(SetDecision::Again(_)) => panic!("a new id was granted again"),
            // Exclusive and shared are one read/write lock: no shape refusal here.
            Err(e) => panic!("refused: {e}"),
        }
    }

    fn check(&self) {
        for (n, name) in self.names.iter().enumerate() {
            let exclusive = name.holders.iter().any(|h| h.1 == Mode::Exclusive);
            assert!(
                !exclusive || name.holders.len() == 1,
                "name {n} has a writer beside others: {:?}",
                name.holders
            );
        }
        // A set holds all its names or none.
        for &r in &self.holding {
            for &n in &self.requests[r as usize].0 {
                assert!(self.names[n].holders.iter().any(|h| h.0 == r));
            }
        }
        // No deadlock: the earliest waiter is first everywhere and waits for a holder.
        if let Some(&first) = self
            .waiting
            .iter()
            .min_by_key(|&&w| self.places[w as usize])
        {
            let (names, mode) = &self.requests[first as usize];
            for &n in names {
                assert_eq!(self.names[n].queue.first().map(|w| w.0), Some(first));
            }
            assert!(
                names
                    .iter()
                    .any(|&n| !rules::admits(self.names[n].holders.iter().map(|h| h.1), *mode)),
                "request {first} waits though nothing holds it back"
            );
        }
        // Queues are in order of place.
        for name in &self.names {
            assert!(name
                .queue
                .windows(2)
                .all(|w| self.places[w[0].0 as usize] < self.places[w[1].0 as usize]));
        }
    }
}

/// Whether two requests name the same names, in any order (the test's own reading of a
/// set, apart from the rules').
fn same_names(a: &[usize], b: &[usize]) -> bool {
    let (mut a, mut b) = (a.to_vec(), b.to_vec());
    a.sort_unstable();
    b.sort_unstable();
    a == b
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(500))]

    #[test]
    fn sets_are_granted_whole_in_fifo_order_without_deadlock(ops in prop::collection::vec(op(), 1..60)) {
        let mut t = Table::new();
        for op in ops {
            match op {
                Op::Lock { mask, shared } => t.lock(mask, shared, None),
                Op::Again { k, mask, shared } if !t.waiting.is_empty() => {
                    let old = t.waiting[k % t.waiting.len()];
                    t.lock(mask, shared, Some(old));
                }
                Op::Release(k) if !t.holding.is_empty() => {
                    let r = t.holding.remove(k % t.holding.len());
                    for n in t.requests[r as usize].0.clone() {
                        t.names[n].holders.retain(|h| h.0 != r);
                    }
                    t.settle();
                }
                Op::Leave(k) if !t.waiting.is_empty() => {
                    let r = t.waiting.remove(k % t.waiting.len());
                    for name in &mut t.names {
                        name.queue.retain(|w| w.0 != r);
                    }
                    t.settle();
                }
                _ => {}
            }
            t.check();
        }
        // Everyone releases: every waiter is granted in the end.
        while let Some(r) = t.holding.pop() {
            for n in t.requests[r as usize].0.clone() {
                t.names[n].holders.retain(|h| h.0 != r);
            }
            t.settle();
            t.check();
        }
        prop_assert!(t.waiting.is_empty(), "left waiting: {:?}", t.waiting);
    }
}
