//! Where a KV request goes: straight to the leader while it is known, to another member that
//! answers while the leader does not, else over the balanced channel.
//!
//! Every member serves every request, but a follower sends a write on to the leader (raft
//! forwards the proposal, and the follower answers once it has applied the entry itself) and
//! asks the leader for its commit index before a linearizable read: one more hop, and one more
//! member's work, for each. Sent to the leader, neither. So a client of several members asks
//! each for its status, finds the leader (the member whose id is the leader id of the newest
//! term), and sends its `Range` and `Txn` requests there. When the leader does not answer this
//! client (a link cut, a member gone) but another member does, and knows a leader, requests go
//! to that member: the balanced channel would keep sending some of them into the silent link,
//! each to wait out its timeout. The watch, the lease and any request while no member is known
//! to answer keep the balanced channel.
//!
//! This is routing only: which member receives a request changes nothing of what it means
//! (each is linearizable on any member). A request the chosen member fails (a member gone, a
//! connection cut, a leader deposed) drops the route at once, so that the next one goes over
//! the balanced channel until the members are asked again.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::Notify;
use tonic::transport::Endpoint;

use super::auth::{Metadata, Svc};
use super::pb;
use super::pb::kv_client::KvClient;
use super::pb::maintenance_client::MaintenanceClient;
use tonic::service::interceptor::InterceptedService;

/// No member chosen.
const NONE: usize = usize::MAX;

/// A [`Target`] in one word (the member's index, doubled, plus one if it is the leader), so
/// that who requests go to and whether it leads change together.
fn encode(t: Target) -> usize {
    t.member * 2 + usize::from(t.leader)
}

fn decode(word: usize) -> Option<Target> {
    (word != NONE).then_some(Target {
        member: word / 2,
        leader: word % 2 == 1,
    })
}

/// One member on a channel of its own.
struct Member {
    url: String,
    kv: KvClient<Svc>,
    maintenance: MaintenanceClient<Svc>,
}

/// The members one by one, and which of them requests go to.
pub(super) struct Route {
    members: Vec<Member>,
    /// The member requests go to ([`encode`]d), or [`NONE`].
    target: AtomicUsize,
    /// A request on the chosen member's channel failed, so the route was dropped: look again.
    dropped: Notify,
}

/// Where requests go: a member, and whether it is the leader.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Target {
    pub member: usize,
    pub leader: bool,
}

/// One member's answer to a status request: its own id, and the leader it knows of in the
/// term it is in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Seen {
    pub member: u64,
    pub leader: u64,
    pub term: u64,
}

/// Which of `seen` (one entry per member, `None` when it did not answer) to send requests
/// to: the member whose own id is the leader named in the newest term any answer gives; if
/// that one did not answer (cut off from this client), the first member that answered naming
/// that leader, which forwards to it. `None` when no answer names a leader.
pub(super) fn choose(seen: &[Option<Seen>]) -> Option<Target> {
    let newest = seen
        .iter()
        .flatten()
        .filter(|s| s.leader != 0)
        .max_by_key(|s| s.term)?;
    let leader = seen
        .iter()
        .position(|s| s.is_some_and(|s| s.member == newest.leader));
    if let Some(member) = leader {
        return Some(Target {
            member,
            leader: true,
        });
    }
    let member = seen
        .iter()
        .position(|s| s.is_some_and(|s| s.leader == newest.leader))?;
    Some(Target {
        member,
        leader: false,
    })
}

impl Route {
    /// A channel to each member (connected lazily, like the balanced one), with the same
    /// metadata (so the same token) on every call.
    pub(super) fn new(members: Vec<(String, Endpoint)>, metadata: &Metadata) -> Route {
        let members = members
            .into_iter()
            .map(|(url, endpoint)| {
                let svc = InterceptedService::new(endpoint.connect_lazy(), metadata.clone());
                Member {
                    url,
                    kv: KvClient::new(svc.clone()),
                    maintenance: MaintenanceClient::new(svc),
                }
            })
            .collect();
        Route {
            members,
            target: AtomicUsize::new(NONE),
            dropped: Notify::new(),
        }
    }

    /// The chosen member's KV client, with the route it was taken from (for
    /// [`Route::failed`]), if one is chosen.
    pub(super) fn kv(&self) -> Option<(usize, KvClient<Svc>)> {
        let word = self.target.load(Ordering::Relaxed);
        let m = self.members.get(decode(word)?.member)?;
        Some((word, m.kv.clone()))
    }

    /// A request on the route `word` (from [`Route::kv`]) failed: no route until the
    /// members are asked again (unless another one was chosen meanwhile).
    pub(super) fn failed(&self, word: usize) {
        if self
            .target
            .compare_exchange(word, NONE, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
        {
            self.dropped.notify_one();
        }
    }

    /// Waits until a request on the chosen member's channel has failed.
    pub(super) async fn dropped(&self) {
        self.dropped.notified().await;
    }

    /// The URL requests go to and whether it is the leader's, if a member is chosen.
    pub(super) fn target(&self) -> Option<(&str, bool)> {
        let t = decode(self.target.load(Ordering::Relaxed))?;
        let m = self.members.get(t.member)?;
        Some((m.url.as_str(), t.leader))
    }

    /// Asks every member for its status at once (each within `timeout`) and routes to the
    /// member [`choose`] picks, or over the balanced channel if none.
    pub(super) async fn find(&self, timeout: Duration) -> Option<(&str, bool)> {
        let mut asks = tokio::task::JoinSet::new();
        for (i, m) in self.members.iter().enumerate() {
            let mut maintenance = m.maintenance.clone();
            asks.spawn(async move {
                let ask = maintenance.status(pb::StatusRequest {});
                let answer = tokio::time::timeout(timeout, ask).await;
                let seen = match answer {
                    Ok(Ok(r)) => {
                        let r = r.into_inner();
                        r.header.map(|h| Seen {
                            member: h.member_id,
                            leader: r.leader,
                            term: r.raft_term,
                        })
                    }
                    _ => None,
                };
                (i, seen)
            });
        }
        let mut seen = vec![None; self.members.len()];
        while let Some(done) = asks.join_next().await {
            if let Ok((i, s)) = done {
                seen[i] = s;
            }
        }
        let word = choose(&seen).map_or(NONE, encode);
        self.target.store(word, Ordering::Relaxed);
        self.target()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(member: u64, leader: u64, term: u64) -> Option<Seen> {
        Some(Seen {
            member,
            leader,
            term,
        })
    }

    fn to(member: usize, leader: bool) -> Option<Target> {
        Some(Target { member, leader })
    }

    #[test]
    fn the_member_named_leader_in_the_newest_term() {
        let all = [seen(1, 2, 5), seen(2, 2, 5), seen(3, 2, 5)];
        assert_eq!(choose(&all), to(1, true));
        // A deposed leader that has not heard of the election yet still names itself.
        let deposed = [seen(1, 1, 4), seen(2, 3, 5), seen(3, 3, 5)];
        assert_eq!(choose(&deposed), to(2, true));
        assert_eq!(choose(&[None, seen(2, 3, 5), seen(3, 3, 5)]), to(2, true));
    }

    #[test]
    fn a_leader_that_does_not_answer_is_reached_through_one_that_does() {
        assert_eq!(choose(&[None, seen(2, 1, 5), seen(3, 1, 5)]), to(1, false));
        // Not through the deposed leader, which names itself in an older term.
        let cut = [seen(1, 1, 4), None, seen(3, 2, 5)];
        assert_eq!(choose(&cut), to(2, false));
        assert_eq!(
            choose(&[seen(1, 9, 5)]),
            to(0, false),
            "a leader not listed"
        );
    }

    #[test]
    fn no_route_without_a_leader() {
        assert_eq!(choose(&[]), None);
        assert_eq!(choose(&[None, None]), None);
        assert_eq!(choose(&[seen(1, 0, 5), seen(2, 0, 5)]), None, "electing");
    }

    #[tokio::test]
    async fn a_failure_on_the_leader_drops_the_route_and_says_so() {
        let members = ["http://127.0.0.1:1", "http://127.0.0.1:2"]
            .map(|u| (u.to_owned(), Endpoint::from_static(u)))
            .to_vec();
        let metadata = Metadata {
            require_leader: false,
            token: Default::default(),
        };
        let route = Route::new(members, &metadata);
        assert!(route.kv().is_none(), "no leader known at first");
        let word = encode(Target {
            member: 1,
            leader: true,
        });
        route.target.store(word, Ordering::Relaxed);
        assert_eq!(route.kv().map(|(w, _)| w), Some(word));
        assert_eq!(route.target(), Some(("http://127.0.0.1:2", true)));
        // A failure on a route that was replaced meanwhile changes nothing.
        route.failed(encode(Target {
            member: 0,
            leader: false,
        }));
        assert_eq!(route.kv().map(|(w, _)| w), Some(word));
        route.failed(word);
        assert!(route.kv().is_none());
        tokio::time::timeout(Duration::from_secs(5), route.dropped())
            .await
            .expect("told of the drop");
        // Nobody answers: no route.
        assert_eq!(route.find(Duration::from_millis(200)).await, None);
    }
}
