//! A network link a test can cut while both ends keep running: a TCP relay on 127.0.0.1:0 in
//! front of one address (an etcd member's client port, say), which passes bytes both ways
//! until [`Link::cut`] and again after [`Link::heal`].
//!
//! A cut stalls the link, it does not reset it: bytes already sent wait in the relay and the
//! kernel's buffers, new connections are accepted by the kernel but not carried on, and
//! nothing is answered, exactly what a process sees when a firewall drops a link's packets
//! (its requests time out; its TCP connections stay open until its own keep-alive gives up).
//! On heal, what waited is delivered in order, as TCP's retransmissions would: a request
//! the client gave up on may still be applied, which is the case a lock service must be safe
//! against ("the answer was lost, not the write").
//!
//! [`Link::cut_replies`] stalls one way only: requests still reach the target and apply,
//! their answers (and anything else the target sends) wait until the heal, as when a route
//! back is lost. That is how a test makes "the write applied, nobody heard of it yet" last.
//!
//! Why a relay and not packet-filter rules: it needs no root, cuts exactly the pairs a test
//! routes through it (a front-end that is given the relays' addresses instead of etcd's),
//! leaves nothing behind when a test fails, and can't touch another test's traffic.

use std::io::{ErrorKind, Read as _, Write as _};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread;
use std::time::Duration;

/// How often a blocked relay thread looks whether the link was dropped.
const POLL: Duration = Duration::from_millis(50);

/// Which ways a link is cut.
#[derive(Clone, Copy, Default)]
struct Cut {
    /// From the client to the target: requests (and new connections).
    requests: bool,
    /// From the target back to the client.
    replies: bool,
}

/// One way of a link.
#[derive(Clone, Copy)]
enum Way {
    Requests,
    Replies,
}

struct State {
    cut: Mutex<Cut>,
    healed: Condvar,
    stopped: AtomicBool,
    /// Connections carried so far.
    carried: AtomicUsize,
    /// Every socket still open, to close when the link is dropped.
    open: Mutex<Vec<TcpStream>>,
}

impl State {
    /// Waits while `way` is cut; false once the link is dropped.
    fn pass(&self, way: Way) -> bool {
        let mut cut = self.cut.lock().unwrap_or_else(|p| p.into_inner());
        while match way {
            Way::Requests => cut.requests,
            Way::Replies => cut.replies,
        } {
            if self.stopped.load(Ordering::SeqCst) {
                return false;
            }
            cut = self
                .healed
                .wait_timeout(cut, POLL)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        !self.stopped.load(Ordering::SeqCst)
    }

    fn track(&self, s: &TcpStream) {
        if let Ok(s) = s.try_clone() {
            self.open.lock().unwrap_or_else(|p| p.into_inner()).push(s);
        }
    }
}

/// One link to `target`.
pub struct Link {
    pub addr: SocketAddr,
    state: Arc<State>,
}

impl Link {
    pub fn start(target: SocketAddr) -> Link {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind link");
        let addr = listener.local_addr().expect("link addr");
        let state = Arc::new(State {
            cut: Mutex::new(Cut::default()),
            healed: Condvar::new(),
            stopped: AtomicBool::new(false),
            carried: AtomicUsize::new(0),
            open: Mutex::new(Vec::new()),
        });
        let st = state.clone();
        thread::spawn(move || {
            for client in listener.incoming() {
                if st.stopped.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(client) = client else { continue };
                let st = st.clone();
                // Carried on once the link is up: a connection made during a cut hangs.
                thread::spawn(move || {
                    if !st.pass(Way::Requests) {
                        return;
                    }
                    let Ok(server) = TcpStream::connect(target) else {
                        return;
                    };
                    st.track(&client);
                    st.track(&server);
                    st.carried.fetch_add(1, Ordering::SeqCst);
                    relay(&st, &client, &server, Way::Requests);
                    relay(&st, &server, &client, Way::Replies);
                });
            }
        });
        Link { addr, state }
    }

    /// `http://<addr>`, for a client that takes URLs (lockd's `--etcd`).
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Stops carrying bytes either way, and new connections, until [`Link::heal`].
    pub fn cut(&self) {
        self.set(Cut {
            requests: true,
            replies: true,
        });
    }

    /// Stops carrying bytes from the target back, until [`Link::heal`]: requests still
    /// arrive and apply, nobody hears of it.
    pub fn cut_replies(&self) {
        self.set(Cut {
            requests: false,
            replies: true,
        });
    }

    /// Carries on: what waited during the cut is delivered.
    pub fn heal(&self) {
        self.set(Cut::default());
    }

    fn set(&self, cut: Cut) {
        *self.state.cut.lock().unwrap_or_else(|p| p.into_inner()) = cut;
        self.state.healed.notify_all();
    }

    /// How many connections it has carried.
    pub fn carried(&self) -> usize {
        self.state.carried.load(Ordering::SeqCst)
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        self.state.stopped.store(true, Ordering::SeqCst);
        self.heal();
        for s in self
            .state
            .open
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .drain(..)
        {
            let _ = s.shutdown(Shutdown::Both);
        }
        let _ = TcpStream::connect(self.addr); // wakes the accept loop to see `stopped`
    }
}

/// Copies `from` to `to` in a thread, holding each chunk while `way` is cut, until either
/// end closes (then `to`'s sending side is shut) or the link is dropped.
fn relay(state: &Arc<State>, from: &TcpStream, to: &TcpStream, way: Way) {
    let (Ok(mut from), Ok(mut to)) = (from.try_clone(), to.try_clone()) else {
        return;
    };
    let state = state.clone();
    thread::spawn(move || {
        let _ = from.set_read_timeout(Some(POLL));
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match from.read(&mut buf) {
                // The close waits for the link too, as a FIN's packet would.
                Ok(0) => {
                    state.pass(way);
                    break;
                }
                Ok(n) => n,
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                    if state.stopped.load(Ordering::SeqCst) {
                        break;
                    }
                    continue;
                }
                Err(_) => break,
            };
            if !state.pass(way) || to.write_all(&buf[..n]).is_err() {
                break;
            }
        }
        let _ = to.shutdown(Shutdown::Write);
    });
}
