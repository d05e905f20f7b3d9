//! The etcd backend's hash maps and sets: keyed at random, as std's are (names come from
//! clients, so a fixed key would let one pick colliding names), except on a thread whose
//! simulation fixed the keys ([`fix_keys`]): there every run of a seed iterates them in the
//! same order, and so sends the same transactions in the same order.

use std::cell::Cell;
use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;

pub type HashMap<K, V> = std::collections::HashMap<K, V, Keys>;
pub type HashSet<K> = std::collections::HashSet<K, Keys>;

thread_local! {
    static FIXED: Cell<Option<(u64, u64)>> = const { Cell::new(None) };
}

/// SipHash keys: random per map, or this thread's fixed pair.
#[derive(Clone, Debug)]
pub struct Keys(u64, u64);

impl Default for Keys {
    fn default() -> Keys {
        match FIXED.get() {
            Some((k0, k1)) => Keys(k0, k1),
            None => {
                let random = RandomState::new();
                Keys(random.hash_one(0u8), random.hash_one(1u8))
            }
        }
    }
}

impl BuildHasher for Keys {
    #[allow(deprecated)] // std's SipHasher: the one SipHash std lets a caller key
    type Hasher = std::hash::SipHasher;

    #[allow(deprecated)]
    fn build_hasher(&self) -> Self::Hasher {
        std::hash::SipHasher::new_with_keys(self.0, self.1)
    }
}

/// Maps and sets made on this thread from now on hash with fixed keys (a simulation's).
pub fn fix_keys() {
    FIXED.set(Some((0x6c6f_636b_6400_0001, 0x7369_6d75_6c61_7465)));
}
