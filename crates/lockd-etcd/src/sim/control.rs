//! What the simulator's director does to etcd and the network: the random faults on or off,
//! a front-end cut off or crashed, an election, a compaction; each noted in the trace, so
//! that a failing seed's trace tells what happened when.

use super::Net;

impl Net {
    /// Switches the random faults on or off (cuts and deaths are the caller's).
    pub fn faults(&self, on: bool) {
        let mut w = self.world();
        w.faulty = on;
        w.note(format_args!("faults {}", if on { "on" } else { "off" }));
    }

    /// Cuts front-end `fe` off from etcd, or joins it again.
    pub fn cut(&self, fe: usize, cut: bool) {
        let mut w = self.world();
        w.front(fe).cut = cut;
        w.note(format_args!(
            "fe{fe}: {}",
            if cut {
                "cut off from etcd"
            } else {
                "reaches etcd again"
            }
        ));
    }

    /// etcd takes at most `n` operations in a transaction (its `--max-txn-ops`).
    pub fn max_txn_ops(&self, n: usize) {
        let mut w = self.world();
        w.etcd.set_max_txn_ops(n);
        w.note(format_args!("etcd: --max-txn-ops={n}"));
    }

    /// Front-end `fe` crashed: nothing it sends arrives any more.
    pub fn kill(&self, fe: usize) {
        let mut w = self.world();
        let at = w.now_ms();
        let f = w.front(fe);
        f.dead = true;
        f.crashed_ms = at;
        w.note(format_args!("fe{fe}: crashed"));
    }

    /// etcd loses its leader (every request refused) or has one again.
    pub fn leaderless(&self, on: bool) {
        let mut w = self.world();
        w.leaderless = on;
        w.note(format_args!(
            "etcd: {}",
            if on {
                "leader lost, electing"
            } else {
                "leader elected"
            }
        ));
    }

    /// Compacts etcd's history up to its current revision.
    pub fn compact(&self) {
        let mut w = self.world();
        let rev = w.etcd.revision();
        w.etcd.compact(rev);
        w.note(format_args!("etcd: compacted at revision {rev}"));
    }
}
