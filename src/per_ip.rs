//! Open connections counted per client address, for `--max-connections-per-ip`: so that one
//! address can't take every connection the server allows.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, PoisonError};

/// How many connections each address has open.
///
/// Only addresses with an open connection are kept (an address is forgotten when its last
/// connection ends), so the map is never larger than the number of open connections, which
/// `--max-connections` bounds. The lock is only held to count, never across an `.await`.
#[derive(Clone, Debug)]
pub struct PerIp {
    max: usize,
    open: Arc<Mutex<HashMap<IpAddr, usize>>>,
}

impl PerIp {
    /// At most `max` connections per address.
    pub fn new(max: usize) -> Self {
        PerIp {
            max,
            open: Arc::default(),
        }
    }

    pub fn max(&self) -> usize {
        self.max
    }

    /// Counts one more connection from `ip`; `None` if it already has `max` open. An IPv4
    /// client reaching an IPv6 socket (as `::ffff:a.b.c.d`) counts as its IPv4 address.
    pub fn admit(&self, ip: IpAddr) -> Option<IpSlot> {
        let ip = ip.to_canonical();
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        let count = open.entry(ip).or_insert(0);
        if *count >= self.max {
            if *count == 0 {
                open.remove(&ip);
            }
            return None;
        }
        *count += 1;
        Some(IpSlot {
            counts: self.clone(),
            ip,
        })
    }

    /// How many addresses have a connection open (the unit tests check that a closed
    /// address leaves the map).
    #[cfg(test)]
    pub fn addresses(&self) -> usize {
        self.open
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }
}

/// One open connection, counted for its address until it is dropped.
#[derive(Debug)]
pub struct IpSlot {
    counts: PerIp,
    ip: IpAddr,
}

impl Drop for IpSlot {
    fn drop(&mut self) {
        let mut open = self
            .counts
            .open
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(count) = open.get_mut(&self.ip) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                open.remove(&self.ip);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_each_address_and_forgets_it_at_zero() {
        let per_ip = PerIp::new(2);
        let a: IpAddr = "127.0.0.1".parse().unwrap();
        let b: IpAddr = "127.0.0.2".parse().unwrap();
        let a1 = per_ip.admit(a).expect("first");
        let a2 = per_ip.admit(a).expect("second");
        assert!(per_ip.admit(a).is_none(), "a third from one address");
        let b1 = per_ip.admit(b).expect("another address is not affected");
        assert_eq!(per_ip.addresses(), 2);
        drop(a1);
        let a3 = per_ip.admit(a).expect("a slot freed");
        drop((a2, a3, b1));
        assert_eq!(
            per_ip.addresses(),
            0,
            "addresses with nothing open are forgotten"
        );
    }

    #[test]
    fn an_ipv4_mapped_address_is_its_ipv4_address() {
        let per_ip = PerIp::new(1);
        let _v4 = per_ip.admit("127.0.0.1".parse().unwrap()).expect("first");
        assert!(per_ip.admit("::ffff:127.0.0.1".parse().unwrap()).is_none());
    }
}
