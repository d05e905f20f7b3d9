//! Each front-end's mirror of the queues against etcd, whenever the mirror has caught up
//! with etcd's revision: the same waiter keys at the same create revisions. A queue whose
//! order ties (two waiter keys of one name written by one transaction share their create
//! revision, and the mirror orders a queue by it) loses a waiter there: no safety check
//! sees it, the waiter only waits out its wait (group commit's first trial).

use std::sync::Arc;
use std::time::Duration;

use lockd::backend::etcd::sim;
use tokio::time::sleep;

use crate::run::World;

/// How often the mirrors are looked at.
const EVERY: Duration = Duration::from_millis(10);

/// Looks until the run stops; says the first difference as a violation.
pub async fn watch(world: Arc<World>) {
    while !world.stop.is_cancelled() {
        sleep(EVERY).await;
        let fronts = world.fronts.lock().unwrap().clone();
        for (fe, front) in fronts.iter().enumerate() {
            let Some(front) = front else { continue };
            let Some(mirror) = sim::queued_keys(&front.backend) else {
                continue;
            };
            let (rev, mirrored) = (mirror.rev, mirror.keys);
            let (now, stored) = world.net.keys(&mirror.under);
            if rev != now || mirrored == stored {
                continue;
            }
            let missing: Vec<_> = stored.iter().filter(|k| !mirrored.contains(k)).collect();
            let extra: Vec<_> = mirrored.iter().filter(|k| !stored.contains(k)).collect();
            world.violation(format!(
                "fe{fe}'s mirror at revision {rev} differs from etcd's queues: \
                 missing {missing:?}, not in etcd {extra:?}"
            ));
            return;
        }
    }
}
