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

/// Overlapping pairs among `held` (sorted here by start), and the gaps from each release to
/// the next grant.
pub fn exclusion_and_gaps(held: &mut [Held]) -> (u64, Vec<u64>) {
    held.sort_unstable_by_key(|h| h.start);
    let mut violations = 0;
    let mut gaps = Vec::with_capacity(held.len());
    let mut latest_end: Option<u64> = None;
    for h in held.iter() {
        if let Some(end) = latest_end {
            if h.start < end {
                violations += 1;
            } else {
                gaps.push(h.start - end);
            }
        }
        latest_end = Some(latest_end.map_or(h.end, |e| e.max(h.end)));
    }
    (violations, gaps)
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
        let mut held = vec![
            Held { start: 0, end: 10 },
            Held { start: 15, end: 20 },
            Held { start: 18, end: 30 },
            Held { start: 40, end: 41 },
        ];
        let (violations, gaps) = exclusion_and_gaps(&mut held);
        assert_eq!(violations, 1);
        assert_eq!(gaps, vec![5, 10]);
    }
}
