//! Heap memory per held lock of the pure lock table (`lockd::locks::Locks`).
//!
//! The target is at most 256 bytes of server memory per held lock with 16-byte names. This
//! binary counts live heap bytes with its own global allocator (a thin wrapper over `System`),
//! fills a table with plain leases of 16-byte names held by a few shared ids, and divides the
//! growth by the number of locks. Then it releases them all and checks the table gives its
//! memory back, twice, so neither the slab, the index nor the interned ids grow without bound.
//!
//! Counting is process-wide, so the tests here take one lock and run one at a time; nothing
//! depends on timing. The 1,000,000-lock run is `#[ignore]`d (it wants a release build):
//! `cargo test --release --test memory -- --ignored --nocapture`.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use lockd::locks::{Limits, LockOutcome, LockRequest, Locks, Token};

/// Counts the bytes currently allocated through it.
struct CountingAlloc;

static LIVE_BYTES: AtomicIsize = AtomicIsize::new(0);

fn add_live(bytes: usize, sign: isize) {
    LIVE_BYTES.fetch_add(sign * bytes as isize, Ordering::Relaxed);
}

// SAFETY: every call is forwarded unchanged to `System`; the counter only observes.
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = System.alloc(layout);
        if !p.is_null() {
            add_live(layout.size(), 1);
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let p = System.alloc_zeroed(layout);
        if !p.is_null() {
            add_live(layout.size(), 1);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout);
        add_live(layout.size(), -1);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let p = System.realloc(ptr, layout, new_size);
        if !p.is_null() {
            add_live(layout.size(), -1);
            add_live(new_size, 1);
        }
        p
    }
}

#[global_allocator]
static GLOBAL: CountingAlloc = CountingAlloc;

/// One measurement at a time: the counter sees every thread of this binary.
static SERIAL: Mutex<()> = Mutex::new(());

fn live_bytes() -> isize {
    LIVE_BYTES.load(Ordering::Relaxed)
}

/// Distinct holder ids; each is shared by `n / IDS` locks, as a few busy clients would.
const IDS: usize = 64;

/// A 16-byte name.
fn name(i: usize) -> String {
    format!("lock-{i:011}")
}

fn id(i: usize) -> String {
    format!("worker-{:02}", i % IDS)
}

/// Takes `n` plain leases (one hour, far from expiring); returns their tokens in `tokens`.
fn fill(table: &mut Locks, now: Instant, n: usize, tokens: &mut Vec<Token>) {
    for i in 0..n {
        let outcome = table.lock(
            now,
            LockRequest {
                name: name(i),
                id: id(i),
                ttl: Some(Duration::from_secs(3600)),
                wait: Some(Duration::ZERO),
                session: None,
                conn: 1,
                mode: Default::default(),
                // As with --auth-file: every holder records its user.
                user: 1,
                origin: Default::default(),
                note: None,
                supersede: false,
                and: Box::default(),
            },
        );
        match outcome {
            Ok(LockOutcome::Granted { token, .. }) => tokens.push(token),
            other => panic!("lock {i}: {other:?}"),
        }
        // Drop the Acquired event at once, as the server does: it holds the name and id.
        drop(table.take_effects());
    }
    assert_eq!(table.len(), n);
}

fn release(table: &mut Locks, now: Instant, tokens: &mut Vec<Token>) {
    for (i, token) in tokens.drain(..).enumerate() {
        assert_eq!(table.unlock(now, &name(i), token, 1), Ok(()));
        drop(table.take_effects());
    }
    assert!(table.is_empty());
}

/// Live heap bytes the table uses per held lock, with `n` held; also checks that releasing
/// them all gives the memory back.
fn heap_per_lock(n: usize) -> f64 {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let now = Instant::now();
    let limits = Limits {
        max_locks: n,
        ..Limits::default()
    };
    let mut tokens = Vec::with_capacity(n);
    let mut table = Locks::new(limits, 1);

    let empty = live_bytes();
    fill(&mut table, now, n, &mut tokens);
    let held = live_bytes() - empty;
    let per_lock = held as f64 / n as f64;
    println!("{n} held locks: {held} heap bytes, {per_lock:.1} per lock");

    // Released, the table keeps no per-lock memory: no names, timers or ids left behind.
    // A second round must end at the same place, so nothing accumulates across rounds.
    const LEFT_OVER_MAX: isize = 64 * 1024;
    let later = now + Duration::from_secs(1);
    release(&mut table, later, &mut tokens);
    let after_first = live_bytes() - empty;
    fill(&mut table, later, n, &mut tokens);
    release(&mut table, later, &mut tokens);
    let after_second = live_bytes() - empty;
    println!("after release: {after_first} bytes left, after a second round {after_second}");
    assert!(
        after_first <= LEFT_OVER_MAX,
        "{after_first} heap bytes left after releasing all {n} locks"
    );
    assert!(
        after_second <= LEFT_OVER_MAX,
        "{after_second} heap bytes left after a second round of {n} locks"
    );
    per_lock
}

#[test]
fn a_held_lock_costs_at_most_256_heap_bytes() {
    let per_lock = heap_per_lock(200_000);
    assert!(
        per_lock <= 256.0,
        "{per_lock:.1} heap bytes per held lock (at most 256)"
    );
}

/// The benchmark's size; slow in a debug build.
#[test]
#[ignore]
fn a_held_lock_costs_at_most_256_heap_bytes_at_one_million() {
    let per_lock = heap_per_lock(1_000_000);
    assert!(
        per_lock <= 256.0,
        "{per_lock:.1} heap bytes per held lock (at most 256)"
    );
}
