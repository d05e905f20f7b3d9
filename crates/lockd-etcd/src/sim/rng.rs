//! The simulation's one random source.

use std::time::Duration;

/// A small seeded random source (xorshift64*): the simulation's only one.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// The source of `seed`.
    pub fn new(seed: u64) -> Rng {
        // splitmix64 of the seed: nearby seeds start far apart, and never at zero.
        let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        Rng((z ^ (z >> 31)) | 1)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// A number in `0..n` (0 for an empty range).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next_u64() % n
        }
    }

    /// True `per_mille` times in a thousand.
    pub fn chance(&mut self, per_mille: u32) -> bool {
        self.below(1000) < u64::from(per_mille)
    }

    /// A duration up to `max`, in whole milliseconds.
    pub fn upto(&mut self, max: Duration) -> Duration {
        Duration::from_millis(self.below(max.as_millis() as u64 + 1))
    }
}
