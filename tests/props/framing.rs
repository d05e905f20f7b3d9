//! Randomized, adversarial input against the framing and the whole request path: random
//! bytes, lines far over `--max-line`, lone `\r`, NUL, invalid UTF-8, writes split anywhere.
//!
//! Three properties, from cheapest to most end-to-end:
//! - [`Connection`]'s frames are exactly those of a reference framer written from proto.md's
//!   Framing rules, however the bytes are split, and its input buffer stays bounded.
//! - A real server answers every request line with exactly the lines proto.md promises, each
//!   `OK ...` or `ERR <CODE> ...` with a documented code, and keeps serving.
//! - The real binary, blasted by many connections sending huge lines and random bytes at
//!   once, keeps its memory bounded and still answers.

use crate::common;

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{Lockd, GUARD};
use lockd::connection::{Connection, Frame};
use lockd::proto::{self, ErrorCode, ProtoError, Reply, Request};
use lockd::server::Config;
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::runtime::Runtime;
use tokio::sync::Semaphore;

/// What `Connection` asks of the socket per read (its private `READ_CHUNK`).
const READ_CHUNK: usize = 512;

fn runtime() -> Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

// ---------------------------------------------------------------------------------------
// 1. Connection's framing against a reference framer.
// ---------------------------------------------------------------------------------------

/// proto.md's Framing rules, for a whole input at once: a line ends at `\n`, one `\r` before
/// it is dropped, a last line without `\n` still counts at end of input; a line over
/// `max_line` bytes is `TooLong` and nothing after it is framed (the stream is not trusted);
/// a line that is not UTF-8 is `BadUtf8` and framing goes on.
fn reference_frames(input: &[u8], max_line: usize) -> Vec<Frame> {
    let mut frames = Vec::new();
    let mut rest = input;
    while !rest.is_empty() {
        let (line, after) = match rest.iter().position(|&b| b == b'\n') {
            Some(end) => (&rest[..end], &rest[end + 1..]),
            None => (rest, &rest[rest.len()..]),
        };
        rest = after;
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.len() > max_line {
            frames.push(Frame::TooLong);
            return frames;
        }
        frames.push(match std::str::from_utf8(line) {
            Ok(text) => Frame::Line(text.to_owned()),
            Err(_) => Frame::BadUtf8,
        });
    }
    frames.push(Frame::Eof);
    frames
}

/// Frames up to and including the first `TooLong` or `Eof`: all that is compared, since
/// after `TooLong` the server closes the connection.
fn trusted(mut frames: Vec<Frame>) -> Vec<Frame> {
    if let Some(end) = frames
        .iter()
        .position(|f| matches!(f, Frame::TooLong | Frame::Eof))
    {
        frames.truncate(end + 1);
    }
    frames
}

/// Bytes that make framing interesting: line ends, lone `\r`, NUL, tab, a valid two-byte
/// character (`é`), its halves alone (invalid), an invalid byte, and plain text.
fn nasty_byte() -> impl Strategy<Value = u8> {
    prop_oneof![
        4 => Just(b'a'),
        2 => Just(b' '),
        1 => Just(b'\t'),
        2 => Just(b'\r'),
        2 => Just(b'\n'),
        1 => Just(0u8),
        1 => Just(0xc3u8),
        1 => Just(0xa9u8),
        1 => Just(0xffu8),
        1 => any::<u8>(),
    ]
}

fn line_end() -> impl Strategy<Value = &'static [u8]> {
    prop_oneof![
        Just(&b"\n"[..]),
        Just(&b"\r\n"[..]),
        Just(&b""[..]),
        Just(&b"\r"[..])
    ]
}

/// One piece of input: short nasty lines, raw bytes, a line right at the limit (one byte
/// either side included), or (if `over`) a line many times over it.
fn piece(max_line: usize, over: bool) -> impl Strategy<Value = Vec<u8>> {
    let short =
        (prop::collection::vec(nasty_byte(), 0..24), line_end()).prop_map(|(mut v, end)| {
            v.extend_from_slice(end);
            v
        });
    let raw = prop::collection::vec(any::<u8>(), 0..200);
    let near = if over { max_line + 2 } else { max_line };
    let at_limit = (max_line.saturating_sub(2)..=near, line_end()).prop_map(|(n, end)| {
        let mut v = vec![b'x'; n];
        v.extend_from_slice(end);
        v
    });
    let huge = (
        max_line * 2..=max_line * 20 + 2 * READ_CHUNK,
        any::<u8>(),
        line_end(),
    )
        .prop_map(|(n, fill, end)| {
            let fill = if fill == b'\n' { b'y' } else { fill };
            let mut v = vec![fill; n];
            v.extend_from_slice(end);
            v
        });
    if over {
        prop_oneof![4 => short, 2 => raw, 2 => at_limit, 1 => huge].boxed()
    } else {
        // Every line stays within the limit: cut the pieces into lines short enough.
        prop_oneof![6 => short, 1 => raw, 2 => at_limit]
            .prop_map(move |v| {
                v.chunks(max_line.max(1))
                    .flat_map(|line| line.iter().chain(b"\n"))
                    .copied()
                    .collect()
            })
            .boxed()
    }
}

/// A `max_line` (small ones make every rule fire with short inputs; 1024 is the default),
/// an input, and the sizes of the writes it is split into (used in turn, cyclically). Half
/// the inputs have a line over the limit somewhere; the other half are framed to the end.
fn framing_case() -> impl Strategy<Value = (usize, Vec<u8>, Vec<usize>)> {
    let max_line = prop_oneof![1 => 1usize..=8, 2 => 9usize..=80, 2 => Just(1024)];
    (max_line, any::<bool>()).prop_flat_map(|(max_line, over)| {
        let sizes = prop_oneof![1usize..=3, 1usize..=64, 1usize..=9000];
        (
            Just(max_line),
            (
                prop::collection::vec(piece(max_line, over), 0..16),
                any::<bool>(),
            )
                .prop_map(|(pieces, unterminated)| {
                    let mut input = pieces.concat();
                    // A last line without its newline, then end of input.
                    if unterminated && input.ends_with(b"\n") {
                        input.pop();
                    }
                    input
                }),
            prop::collection::vec(sizes, 1..8),
        )
    })
}

/// A connected pair on loopback: the framed server side and the raw client side.
async fn framed_pair(max_line: usize) -> (Connection, TcpStream) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (client, accepted) = tokio::join!(TcpStream::connect(addr), listener.accept());
    let client = client.expect("connect");
    client.set_nodelay(true).expect("nodelay");
    let (server, _) = accepted.expect("accept");
    (Connection::new(server, max_line), client)
}

/// Feeds `conn` the way `read_frame` does (every buffered frame first, then one read),
/// until `target` bytes in all have been read; records the frames and the fullest the input
/// buffer got right after a read.
struct Feeder {
    conn: Connection,
    received: usize,
    frames: Vec<Frame>,
    peak: usize,
}

impl Feeder {
    fn take_frames(&mut self) {
        while let Some(frame) = self.conn.next_frame() {
            let eof = frame == Frame::Eof;
            self.frames.push(frame);
            if eof {
                return;
            }
        }
    }

    /// One read, as `read_frame` makes when no frame is buffered; returns the bytes it added.
    async fn read_once(&mut self) -> usize {
        let before = self.conn.buffered();
        tokio::time::timeout(GUARD, self.conn.fill())
            .await
            .expect("read timed out")
            .expect("read");
        let after = self.conn.buffered();
        self.peak = self.peak.max(after);
        self.received += after - before;
        after - before
    }

    async fn read_until(&mut self, target: usize) {
        while self.received < target {
            self.take_frames();
            let n = self.read_once().await;
            assert!(n > 0, "end of input before all bytes arrived");
        }
    }

    /// Reads to end of input; the frames end with the first `Eof`.
    async fn read_to_eof(&mut self) {
        loop {
            self.take_frames();
            if self.frames.last() == Some(&Frame::Eof) {
                return;
            }
            self.read_once().await;
        }
    }
}

/// The most the input buffer may hold right after a read: a partial line of `max_line + 1`
/// bytes (one more could be the `\r` of its ending) and one [`READ_CHUNK`]. What matters most
/// is that it does not grow with the input.
fn input_bound(max_line: usize) -> usize {
    input_bound_tight(max_line)
}

/// The tight bound: what a partial line and one [`READ_CHUNK`] make.
fn input_bound_tight(max_line: usize) -> usize {
    max_line + 1 + READ_CHUNK
}

#[test]
fn framing_matches_the_reference_however_the_bytes_are_split() {
    let rt = runtime();
    let worst = AtomicU64::new(0);
    let config = ProptestConfig::with_cases(256);
    proptest!(config, |((max_line, input, sizes) in framing_case())| {
        let (frames, peak) = rt.block_on(async {
            let (conn, mut client) = framed_pair(max_line).await;
            let mut feeder = Feeder { conn, received: 0, frames: Vec::new(), peak: 0 };
            let mut sent = 0;
            for size in sizes.iter().cycle() {
                if sent == input.len() {
                    break;
                }
                let chunk = &input[sent..(sent + size).min(input.len())];
                sent += chunk.len();
                // Write one chunk and read exactly it before the next: every chunk boundary
                // is a boundary between reads (a read may still end inside a chunk).
                let (written, ()) = tokio::join!(client.write_all(chunk), feeder.read_until(sent));
                written.expect("write");
            }
            client.shutdown().await.expect("shutdown");
            feeder.read_to_eof().await;
            assert_eq!(feeder.received, input.len(), "every byte was read");
            (feeder.frames, feeder.peak)
        });
        worst.fetch_max((peak * 1000 / input_bound(max_line)) as u64, Ordering::Relaxed);
        prop_assert!(
            peak <= input_bound(max_line),
            "input buffer held {peak} bytes with max_line {max_line}"
        );
        prop_assert_eq!(trusted(frames), reference_frames(&input, max_line));
    });
    eprintln!(
        "fullest input buffer: {}‰ of the bound",
        worst.load(Ordering::Relaxed)
    );
}

/// A read asks the socket for one [`READ_CHUNK`] ("Bytes asked of the socket per read"), so
/// the input buffer holds at most a partial line and one chunk, however much waits in the
/// socket. (It used to read into all the spare capacity the buffer had grown to: with the
/// default limit, 2048 bytes after the third read.)
#[test]
fn one_read_takes_at_most_a_read_chunk() {
    let max_line = lockd::DEFAULT_MAX_LINE;
    let line = vec![b'x'; max_line + 1 + 2 * READ_CHUNK];
    runtime().block_on(async {
        let (conn, mut client) = framed_pair(max_line).await;
        // All of it waits in the socket before the first read.
        client.write_all(&line).await.expect("write");
        let mut feeder = Feeder {
            conn,
            received: 0,
            frames: Vec::new(),
            peak: 0,
        };
        while feeder.frames.is_empty() {
            feeder.take_frames();
            if feeder.frames.is_empty() {
                feeder.read_once().await;
                assert!(
                    feeder.peak <= input_bound_tight(max_line),
                    "one read left {} bytes buffered (max_line {max_line})",
                    feeder.peak
                );
            }
        }
        assert_eq!(feeder.frames, [Frame::TooLong]);
    });
}

/// The reference itself, on the cases proto.md spells out.
#[test]
fn reference_framer_follows_proto_md() {
    use Frame::*;
    let line = |s: &str| Line(s.to_owned());
    assert_eq!(
        reference_frames(b"PING\nPING\r\nPING", 8),
        [line("PING"), line("PING"), line("PING"), Eof]
    );
    assert_eq!(
        reference_frames(b"a\rb\n\r\n\r\r\n", 8),
        [line("a\rb"), line(""), line("\r"), Eof]
    );
    assert_eq!(
        reference_frames(b"\xff\nok\n", 8),
        [BadUtf8, line("ok"), Eof]
    );
    assert_eq!(
        reference_frames(b"12345678\r\n123456789\nPING\n", 8),
        [line("12345678"), TooLong]
    );
    assert_eq!(reference_frames(b"", 8), [Eof]);
}

// ---------------------------------------------------------------------------------------
// 2. A real server: one answer per request line.
// ---------------------------------------------------------------------------------------

/// What the server must send for one request line.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Answer {
    /// Exactly this line.
    Exact(String),
    /// One `OK ...` or `ERR <CODE> ...` line.
    One,
    /// `STATUS` without a name: `INFO` lines, then one `OK`/`ERR` line.
    Table,
    /// `STATUS <name> detail`: `HOLDER` and `WAITER` lines, then one `OK`/`ERR` line.
    Detail,
    /// Exactly this line, then the server closes the connection (`TOOLONG`, `QUIT`).
    Last(String),
}

/// A request line as sent: its bytes (no `\n` among them) and its ending.
#[derive(Clone, Debug)]
struct Sent {
    text: Vec<u8>,
    crlf: bool,
}

impl Sent {
    fn wire(&self) -> Vec<u8> {
        let mut v = self.text.clone();
        v.extend_from_slice(if self.crlf { b"\r\n" } else { b"\n" });
        v
    }

    /// The line as the server sees it: one `\r` before the `\n` is not part of it.
    fn seen(&self) -> &[u8] {
        if self.crlf {
            &self.text
        } else {
            self.text.strip_suffix(b"\r").unwrap_or(&self.text)
        }
    }
}

/// What proto.md promises for `line` (as the server sees it), with the server's `max_line`.
fn answer(line: &[u8], max_line: usize) -> Answer {
    if line.len() > max_line {
        return Answer::Last(Reply::Error(&ProtoError::too_long(max_line)).to_string());
    }
    let Ok(text) = std::str::from_utf8(line) else {
        return Answer::Exact(Reply::Error(&ProtoError::bad_utf8()).to_string());
    };
    match proto::parse(text) {
        Err(e) => Answer::Exact(Reply::Error(&e).to_string()),
        Ok(Request::Ping) => Answer::Exact("OK PONG".into()),
        Ok(Request::Quit) => Answer::Last("OK bye".into()),
        Ok(Request::Status { name: None }) => Answer::Table,
        Ok(Request::StatusDetail { .. }) => Answer::Detail,
        Ok(_) => Answer::One,
    }
}

/// Makes a generated case safe to answer without waiting: a `LOCK` of a name an earlier
/// `LOCK` of the case used (it could wait for the lease) and `WATCH` (it streams) become
/// `PING`. Deterministic, so proptest's shrinking sees the same case each time.
fn tame(connections: &mut [Vec<Sent>], max_line: usize) {
    let mut names = HashSet::new();
    for sent in connections.iter_mut().flatten() {
        let seen = sent.seen();
        if seen.len() > max_line {
            continue;
        }
        let Ok(request) = std::str::from_utf8(seen).map(proto::parse) else {
            continue;
        };
        let replace = match request {
            Ok(Request::Lock(req)) => !names.insert(req.name.to_string()),
            Ok(Request::Watch { .. }) => true,
            _ => false,
        };
        if replace {
            sent.text = b"PING".to_vec();
        }
    }
}

fn separator() -> impl Strategy<Value = &'static str> {
    prop_oneof![4 => Just(" "), 1 => Just("\t"), 1 => Just("  "), 1 => Just(" \t ")]
}

fn command() -> impl Strategy<Value = String> {
    prop_oneof![
        "(LOCK|lock|Lock)",
        "(UNLOCK|unlock)",
        "(RENEW|renew)",
        "(CHECK|check)",
        "(STATUS|status)",
        "(PING|ping)",
        "(HELP|help)",
        "(WATCH|watch)",
        "(AUTH|auth)",
        Just("QUIT".to_string()),
        "[A-Z]{1,6}",
    ]
}

/// Words, valid or not, biased towards ones that make real requests.
fn word() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        6 => "[a-d]{1,2}".prop_map(String::into_bytes),
        3 => "[0-9]{1,3}".prop_map(String::into_bytes),
        3 => option().prop_map(String::into_bytes),
        1 => "[0-9]{15,25}".prop_map(String::into_bytes),
        1 => any::<String>().prop_map(String::into_bytes),
        // Control characters (no `\n`: that would end the line) and invalid UTF-8.
        1 => prop::collection::vec(
            prop_oneof![0u8..=9, 11u8..=31, Just(0x7f), 0x80u8..=0xff],
            1..8
        ),
    ]
}

fn option() -> impl Strategy<Value = String> {
    prop_oneof![
        "(ttl|TTL|wait)=(0|1ms|50ms|2s|1m|-1|x|99999h)",
        Just("session".to_string()),
        "session=(0|1s|x)",
        Just("detach".to_string()),
        Just("shared".to_string()),
        "limit=(0|1|3|x)",
        Just("detail".to_string()),
    ]
}

/// A well-formed request (it may still be refused: a bad option value, a token not held).
fn valid_words() -> impl Strategy<Value = Vec<String>> {
    let name = "[a-d]{1,2}";
    let token = (1u64..40).prop_map(|t| t.to_string());
    prop_oneof![
        3 => (name, "[a-z]{1,3}", prop::collection::vec(option(), 0..3)).prop_map(
            |(name, id, opts)| [vec!["LOCK".into(), name, id], opts].concat()
        ),
        1 => (name, token.clone()).prop_map(|(n, t)| vec!["UNLOCK".into(), n, t]),
        1 => (name, token.clone(), prop::option::of("ttl=(1s|1m)"))
            .prop_map(|(n, t, ttl)| [vec!["RENEW".into(), n, t], ttl.into_iter().collect()].concat()),
        1 => (name, token).prop_map(|(n, t)| vec!["CHECK".into(), n, t]),
        1 => Just(vec!["STATUS".to_string()]),
        1 => name.prop_map(|n| vec!["STATUS".into(), n]),
        1 => name.prop_map(|n| vec!["STATUS".into(), n, "detail".into()]),
        1 => Just(vec!["PING".to_string()]),
        1 => Just(vec!["HELP".to_string()]),
        1 => ("[a-z]{1,3}", "[a-z0-9]{1,8}").prop_map(|(u, s)| vec!["AUTH".into(), u, s]),
    ]
}

/// Joins words with runs of spaces and tabs, in any case for the command.
fn joined(words: Vec<Vec<u8>>, seps: Vec<&str>, lower: bool, tail: &str) -> Vec<u8> {
    let mut text = Vec::new();
    for (i, w) in words.into_iter().enumerate() {
        if i > 0 {
            text.extend_from_slice(seps.get(i % seps.len().max(1)).unwrap_or(&" ").as_bytes());
        }
        if i == 0 && lower {
            text.extend(w.to_ascii_lowercase());
        } else {
            text.extend(w);
        }
    }
    text.extend_from_slice(tail.as_bytes());
    text
}

fn request_line(max_line: usize) -> impl Strategy<Value = Sent> {
    let seps = || prop::collection::vec(separator(), 1..4);
    let tail = || prop_oneof![4 => Just(""), 1 => Just(" "), 1 => Just("\r"), 1 => Just("\t")];
    let valid =
        (valid_words(), seps(), any::<bool>(), tail()).prop_map(|(words, seps, lower, tail)| {
            joined(
                words.into_iter().map(String::into_bytes).collect(),
                seps,
                lower,
                tail,
            )
        });
    let words = (
        command(),
        prop::collection::vec(word(), 0..6),
        seps(),
        tail(),
    )
        .prop_map(|(command, mut words, seps, tail)| {
            words.insert(0, command.into_bytes());
            joined(words, seps, false, tail)
        });
    // A huge word: around the limit, or well over it.
    let huge = (
        command(),
        prop_oneof![
            max_line.saturating_sub(12)..=max_line + 4,
            max_line..=max_line * 3
        ],
    )
        .prop_map(|(command, n)| {
            joined(
                vec![command.into_bytes(), vec![b'w'; n]],
                vec![" "],
                false,
                "",
            )
        });
    let junk = prop::collection::vec(any::<u8>(), 0..64);
    let text = prop_oneof![8 => valid, 5 => words, 1 => huge, 1 => junk];
    (text, any::<bool>()).prop_map(|(mut text, crlf)| {
        for b in &mut text {
            if *b == b'\n' {
                *b = b'?';
            }
        }
        Sent { text, crlf }
    })
}

/// How one connection sends its lines.
#[derive(Clone, Copy, Debug)]
enum Pace {
    /// Everything at once, in writes of the given sizes.
    Pipelined,
    /// Each line (still split into writes) only after the previous one was answered.
    OneByOne,
}

#[derive(Clone, Debug)]
struct ServerCase {
    max_line: usize,
    connections: Vec<(Pace, Vec<Sent>, Vec<usize>)>,
}

fn server_case() -> impl Strategy<Value = ServerCase> {
    prop_oneof![Just(40usize), Just(200), Just(1024)].prop_flat_map(|max_line| {
        let pace = prop_oneof![Just(Pace::Pipelined), Just(Pace::OneByOne)];
        let sizes =
            prop::collection::vec(prop_oneof![1usize..=4, 1usize..=300, 1usize..=5000], 1..6);
        let connection = (
            pace,
            prop::collection::vec(request_line(max_line), 0..32),
            sizes,
        );
        prop::collection::vec(connection, 1..=3).prop_map(move |mut connections| {
            let mut lines: Vec<Vec<Sent>> = connections.iter().map(|c| c.1.clone()).collect();
            tame(&mut lines, max_line);
            for (c, lines) in connections.iter_mut().zip(lines) {
                c.1 = lines;
            }
            ServerCase {
                max_line,
                connections,
            }
        })
    })
}

/// Writes `bytes` in writes of `sizes` (in turn, cyclically), letting the server run between
/// them. Errors are returned: after a close, the server may reset the rest.
async fn write_split(w: &mut OwnedWriteHalf, bytes: &[u8], sizes: &[usize]) -> std::io::Result<()> {
    let mut at = 0;
    for size in sizes.iter().cycle() {
        if at == bytes.len() {
            break;
        }
        let end = (at + size).min(bytes.len());
        w.write_all(&bytes[at..end]).await?;
        at = end;
        tokio::task::yield_now().await;
    }
    Ok(())
}

async fn send_all(
    mut w: OwnedWriteHalf,
    pace: Pace,
    lines: Vec<Sent>,
    sizes: Vec<usize>,
    answered: Arc<Semaphore>,
) {
    let written = match pace {
        Pace::Pipelined => {
            let bytes: Vec<u8> = lines.iter().flat_map(Sent::wire).collect();
            write_split(&mut w, &bytes, &sizes).await
        }
        Pace::OneByOne => {
            async {
                for sent in &lines {
                    write_split(&mut w, &sent.wire(), &sizes).await?;
                    // Closed (the reader gave up, or the server closed): stop sending.
                    let Ok(permit) = answered.acquire().await else {
                        break;
                    };
                    permit.forget();
                }
                Ok::<(), std::io::Error>(())
            }
            .await
        }
    };
    if written.is_ok() {
        let _ = w.shutdown().await;
    }
}

/// Reads one reply line; `None` at a clean end of the connection.
async fn reply_line(r: &mut BufReader<OwnedReadHalf>) -> Result<Option<String>, TestCaseError> {
    let mut buf = Vec::new();
    let n = tokio::time::timeout(GUARD, r.read_until(b'\n', &mut buf))
        .await
        .map_err(|_| TestCaseError::fail("no reply within the guard"))?
        .map_err(|e| TestCaseError::fail(format!("read failed: {e}")))?;
    if n == 0 {
        return Ok(None);
    }
    prop_assert_eq!(buf.pop(), Some(b'\n'), "a reply line ends with \\n");
    String::from_utf8(buf)
        .map(Some)
        .map_err(|e| TestCaseError::fail(format!("reply is not UTF-8: {e}")))
}

/// A line that must come: part of answer `i`.
async fn owed_line(
    r: &mut BufReader<OwnedReadHalf>,
    i: usize,
    want: &Answer,
) -> Result<String, TestCaseError> {
    reply_line(r).await?.ok_or_else(|| {
        TestCaseError::fail(format!("connection ended before answer {i} ({want:?})"))
    })
}

/// `OK`, `OK ...` or `ERR <CODE> <message>` with one of proto.md's codes.
fn check_final(line: &str) -> Result<(), TestCaseError> {
    if line == "OK" || line.starts_with("OK ") {
        return Ok(());
    }
    let mut words = line.splitn(3, ' ');
    prop_assert_eq!(
        words.next(),
        Some("ERR"),
        "{:?} is neither OK nor ERR",
        line
    );
    let code = words.next().unwrap_or("");
    prop_assert!(
        ErrorCode::parse(code).is_some(),
        "unknown code in {:?}",
        line
    );
    prop_assert!(
        words.next().is_some_and(|m| !m.is_empty()),
        "no message in {:?}",
        line
    );
    Ok(())
}

/// Reads and checks the answers of one connection, in order; then the connection must end
/// cleanly with nothing more.
async fn read_answers(
    mut r: BufReader<OwnedReadHalf>,
    answers: Vec<Answer>,
    answered: Arc<Semaphore>,
) -> Result<(), TestCaseError> {
    let result = async {
        for (i, want) in answers.iter().enumerate() {
            match want {
                Answer::Exact(line) | Answer::Last(line) => {
                    prop_assert_eq!(&owed_line(&mut r, i, want).await?, line, "answer {}", i)
                }
                Answer::One => check_final(&owed_line(&mut r, i, want).await?)?,
                Answer::Table | Answer::Detail => loop {
                    let line = owed_line(&mut r, i, want).await?;
                    let extra: &[&str] = match want {
                        Answer::Table => &["INFO "],
                        _ => &["HOLDER ", "WAITER "],
                    };
                    if !extra.iter().any(|p| line.starts_with(p)) {
                        check_final(&line)?;
                        break;
                    }
                },
            }
            if matches!(want, Answer::Last(_)) {
                break;
            }
            answered.add_permits(1);
        }
        match reply_line(&mut r).await? {
            None => Ok(()),
            Some(extra) => Err(TestCaseError::fail(format!("unasked-for line {extra:?}"))),
        }
    }
    .await;
    answered.close();
    result
}

/// The answers owed for `lines`: up to and including the first that closes the connection.
fn answers_for(lines: &[Sent], max_line: usize) -> Vec<Answer> {
    let mut answers = Vec::new();
    for sent in lines {
        let a = answer(sent.seen(), max_line);
        let last = matches!(a, Answer::Last(_));
        answers.push(a);
        if last {
            break;
        }
    }
    answers
}

#[test]
fn every_request_line_gets_exactly_its_answer() {
    let rt = runtime();
    let config = ProptestConfig::with_cases(96);
    proptest!(config, |(case in server_case())| {
        rt.block_on(async {
            let server = Lockd::new().config(Config {
                max_line: case.max_line,
                shutdown_grace: Duration::from_secs(2),
                ..Config::default()
            }).serve()
            .await;
            let mut tasks = Vec::new();
            for (pace, mut lines, sizes) in case.connections.clone() {
                let stream = TcpStream::connect(server.addr).await.expect("connect");
                stream.set_nodelay(true).expect("nodelay");
                let (r, w) = stream.into_split();
                let answered = Arc::new(Semaphore::new(0));
                let answers = answers_for(&lines, case.max_line);
                // Nothing after a line that ends the connection: the server would only
                // drain it, for a bounded time, and a slow sender could outlast that.
                lines.truncate(answers.len());
                tokio::spawn(send_all(w, pace, lines, sizes, Arc::clone(&answered)));
                tasks.push(tokio::spawn(read_answers(BufReader::new(r), answers, answered)));
            }
            for task in tasks {
                task.await.expect("reader task")?;
            }
            let mut c = server.raw().await;
            prop_assert_eq!(c.req("PING").await, "OK PONG", "the server still serves");
            drop(c);
            server.shutdown().await;
            Ok::<(), TestCaseError>(())
        })?;
    });
}

#[test]
fn answers_follow_proto_md() {
    let seen = |text: &[u8], crlf| {
        Sent {
            text: text.to_vec(),
            crlf,
        }
        .seen()
        .to_vec()
    };
    assert_eq!(seen(b"PING\r", false), b"PING");
    assert_eq!(seen(b"PING\r", true), b"PING\r");
    assert_eq!(answer(b"PING", 8), Answer::Exact("OK PONG".into()));
    assert_eq!(answer(b"status", 8), Answer::Table);
    assert_eq!(answer(b"STATUS a detail", 80), Answer::Detail);
    assert_eq!(answer(b"quit", 8), Answer::Last("OK bye".into()));
    assert!(matches!(answer(b"123456789", 8), Answer::Last(l) if l.starts_with("ERR TOOLONG ")));
    assert!(matches!(answer(b"\xff", 8), Answer::Exact(l) if l.starts_with("ERR ENCODING ")));
    assert!(matches!(answer(b"", 8), Answer::Exact(l) if l.starts_with("ERR SYNTAX ")));
    assert_eq!(answer(b"LOCK a b", 80), Answer::One);
    let mut lines = vec![vec![
        Sent {
            text: b"LOCK a me".to_vec(),
            crlf: false,
        },
        Sent {
            text: b"lock\ta  you wait=1m".to_vec(),
            crlf: true,
        },
        Sent {
            text: b"WATCH".to_vec(),
            crlf: false,
        },
    ]];
    tame(&mut lines, 80);
    let texts: Vec<&[u8]> = lines[0].iter().map(|s| &s.text[..]).collect();
    assert_eq!(texts, [&b"LOCK a me"[..], b"PING", b"PING"]);
}

// ---------------------------------------------------------------------------------------
// 3. Memory of the real binary under a blast of bad input.
// ---------------------------------------------------------------------------------------

/// Connections in the blast, and the bytes each tries to send.
const BLAST_CONNECTIONS: usize = 200;
const BLAST_BYTES: usize = 1 << 20;
/// Resident memory the blast may add on top of an idle lockd: about 100 KiB per connection,
/// generous (it adds under 2 MiB in all), yet a lockd that buffered each endless line up to
/// its end would add several times this much (up to 100 MiB).
const BLAST_RSS_GROWTH_KIB: u64 = 20 * 1024;

/// A small xorshift generator: random bytes without a crate or a seed to log (the bytes
/// only need to be arbitrary, not reproducible per run).
fn random_bytes(seed: u64, n: usize) -> Vec<u8> {
    let mut x = seed | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Most of the replies a blasting connection keeps to check.
const BLAST_KEEP: usize = 64 * 1024;

/// One blasting connection: sends `bytes` (stopping when the server closes) while reading
/// whatever comes back, so the server is never held up by an unread reply. Returns the
/// first [`BLAST_KEEP`] bytes of replies.
async fn blast_one(addr: std::net::SocketAddr, bytes: Arc<Vec<u8>>) -> Vec<u8> {
    let stream = TcpStream::connect(addr).await.expect("connect");
    let (mut r, mut w) = stream.into_split();
    let send = async move {
        for chunk in bytes.chunks(64 * 1024) {
            if w.write_all(chunk).await.is_err() {
                return;
            }
        }
        let _ = w.shutdown().await;
    };
    let receive = async move {
        let mut kept = Vec::new();
        let mut buf = vec![0u8; 16 * 1024];
        // Until the end, or a reset once the server gives up draining what we send.
        while let Ok(n @ 1..) = r.read(&mut buf).await {
            let room = BLAST_KEEP.saturating_sub(kept.len());
            kept.extend_from_slice(&buf[..n.min(room)]);
        }
        kept
    };
    tokio::join!(send, receive).1
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blast_of_huge_lines_and_random_bytes_keeps_memory_bounded() {
    let lockd = Lockd::new().spawn();
    let mut c = lockd.raw().await;
    assert_eq!(c.req("PING").await, "OK PONG");
    let idle = lockd.rss_kib();

    let endless = Arc::new(vec![b'x'; BLAST_BYTES]);
    let random: Vec<Arc<Vec<u8>>> = (0..8)
        .map(|i| Arc::new(random_bytes(0x9e37_79b9 + i, BLAST_BYTES)))
        .collect();
    let blast: Vec<_> = (0..BLAST_CONNECTIONS)
        .map(|i| {
            let bytes = if i % 2 == 0 {
                Arc::clone(&endless)
            } else {
                Arc::clone(&random[i % random.len()])
            };
            tokio::spawn(blast_one(lockd.addr, bytes))
        })
        .collect();

    let mut peak = idle;
    let all = async {
        let mut replies = Vec::new();
        for task in blast {
            replies.push(task.await.expect("blast task"));
        }
        replies
    };
    tokio::pin!(all);
    let replies = tokio::time::timeout(GUARD * 3, async {
        loop {
            tokio::select! {
                replies = &mut all => break replies,
                () = tokio::time::sleep(Duration::from_millis(20)) => {
                    peak = peak.max(lockd.rss_kib());
                }
            }
        }
    })
    .await
    .expect("the blast did not end");
    for (i, replies) in replies.iter().enumerate() {
        // Whole lines only: the kept bytes, or a reset, may cut the last one short.
        let whole = replies
            .iter()
            .rposition(|&b| b == b'\n')
            .map_or(0, |p| p + 1);
        let text = String::from_utf8_lossy(&replies[..whole]);
        let mut lines = text.lines();
        if i % 2 == 0 {
            let first = lines.next().unwrap_or("");
            assert!(
                first.starts_with("ERR TOOLONG "),
                "endless line got {first:?}"
            );
        }
        for line in lines {
            assert!(
                line.starts_with("ERR ") || line.starts_with("OK"),
                "random bytes got {line:?}"
            );
        }
    }
    peak = peak.max(lockd.rss_kib());
    eprintln!("lockd RSS: idle {idle} KiB, peak {peak} KiB during the blast");
    assert!(
        peak < idle + BLAST_RSS_GROWTH_KIB,
        "RSS grew from {idle} KiB to {peak} KiB"
    );
    assert_eq!(
        c.req("PING").await,
        "OK PONG",
        "the old connection still serves"
    );
    let mut fresh = lockd.raw().await;
    assert_eq!(
        fresh.req("PING").await,
        "OK PONG",
        "a new connection is served"
    );
}
