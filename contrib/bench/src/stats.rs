//! Numbers from samples: percentiles, fairness, mutual exclusion, server memory.

use std::io;
use std::time::Duration;

/// Percentile `p` (0..=100) of `sorted`, nearest rank; 0 when empty.
pub fn pct(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// p50, p99 and max of nanosecond samples, in microseconds.
pub fn summary_us(samples: &mut [u64]) -> (f64, f64, f64) {
    samples.sort_unstable();
    let us = |n: u64| n as f64 / 1000.0;
    (
        us(pct(samples, 50.0)),
        us(pct(samples, 99.0)),
        us(samples.last().copied().unwrap_or(0)),
    )
}

/// Jain's fairness index of per-client counts: 1.0 when all are equal, 1/n when one got all.
pub fn jain(counts: &[u64]) -> f64 {
    let n = counts.len() as f64;
    let sum: f64 = counts.iter().map(|&c| c as f64).sum();
    let sq: f64 = counts.iter().map(|&c| (c as f64) * (c as f64)).sum();
    if sq == 0.0 {
        return 0.0;
    }
    sum * sum / (n * sq)
}

/// The smallest share over the largest.
pub fn min_max_share(counts: &[u64]) -> f64 {
    let max = counts.iter().copied().max().unwrap_or(0);
    let min = counts.iter().copied().min().unwrap_or(0);
    if max == 0 {
        return 0.0;
    }
    min as f64 / max as f64
}

/// A critical section as the client saw it: from the grant's arrival to the release's
/// departure, both nanoseconds on one process clock. It lies inside the server's own holding
/// interval, so two that overlap are a real violation, never a measurement artefact.
#[derive(Clone, Copy, Debug)]
pub struct Held {
    pub start: u64,
    pub end: u64,
}

/// What the critical sections of a lock with `limit` slots (1 for a mutex) show.
pub struct Slots {
    /// Sections that started while `limit` others were already inside.
    pub violations: u64,
    /// Per section that started in a slot another had freed: the time from that release to
    /// this grant, in ns.
    pub gaps: Vec<u64>,
    /// The most sections inside at once.
    pub peak: u64,
}

/// Sweeps `held` in time order. Freed slots are handed on oldest first, so a gap is how long
/// the longest-free slot stayed empty; with `limit` 1 that is the time from the latest release
/// to the next grant, the mutex's handoff gap.
pub fn slots(held: &[Held], limit: u64) -> Slots {
    // A release sorts before a grant at the same instant: a section that starts as another
    // ends does not overlap it.
    let mut events: Vec<(u64, bool)> = Vec::with_capacity(held.len() * 2);
    for h in held {
        events.push((h.start, true));
        events.push((h.end, false));
    }
    events.sort_unstable();
    let mut out = Slots {
        violations: 0,
        gaps: Vec::with_capacity(held.len()),
        peak: 0,
    };
    let mut inside = 0u64;
    // The release times of the free slots, oldest first; slots never held have none.
    let mut freed = std::collections::VecDeque::new();
    for (at, start) in events {
        if start {
            if inside >= limit {
                out.violations += 1;
            } else if let Some(released) = freed.pop_front() {
                out.gaps.push(at - released);
            }
            inside += 1;
            out.peak = out.peak.max(inside);
        } else {
            // Only a release that brings the count below the limit frees a slot.
            if inside <= limit {
                freed.push_back(at);
            }
            inside -= 1;
        }
    }
    out
}

/// Resident memory of a process, in bytes, from /proc/<pid>/status.
pub fn rss_bytes(pid: u32) -> io::Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map(|kb| kb * 1024)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "no VmRSS"))
}

/// Busy-waits `d`: a critical section that does CPU work (tokio's timer is too coarse for
/// 100 µs, and a sleep would hand the core to someone else).
pub fn spin(d: Duration) {
    if d.is_zero() {
        return;
    }
    let end = std::time::Instant::now() + d;
    while std::time::Instant::now() < end {
        std::hint::spin_loop();
    }
}

/// A small deterministic generator for retry jitter (no crate needed for that).
pub struct XorShift(u64);

impl XorShift {
    pub fn new(seed: u64) -> Self {
        XorShift(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        if n == 0 {
            0
        } else {
            x % n
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_nearest_rank() {
        let v: Vec<u64> = (1..=100).collect();
        assert_eq!(pct(&v, 50.0), 50);
        assert_eq!(pct(&v, 99.0), 99);
        assert_eq!(pct(&v, 100.0), 100);
        assert_eq!(pct(&[], 50.0), 0);
    }

    #[test]
    fn jain_bounds() {
        assert!((jain(&[5, 5, 5, 5]) - 1.0).abs() < 1e-9);
        assert!((jain(&[10, 0, 0, 0]) - 0.25).abs() < 1e-9);
        assert_eq!(min_max_share(&[2, 4]), 0.5);
    }

    #[test]
    fn overlaps_are_counted_and_gaps_measured() {
        let held = [
            Held { start: 0, end: 10 },
            Held { start: 15, end: 20 },
            Held { start: 18, end: 30 },
            Held { start: 40, end: 41 },
        ];
        let s = slots(&held, 1);
        assert_eq!(s.violations, 1);
        assert_eq!(s.gaps, vec![5, 10]);
        assert_eq!(s.peak, 2);
    }

    #[test]
    fn a_section_starting_as_another_ends_is_no_overlap() {
        let held = [Held { start: 0, end: 10 }, Held { start: 10, end: 20 }];
        let s = slots(&held, 1);
        assert_eq!((s.violations, s.peak), (0, 1));
        assert_eq!(s.gaps, vec![0]);
    }

    #[test]
    fn a_semaphore_hands_the_oldest_free_slot_on() {
        // Two slots: both taken, released at 10 and 12, retaken at 13 and 20.
        let held = [
            Held { start: 0, end: 10 },
            Held { start: 1, end: 12 },
            Held { start: 13, end: 30 },
            Held { start: 20, end: 31 },
        ];
        let s = slots(&held, 2);
        assert_eq!((s.violations, s.peak), (0, 2));
        assert_eq!(s.gaps, vec![3, 8]);
        // A third section beside two holders is a violation, and takes no freed slot.
        let mut over = held.to_vec();
        over.push(Held { start: 25, end: 26 });
        let s = slots(&over, 2);
        assert_eq!((s.violations, s.peak), (1, 3));
        assert_eq!(s.gaps, vec![3, 8]);
    }
}
