//! The bytes on disk: records, frames, the snapshot, and a CRC-32 to check them.
//!
//! A log is a sequence of **frames**, `[len u32 LE][crc32 u32 LE][payload]`, one per group
//! commit (one write, one fdatasync). The payload is one or more records back to back. A frame
//! is the unit that is or is not on disk after a crash: the writer never starts a frame before
//! the previous one is synced, so only the last frame of a log can be torn, and a damaged
//! frame followed by a good one is damage, not a crash.
//!
//! Times are wall-clock milliseconds since the Unix epoch, so a lease's deadline means the
//! same thing to the next process.

use std::fmt;

/// A frame longer than this is damage: the writer splits bigger batches.
pub const MAX_FRAME: usize = 64 << 20;
/// The writer starts a new frame (and fdatasync) past this many bytes.
pub const SPLIT_FRAME_AT: usize = 16 << 20;
/// Bytes before a frame's payload.
pub const FRAME_HEADER: usize = 8;
/// First bytes of a snapshot file: names the format and its version.
pub const SNAPSHOT_MAGIC: &[u8; 8] = b"LOCKDSN1";

const GRANT: u8 = 1;
const RENEW: u8 = 2;
const RELEASE: u8 = 3;
/// A grant of a shared hold or a semaphore slot: [`GRANT`] plus the mode. Exclusive grants
/// keep the old record, so a data directory of plain locks stays readable by older lockd.
const GRANT_MODE: u8 = 4;
/// A grant to an authenticated user (`--auth-file`): [`GRANT_MODE`] plus the user's name, so
/// the lease is still that user's after a restart.
const GRANT_USER: u8 = 5;
/// A grant that says who took it and when, for the audit trail: [`GRANT_USER`] plus the
/// grant's wall-clock time and the client's address (the user's name may be empty: none).
/// Every grant of a lockd that knows the time is written so, which older lockd can't read (an
/// unknown record type is damage to them): the audit trail's price. Records of older lockd
/// read as ever.
const GRANT_ORIGIN: u8 = 6;
/// A grant with its holder's note (`LOCK ... note=`): [`GRANT_ORIGIN`] plus the note. Written
/// only for a grant that has a note, so a data directory without notes stays as it was.
const GRANT_NOTE: u8 = 7;
/// A BREAK of a lease (its `RELEASE` follows): who broke it and when, and the deadline the
/// lease had, until which its holder is told so. Older lockd can't read it (damage to them).
const BREAK: u8 = 8;
/// A set of names (`LOCK ... and=`): the leases of `token` on these names (each granted by
/// its own grant record, just before) are one lease, so a restart links them again. Written
/// only for a set, so a data directory without sets stays readable by older lockd.
const SET: u8 = 10;

/// `Lease::mode` of an exclusive hold; 0 is shared, n >= 2 a slot of a semaphore of n.
pub const EXCLUSIVE: u64 = 1;

/// A lease as it is stored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lease {
    pub name: String,
    pub id: String,
    pub token: u64,
    pub ttl_ms: u64,
    pub deadline_ms: u64,
    /// [`EXCLUSIVE`], 0 for shared, or a semaphore's limit.
    pub mode: u64,
    /// The authenticated user it belongs to; `None` without authentication.
    pub user: Option<String>,
    /// Wall-clock milliseconds of the grant; 0 where not known (a record of older lockd).
    pub granted_ms: u64,
    /// The client's `ip:port`; `None` where not known.
    pub peer: Option<String>,
    /// The holder's note; `None` without one (and in every record but [`GRANT_NOTE`]).
    pub note: Option<String>,
}

/// One change, as it is stored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Record {
    Grant(Lease),
    Renew {
        name: String,
        token: u64,
        ttl_ms: u64,
        deadline_ms: u64,
    },
    Release {
        name: String,
        token: u64,
    },
    Break(Broken),
    /// The leases `token` of `names` (in the request's order) are one set.
    Set {
        token: u64,
        names: Vec<String>,
    },
}

/// A broken lease as it is stored: remembered until `deadline_ms`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Broken {
    pub name: String,
    pub token: u64,
    /// Who broke it (a user's name, or a client's `ip:port`).
    pub by: String,
    /// When, in wall-clock milliseconds.
    pub at_ms: u64,
    /// The deadline the lease had when it was broken.
    pub deadline_ms: u64,
}

/// Bytes that are not what the writer wrote.
#[derive(Debug, PartialEq, Eq)]
pub struct Damaged(pub &'static str);

impl fmt::Display for Damaged {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0)
    }
}

/// CRC-32 (IEEE 802.3, the zlib one), table-driven. Small enough not to need a crate.
pub fn crc32(bytes: &[u8]) -> u32 {
    const TABLE: [u32; 256] = {
        let mut table = [0u32; 256];
        let mut i = 0;
        while i < 256 {
            let mut c = i as u32;
            let mut k = 0;
            while k < 8 {
                c = if c & 1 != 0 {
                    0xEDB8_8320 ^ (c >> 1)
                } else {
                    c >> 1
                };
                k += 1;
            }
            table[i] = c;
            i += 1;
        }
        table
    };
    let mut crc = !0u32;
    for &b in bytes {
        crc = TABLE[((crc ^ b as u32) & 0xFF) as usize] ^ (crc >> 8);
    }
    !crc
}

impl Record {
    /// Appends this record's payload bytes to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        match self {
            Record::Grant(l) if l.note.is_some() => {
                out.push(GRANT_NOTE);
                put_u64s(
                    out,
                    &[l.token, l.ttl_ms, l.deadline_ms, l.mode, l.granted_ms],
                );
                put_str(out, &l.name);
                put_str(out, &l.id);
                put_str(out, l.user.as_deref().unwrap_or(""));
                put_str(out, l.peer.as_deref().unwrap_or(""));
                put_str(out, l.note.as_deref().unwrap_or(""));
            }
            Record::Grant(l) if l.granted_ms != 0 || l.peer.is_some() => {
                out.push(GRANT_ORIGIN);
                put_u64s(
                    out,
                    &[l.token, l.ttl_ms, l.deadline_ms, l.mode, l.granted_ms],
                );
                put_str(out, &l.name);
                put_str(out, &l.id);
                put_str(out, l.user.as_deref().unwrap_or(""));
                put_str(out, l.peer.as_deref().unwrap_or(""));
            }
            Record::Grant(l) if l.user.is_some() => {
                out.push(GRANT_USER);
                put_u64s(out, &[l.token, l.ttl_ms, l.deadline_ms, l.mode]);
                put_str(out, &l.name);
                put_str(out, &l.id);
                put_str(out, l.user.as_deref().unwrap_or(""));
            }
            Record::Grant(l) if l.mode == EXCLUSIVE => {
                out.push(GRANT);
                put_u64s(out, &[l.token, l.ttl_ms, l.deadline_ms]);
                put_str(out, &l.name);
                put_str(out, &l.id);
            }
            Record::Grant(l) => {
                out.push(GRANT_MODE);
                put_u64s(out, &[l.token, l.ttl_ms, l.deadline_ms, l.mode]);
                put_str(out, &l.name);
                put_str(out, &l.id);
            }
            Record::Renew {
                name,
                token,
                ttl_ms,
                deadline_ms,
            } => {
                out.push(RENEW);
                put_u64s(out, &[*token, *ttl_ms, *deadline_ms]);
                put_str(out, name);
            }
            Record::Release { name, token } => {
                out.push(RELEASE);
                put_u64s(out, &[*token]);
                put_str(out, name);
            }
            Record::Break(b) => {
                out.push(BREAK);
                put_u64s(out, &[b.token, b.at_ms, b.deadline_ms]);
                put_str(out, &b.name);
                put_str(out, &b.by);
            }
            Record::Set { token, names } => {
                out.push(SET);
                put_u64s(out, &[*token, names.len() as u64]);
                for name in names {
                    put_str(out, name);
                }
            }
        }
    }

    /// Reads one record from the front of `r`.
    fn decode(r: &mut Reader<'_>) -> Result<Record, Damaged> {
        Ok(match r.u8()? {
            tag @ (GRANT | GRANT_MODE | GRANT_USER | GRANT_ORIGIN | GRANT_NOTE) => {
                let (token, ttl_ms, deadline_ms) = (r.u64()?, r.u64()?, r.u64()?);
                let mode = if tag == GRANT { EXCLUSIVE } else { r.u64()? };
                let audited = matches!(tag, GRANT_ORIGIN | GRANT_NOTE);
                let granted_ms = if audited { r.u64()? } else { 0 };
                let (name, id) = (r.str()?, r.str()?);
                let user = match tag {
                    GRANT_USER => Some(r.str()?),
                    GRANT_ORIGIN | GRANT_NOTE => Some(r.str()?).filter(|u| !u.is_empty()),
                    _ => None,
                };
                let peer = match tag {
                    GRANT_ORIGIN | GRANT_NOTE => Some(r.str()?).filter(|p| !p.is_empty()),
                    _ => None,
                };
                let note = match tag {
                    GRANT_NOTE => Some(r.str()?).filter(|n| !n.is_empty()),
                    _ => None,
                };
                Record::Grant(Lease {
                    name,
                    id,
                    token,
                    ttl_ms,
                    deadline_ms,
                    mode,
                    user,
                    granted_ms,
                    peer,
                    note,
                })
            }
            RENEW => {
                let (token, ttl_ms, deadline_ms) = (r.u64()?, r.u64()?, r.u64()?);
                Record::Renew {
                    name: r.str()?,
                    token,
                    ttl_ms,
                    deadline_ms,
                }
            }
            RELEASE => {
                let token = r.u64()?;
                Record::Release {
                    name: r.str()?,
                    token,
                }
            }
            BREAK => {
                let (token, at_ms, deadline_ms) = (r.u64()?, r.u64()?, r.u64()?);
                Record::Break(Broken {
                    name: r.str()?,
                    by: r.str()?,
                    token,
                    at_ms,
                    deadline_ms,
                })
            }
            SET => {
                let (token, count) = (r.u64()?, r.u64()?);
                // At most a name per 2 bytes left: a count beyond that is damage, not a
                // reason to allocate.
                if count > r.0.len() as u64 / 2 {
                    return Err(Damaged("a set of more names than bytes"));
                }
                let names = (0..count).map(|_| r.str()).collect::<Result<_, _>>()?;
                Record::Set { token, names }
            }
            _ => return Err(Damaged("unknown record type")),
        })
    }
}

/// Appends a frame holding the first records of `records` to `out`: at least one, and no
/// more once the payload passes `split_at` bytes. Returns how many went in.
pub fn encode_frame(records: &[Record], split_at: usize, out: &mut Vec<u8>) -> usize {
    let start = out.len();
    out.extend_from_slice(&[0; FRAME_HEADER]);
    let mut taken = 0;
    for record in records {
        if taken > 0 && out.len() - start - FRAME_HEADER >= split_at {
            break;
        }
        record.encode(out);
        taken += 1;
    }
    let len = (out.len() - start - FRAME_HEADER) as u32;
    let crc = crc32(&out[start + FRAME_HEADER..]);
    out[start..start + 4].copy_from_slice(&len.to_le_bytes());
    out[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
    taken
}

/// What is at the front of a log's bytes.
#[derive(Debug, PartialEq, Eq)]
pub enum LogFrame {
    /// A good frame of this many bytes (header included).
    Good { size: usize, payload_at: usize },
    /// Not a whole, good frame: torn or damaged.
    Bad,
}

/// Checks the frame at the front of `bytes` (which must not be empty).
pub fn check_frame(bytes: &[u8]) -> LogFrame {
    if bytes.len() < FRAME_HEADER {
        return LogFrame::Bad;
    }
    let len = u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]) as usize;
    let crc = u32::from_le_bytes([bytes[4], bytes[5], bytes[6], bytes[7]]);
    if len == 0 || len > MAX_FRAME || len > bytes.len() - FRAME_HEADER {
        return LogFrame::Bad;
    }
    if crc32(&bytes[FRAME_HEADER..FRAME_HEADER + len]) != crc {
        return LogFrame::Bad;
    }
    LogFrame::Good {
        size: FRAME_HEADER + len,
        payload_at: FRAME_HEADER,
    }
}

/// The records of a good frame's payload. An error here is not a torn write (the CRC
/// matched): the file was written by something else.
pub fn decode_records(mut payload: &[u8], out: &mut Vec<Record>) -> Result<(), Damaged> {
    while !payload.is_empty() {
        let mut r = Reader(payload);
        out.push(Record::decode(&mut r)?);
        payload = r.0;
    }
    Ok(())
}

/// A snapshot: the log generation that follows it, the highest token ever granted, and the
/// leases live when it was written.
#[derive(Debug, PartialEq, Eq)]
pub struct Snapshot {
    pub generation: u64,
    pub high_token: u64,
    pub leases: Vec<Lease>,
    /// The broken leases still remembered; written after the leases, in the same count
    /// (a snapshot without any reads as an older lockd's).
    pub breaks: Vec<Broken>,
    /// The sets of names among the leases (token, names); written last, in the same count
    /// (a snapshot without sets reads as an older lockd's).
    pub sets: Vec<(u64, Vec<String>)>,
}

impl Snapshot {
    pub fn encode(&self) -> Vec<u8> {
        let mut payload = Vec::new();
        put_u64s(
            &mut payload,
            &[
                self.generation,
                self.high_token,
                (self.leases.len() + self.breaks.len() + self.sets.len()) as u64,
            ],
        );
        for lease in &self.leases {
            Record::Grant(lease.clone()).encode(&mut payload);
        }
        for broken in &self.breaks {
            Record::Break(broken.clone()).encode(&mut payload);
        }
        for (token, names) in &self.sets {
            let (token, names) = (*token, names.clone());
            Record::Set { token, names }.encode(&mut payload);
        }
        let mut out = Vec::with_capacity(payload.len() + 16);
        out.extend_from_slice(SNAPSHOT_MAGIC);
        out.extend_from_slice(&(payload.len() as u64).to_le_bytes());
        out.extend_from_slice(&crc32(&payload).to_le_bytes());
        out.extend_from_slice(&payload);
        out
    }

    /// The whole file must check out: a snapshot is written once and renamed into place, so
    /// any damage is real damage.
    pub fn decode(bytes: &[u8]) -> Result<Snapshot, Damaged> {
        let mut r = Reader(bytes);
        if r.take(8)? != SNAPSHOT_MAGIC {
            return Err(Damaged("not a lockd snapshot (bad magic)"));
        }
        let len = r.u64()?;
        let crc = r.u32()?;
        if len != r.0.len() as u64 {
            return Err(Damaged("length does not match the file"));
        }
        if crc32(r.0) != crc {
            return Err(Damaged("checksum mismatch"));
        }
        let (generation, high_token, count) = (r.u64()?, r.u64()?, r.u64()?);
        let (mut leases, mut breaks, mut sets) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..count {
            match Record::decode(&mut r)? {
                Record::Grant(lease) => leases.push(lease),
                Record::Break(broken) => breaks.push(broken),
                Record::Set { token, names } => sets.push((token, names)),
                _ => return Err(Damaged("a snapshot holds only leases, breaks and sets")),
            }
        }
        if !r.0.is_empty() {
            return Err(Damaged("bytes after the last lease"));
        }
        Ok(Snapshot {
            generation,
            high_token,
            leases,
            breaks,
            sets,
        })
    }
}

fn put_u64s(out: &mut Vec<u8>, values: &[u64]) {
    for v in values {
        out.extend_from_slice(&v.to_le_bytes());
    }
}

/// Names and ids are at most 255 bytes (the protocol's bound), so a u16 length is plenty.
fn put_str(out: &mut Vec<u8>, s: &str) {
    let bytes = &s.as_bytes()[..s.len().min(u16::MAX as usize)];
    out.extend_from_slice(&(bytes.len() as u16).to_le_bytes());
    out.extend_from_slice(bytes);
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], Damaged> {
        if self.0.len() < n {
            return Err(Damaged("record cut short"));
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    fn u8(&mut self) -> Result<u8, Damaged> {
        Ok(self.take(1)?[0])
    }

    fn u32(&mut self) -> Result<u32, Damaged> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn u64(&mut self) -> Result<u64, Damaged> {
        let mut a = [0u8; 8];
        a.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(a))
    }

    fn str(&mut self) -> Result<String, Damaged> {
        let b = self.take(2)?;
        let len = u16::from_le_bytes([b[0], b[1]]) as usize;
        let bytes = self.take(len)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| Damaged("name or id is not UTF-8"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(name: &str, token: u64) -> Lease {
        Lease {
            name: name.into(),
            id: "me".into(),
            token,
            ttl_ms: 30_000,
            deadline_ms: 1_700_000_000_000,
            mode: EXCLUSIVE,
            user: None,
            granted_ms: 0,
            peer: None,
            note: None,
        }
    }

    /// Each earlier shape of a grant record (as older lockd wrote it) reads back as it was,
    /// and a grant that says who took it and when round-trips.
    #[test]
    fn every_grant_record_reads_back_old_and_new() {
        let plain = lease("a", 1);
        let shared = Lease {
            mode: 0,
            ..lease("b", 2)
        };
        let owned = Lease {
            user: Some("alice".into()),
            ..lease("c", 3)
        };
        let audited = Lease {
            user: Some("alice".into()),
            granted_ms: 1_700_000_000_123,
            peer: Some("10.0.0.7:41234".into()),
            ..lease("d", 4)
        };
        let anonymous = Lease {
            granted_ms: 1_700_000_000_456,
            peer: Some("[::1]:5".into()),
            ..lease("e", 5)
        };
        let noted = Lease {
            granted_ms: 1_700_000_000_789,
            note: Some("release 1.4.2 by ci job 8812 ☃".into()),
            ..lease("f", 6)
        };
        for (l, tag) in [
            (&plain, GRANT),
            (&shared, GRANT_MODE),
            (&owned, GRANT_USER),
            (&audited, GRANT_ORIGIN),
            (&anonymous, GRANT_ORIGIN),
            (&noted, GRANT_NOTE),
        ] {
            let mut bytes = Vec::new();
            Record::Grant(l.clone()).encode(&mut bytes);
            assert_eq!(bytes[0], tag, "{l:?}");
            let mut back = Vec::new();
            decode_records(&bytes, &mut back).unwrap();
            assert_eq!(back, vec![Record::Grant(l.clone())]);
        }
    }

    #[test]
    fn crc32_matches_the_standard_check_value() {
        assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
        assert_eq!(crc32(b""), 0);
    }

    #[test]
    fn a_break_record_round_trips() {
        let records = vec![Record::Break(Broken {
            name: "deploy prod".into(),
            token: 7,
            by: "127.0.0.1:5".into(),
            at_ms: 11,
            deadline_ms: 13,
        })];
        let mut bytes = Vec::new();
        encode_frame(&records, SPLIT_FRAME_AT, &mut bytes);
        let LogFrame::Good { size, payload_at } = check_frame(&bytes) else {
            panic!("good frame read as bad");
        };
        let mut back = Vec::new();
        decode_records(&bytes[payload_at..size], &mut back).unwrap();
        assert_eq!(back, records);
    }

    #[test]
    fn a_set_record_round_trips() {
        let records = vec![
            Record::Grant(lease("a", 7)),
            Record::Grant(lease("b", 7)),
            Record::Set {
                token: 7,
                names: vec!["a".into(), "b".into()],
            },
        ];
        let mut bytes = Vec::new();
        encode_frame(&records, SPLIT_FRAME_AT, &mut bytes);
        let LogFrame::Good { size, payload_at } = check_frame(&bytes) else {
            panic!("good frame read as bad");
        };
        let mut back = Vec::new();
        decode_records(&bytes[payload_at..size], &mut back).unwrap();
        assert_eq!(back, records);
    }

    #[test]
    fn frames_round_trip_and_damage_is_seen() {
        let records = vec![
            Record::Grant(lease("a", 7)),
            Record::Renew {
                name: "a".into(),
                token: 7,
                ttl_ms: 5,
                deadline_ms: 9,
            },
            Record::Release {
                name: "a".into(),
                token: 7,
            },
        ];
        let mut bytes = Vec::new();
        assert_eq!(encode_frame(&records, SPLIT_FRAME_AT, &mut bytes), 3);
        let LogFrame::Good { size, payload_at } = check_frame(&bytes) else {
            panic!("good frame read as bad");
        };
        assert_eq!(size, bytes.len());
        let mut back = Vec::new();
        decode_records(&bytes[payload_at..size], &mut back).unwrap();
        assert_eq!(back, records);
        for cut in 1..bytes.len() {
            assert_eq!(check_frame(&bytes[..cut]), LogFrame::Bad, "cut at {cut}");
        }
        let mut flipped = bytes.clone();
        flipped[12] ^= 1;
        assert_eq!(check_frame(&flipped), LogFrame::Bad);
    }

    #[test]
    fn big_batches_are_split_into_frames() {
        let records: Vec<Record> = (0..10).map(|t| Record::Grant(lease("n", t))).collect();
        let mut bytes = Vec::new();
        assert_eq!(encode_frame(&records, 1, &mut bytes), 1);
        bytes.clear();
        // 32 bytes a record: the fourth one crosses 100.
        assert_eq!(encode_frame(&records, 100, &mut bytes), 4);
    }

    #[test]
    fn snapshots_round_trip_and_damage_is_refused() {
        let snap = Snapshot {
            generation: 3,
            high_token: 99,
            leases: vec![lease("a", 1), lease("b", 2)],
            breaks: vec![Broken {
                name: "c".into(),
                token: 3,
                by: "ops".into(),
                at_ms: 5,
                deadline_ms: 7,
            }],
            sets: vec![(4, vec!["d".into(), "e".into()])],
        };
        let bytes = snap.encode();
        assert_eq!(Snapshot::decode(&bytes).unwrap(), snap);
        for i in 0..bytes.len() {
            let mut bad = bytes.clone();
            bad[i] ^= 0x40;
            assert!(Snapshot::decode(&bad).is_err(), "flip at {i}");
        }
        assert!(Snapshot::decode(&bytes[..bytes.len() - 1]).is_err());
    }
}
