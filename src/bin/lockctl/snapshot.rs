//! What STATUS says about locks, parsed: the one-line summary of `STATUS [<name>]` and the
//! holders and queue of `STATUS <name> detail`. Shared by `status` and `top`.

use std::time::Duration;

use lockd::client::Detail;
use lockd::proto::field;

/// One lock as a STATUS line describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row {
    pub name: String,
    pub held: Option<Held>,
}

/// A held lock: its first holder (the lowest token), and how many hold and wait.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Held {
    pub id: String,
    pub token: u64,
    pub ttl: Duration,
    pub session: bool,
    pub waiters: u64,
    /// 1 for an exclusive lock; a server without shared locks does not say.
    pub holders: u64,
    pub mode: String,
}

/// One `HOLDER` line of a detail.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    pub id: String,
    pub token: u64,
    pub held: Duration,
    pub ttl: Duration,
    pub session: bool,
    pub mode: String,
}

/// One `WAITER` line of a detail: `position` 1 is granted next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Waiter {
    pub position: u64,
    pub id: String,
    pub waited: Duration,
    pub session: bool,
    pub mode: String,
}

/// One lock with its holders and (the first part of) its queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lock {
    pub row: Row,
    pub holders: Vec<Holder>,
    pub queue: Vec<Waiter>,
}

/// The mode of a lock or request whose line has no `mode=`: a server without shared locks.
const EXCLUSIVE: &str = "exclusive";

/// The words of `line` after the first `skip`: the `key=value` part, so that a name that
/// looks like `id=x` is never read as a field.
fn fields(line: &str, skip: usize) -> &str {
    line.splitn(skip + 1, ' ').nth(skip).unwrap_or("")
}

fn millis(rest: &str, key: &str) -> Option<Duration> {
    Some(Duration::from_millis(field(rest, key)?.parse().ok()?))
}

fn mode(rest: &str) -> String {
    field(rest, "mode").unwrap_or(EXCLUSIVE).to_owned()
}

/// A mode in words: `exclusive`, `shared`, `as a semaphore of 3`.
pub fn mode_words(mode: &str) -> String {
    match mode.strip_prefix("limit:") {
        Some(n) => format!("as a semaphore of {n}"),
        None => mode.to_owned(),
    }
}

impl Row {
    /// Parses `<name> free` or `<name> held id=.. token=.. ttl_ms=.. session=.. waiters=..`
    /// (with `holders=.. mode=..` for a shared lock or a semaphore).
    pub fn parse(line: &str) -> Option<Row> {
        let mut words = line.split(' ');
        let name = words.next()?.to_owned();
        let held = match words.next()? {
            "free" => None,
            "held" => {
                let rest = fields(line, 2);
                Some(Held {
                    id: field(rest, "id")?.to_owned(),
                    token: field(rest, "token")?.parse().ok()?,
                    ttl: millis(rest, "ttl_ms")?,
                    session: field(rest, "session")? == "1",
                    waiters: field(rest, "waiters")?.parse().ok()?,
                    holders: match field(rest, "holders") {
                        Some(k) => k.parse().ok()?,
                        None => 1,
                    },
                    mode: mode(rest),
                })
            }
            _ => return None,
        };
        Some(Row { name, held })
    }
}

impl Holder {
    /// Parses `<name> id=.. token=.. held_ms=.. ttl_ms=.. session=.. [mode=..]`.
    fn parse(line: &str) -> Option<Holder> {
        let rest = fields(line, 1);
        Some(Holder {
            id: field(rest, "id")?.to_owned(),
            token: field(rest, "token")?.parse().ok()?,
            held: millis(rest, "held_ms")?,
            ttl: millis(rest, "ttl_ms")?,
            session: field(rest, "session")? == "1",
            mode: mode(rest),
        })
    }
}

impl Waiter {
    /// Parses `<name> <position> id=.. waited_ms=.. session=.. [mode=..]`.
    fn parse(line: &str) -> Option<Waiter> {
        let position = line.split(' ').nth(1)?.parse().ok()?;
        let rest = fields(line, 2);
        Some(Waiter {
            position,
            id: field(rest, "id")?.to_owned(),
            waited: millis(rest, "waited_ms")?,
            session: field(rest, "session")? == "1",
            mode: mode(rest),
        })
    }
}

impl Lock {
    /// A detail as lockd sent it; `Err` names the first line that is not what proto.md says.
    pub fn parse(detail: &Detail) -> Result<Lock, String> {
        let row = Row::parse(&detail.status).ok_or_else(|| detail.status.clone())?;
        let holders = detail
            .holders
            .iter()
            .map(|l| Holder::parse(l).ok_or_else(|| format!("HOLDER {l}")))
            .collect::<Result<_, _>>()?;
        let queue = detail
            .waiters
            .iter()
            .map(|l| Waiter::parse(l).ok_or_else(|| format!("WAITER {l}")))
            .collect::<Result<_, _>>()?;
        Ok(Lock {
            row,
            holders,
            queue,
        })
    }

    /// How long the lock has been held: by its first holder, the longest.
    pub fn age(&self) -> Option<Duration> {
        self.holders.iter().map(|h| h.held).max()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_parse() {
        let r = Row::parse("a held id=h:1 token=7 ttl_ms=1500 session=1 waiters=2").unwrap();
        assert_eq!(r.name, "a");
        let h = r.held.unwrap();
        assert_eq!(
            (h.id.as_str(), h.token, h.session, h.waiters, h.holders),
            ("h:1", 7, true, 2, 1)
        );
        assert_eq!(h.mode, "exclusive");
        assert_eq!(Row::parse("b free").unwrap().held, None);
        assert!(Row::parse("b gone").is_none());
        // A name that looks like a field is not read as one.
        let r = Row::parse("id=x held id=h token=1 ttl_ms=1 session=0 waiters=0").unwrap();
        assert_eq!(r.held.unwrap().id, "h");
        let shared = "s held id=a token=3 ttl_ms=9 session=0 waiters=1 holders=4 mode=shared";
        let h = Row::parse(shared).unwrap().held.unwrap();
        assert_eq!((h.holders, h.mode.as_str()), (4, "shared"));
    }

    #[test]
    fn details_parse() {
        let detail = Detail {
            holders: vec!["d id=h:1 token=7 held_ms=1200 ttl_ms=800 session=1".into()],
            waiters: vec![
                "d 1 id=w:1 waited_ms=300 session=0".into(),
                "d 2 id=w:2 waited_ms=100 session=1 mode=shared".into(),
            ],
            status: "d held id=h:1 token=7 ttl_ms=800 session=1 waiters=2".into(),
        };
        let lock = Lock::parse(&detail).unwrap();
        assert_eq!(lock.holders[0].held, Duration::from_millis(1200));
        assert_eq!(lock.age(), Some(Duration::from_millis(1200)));
        assert_eq!(
            (lock.queue[1].position, lock.queue[1].id.as_str()),
            (2, "w:2")
        );
        assert_eq!(lock.queue[1].mode, "shared");
        assert_eq!(lock.queue[0].mode, "exclusive");
        let bad = Detail {
            waiters: vec!["d x id=w".into()],
            ..detail
        };
        assert_eq!(Lock::parse(&bad), Err("WAITER d x id=w".into()));
    }
}
