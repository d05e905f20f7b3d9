// A client of lockd's line protocol (proto.md) for Node, with no dependencies (node:net,
// node:tls): locks with leases and fencing tokens, renewals, STATUS and WATCH read into
// objects, failover across a cluster's front-ends, TLS and AUTH, and withLock, which runs a
// function under the lock, renews in the background and aborts the function's AbortSignal the
// moment the lease can no longer be trusted. Durations are milliseconds. Types: lockd.d.ts.

import net from "node:net";
import tls from "node:tls";
import fs from "node:fs";
import os from "node:os";
import { performance } from "node:perf_hooks";

export const DEFAULT_ADDR = "127.0.0.1:5001";
export const DEFAULT_TTL = 30000;
export const DEFAULT_GRACE = 10000;
const MAX_REPLY = 64 * 1024;

/**
 * An ERR reply: `code` is the protocol's word (TIMEOUT, NOTHELD, UNAVAILABLE, ...). A waiting
 * lock() whose place a newer `supersede` LOCK of another id took fails with code SUPERSEDED
 * (`e instanceof LockdError && e.code === "SUPERSEDED"`; its connection stays usable).
 */
export class LockdError extends Error {
  constructor(code, message) {
    super(message ? `ERR ${code} ${message}` : `ERR ${code}`);
    this.name = "LockdError";
    this.code = code;
    this.detail = message;
  }
}

/** No connection to lockd, or no reply from it. `final`: trying again would fail alike (TLS). */
export class ConnectionError extends Error {
  constructor(message, final = false) {
    super(message);
    this.name = "ConnectionError";
    this.final = final;
  }
}

/** The lease ended while withLock's function ran: its work is no longer exclusive. */
export class LeaseLost extends Error {
  constructor(name, token, reason) {
    super(`lease on ${name} (token ${token}) lost: ${reason}`);
    this.name = "LeaseLost";
    this.lock = name;
    this.token = token;
    this.reason = reason;
  }
}

function word(what, v) {
  if (typeof v !== "string" || !v || Buffer.byteLength(v) > 255 || /[\s\x00-\x1f\x7f]/.test(v)) {
    throw new TypeError(`${what} must be 1 to 255 bytes without whitespace or control characters: ${JSON.stringify(v)}`);
  }
  return v;
}

// A note as LOCK sends it: printable text (no control character: a newline would end the
// request), trailing blanks dropped as the server drops them; "" for none.
function noteOption(note) {
  if (note === undefined || note === null) return "";
  if (typeof note !== "string") throw new TypeError(`a note is a string, not ${JSON.stringify(note)}`);
  if (/[\x00-\x1f\x7f-\x9f]/.test(note)) throw new TypeError(`note ${JSON.stringify(note)} has a control character; a note is printable text`);
  const text = note.replace(/ +$/, "");
  return text ? ` note=${text}` : "";
}

/**
 * A note= field of a reply or event, decoded (%XX are bytes, then UTF-8: proto.md, Notes);
 * undefined without one, or for one that is not such an encoding (rather than guess).
 */
function decodeNote(value) {
  if (value === undefined) return undefined;
  const bytes = [];
  for (let i = 0; i < value.length; ) {
    if (value[i] === "%") {
      const hex = value.slice(i + 1, i + 3);
      if (!/^[0-9A-Fa-f]{2}$/.test(hex)) return undefined;
      bytes.push(parseInt(hex, 16));
      i += 3;
    } else {
      const c = value.charCodeAt(i);
      if (c > 0x7f) return undefined; // never sent raw: encoded, every byte outside ASCII is %XX
      bytes.push(c);
      i += 1;
    }
  }
  try {
    return new TextDecoder("utf-8", { fatal: true }).decode(Uint8Array.from(bytes));
  } catch {
    return undefined;
  }
}

function retryable(e) {
  if (e instanceof ConnectionError) return !e.final;
  return e instanceof LockdError && (e.code === "UNAVAILABLE" || e.code === "SHUTDOWN");
}

const sleep = (ms, signal) =>
  new Promise((resolve) => {
    const t = setTimeout(done, Math.max(0, ms));
    function done() {
      clearTimeout(t);
      signal?.removeEventListener("abort", done);
      resolve();
    }
    signal?.addEventListener("abort", done, { once: true });
  });

/** One socket and the reply lines read from it. */
class Conn {
  constructor(sock) {
    this.sock = sock;
    this.buf = "";
    this.lines = [];
    this.error = null;
    this.wake = null;
    sock.setEncoding("utf8");
    sock.on("data", (d) => {
      this.buf += d;
      let i;
      while ((i = this.buf.indexOf("\n")) >= 0) {
        this.lines.push(this.buf.slice(0, i).replace(/\r$/, ""));
        this.buf = this.buf.slice(i + 1);
      }
      if (this.buf.length > MAX_REPLY) this.fail(new ConnectionError("over-long reply line"));
      this.notify();
    });
    sock.on("error", (e) => this.fail(e));
    sock.on("close", () => this.fail(new ConnectionError("lockd closed the connection")));
  }

  fail(e) {
    if (!this.error) this.error = e instanceof ConnectionError ? e : new ConnectionError(e.message);
    this.sock.destroy();
    this.notify();
  }

  notify() {
    const w = this.wake;
    this.wake = null;
    if (w) w();
  }

  /** The next line, within `limit` ms (none if 0) and until `signal` aborts. */
  async readLine(limit, signal) {
    for (;;) {
      if (this.lines.length) return this.lines.shift();
      if (this.error) throw this.error;
      await new Promise((resolve, reject) => {
        let timer;
        const cleanup = () => {
          clearTimeout(timer);
          signal?.removeEventListener("abort", onAbort);
          this.wake = null;
        };
        const onAbort = () => {
          cleanup();
          reject(signal.reason ?? new Error("aborted"));
        };
        this.wake = () => {
          cleanup();
          resolve();
        };
        if (limit > 0) {
          timer = setTimeout(() => {
            cleanup();
            reject(new ConnectionError(`no reply within ${limit}ms`));
          }, limit);
        }
        if (signal?.aborted) return onAbort();
        signal?.addEventListener("abort", onAbort, { once: true });
      });
    }
  }
}

function readSecret(file) {
  return fs.readFileSync(file, "utf8").split("\n", 1)[0].replace(/\r$/, "");
}

let nextId = 0;

/**
 * A new holder's id: `<hostname>:<pid>:<n>`, n counting in this process. A Client made without
 * an id sends each LOCK (each withLock) with a new one, kept across that LOCK's own resends.
 */
export function defaultId() {
  nextId += 1;
  return `${os.hostname() || "localhost"}:${process.pid}:${nextId}`;
}

/**
 * A connection to lockd, opened on first use and again after a failure. Requests run one at a
 * time (a waiting LOCK holds it): give each concurrent waiter its own Client, or clone().
 */
export class Client {
  constructor(options = {}) {
    const env = process.env;
    this.options = options;
    const addrs = options.addrs ?? (env.LOCKD_ADDR ? env.LOCKD_ADDR.split(",") : [DEFAULT_ADDR]);
    this.addrs = (typeof addrs === "string" ? addrs.split(",") : addrs).map((a) => {
      const m = /^(\[[^\]]+\]|[^:\s]+):(\d+)$/.exec(a);
      if (!m) throw new TypeError(`address must be host:port, not ${JSON.stringify(a)}`);
      return { text: a, host: m[1].replace(/^\[|\]$/g, ""), port: Number(m[2]) };
    });
    // Without an id, each LOCK takes a new one (defaultId()): the same id is the same client
    // to lockd (a LOCK again is a retry, answered with the same grant), so two holders in one
    // process (async tasks, Clients, withLock calls) never share one.
    this.id = options.id == null ? undefined : word("id", options.id);
    this.timeout = options.timeout ?? 10000;
    const ca = options.ca ?? (options.tls === false ? undefined : env.LOCKD_TLS_CA);
    const cert = options.cert ?? (options.tls === false ? undefined : env.LOCKD_CLIENT_CERT);
    const key = options.key ?? (options.tls === false ? undefined : env.LOCKD_CLIENT_KEY);
    this.tls = options.tls || ca || cert ? { ca: ca && fs.readFileSync(ca), cert: cert && fs.readFileSync(cert), key: key && fs.readFileSync(key) } : null;
    this.user = options.user ?? env.LOCKD_USER;
    let secret = options.secret;
    let file = options.secretFile;
    if (secret === undefined && file === undefined) [secret, file] = [env.LOCKD_SECRET, env.LOCKD_SECRET_FILE];
    if (secret && file) throw new TypeError("the secret is given twice: give it one way");
    if (file) secret = readSecret(file);
    if (this.user && !secret) throw new TypeError(`user ${this.user} needs a secret`);
    if (secret && !this.user) throw new TypeError("a secret without a user");
    if (this.user) word("user", this.user), word("secret", secret);
    Object.defineProperty(this, "secret", { value: secret, enumerable: false });
    this.conn = null;
    this.at = 0;
    this.start = 0;
    this.queue = Promise.resolve();
  }

  /** A Client with the same options and a connection of its own. */
  clone() {
    return new Client({ ...this.options, id: this.id, secret: this.secret, secretFile: undefined, user: this.user });
  }

  /** Closes the connection (ending its session leases); the next request reconnects. */
  close() {
    this.drop(false);
  }

  drop(failed) {
    if (this.conn) {
      this.conn.sock.destroy();
      if (failed) this.start = this.at + 1;
    }
    this.conn = null;
  }

  open(addr) {
    return new Promise((resolve, reject) => {
      const opts = { host: addr.host, port: addr.port };
      const sock = this.tls
        ? tls.connect({ ...opts, ...this.tls, servername: net.isIP(addr.host) ? undefined : addr.host, minVersion: "TLSv1.2" })
        : net.connect(opts);
      const timer = setTimeout(() => sock.destroy(new Error("connection attempt timed out")), this.timeout);
      sock.once(this.tls ? "secureConnect" : "connect", () => {
        clearTimeout(timer);
        sock.removeAllListeners("error");
        sock.setNoDelay(true);
        resolve(new Conn(sock));
      });
      sock.once("error", (e) => {
        clearTimeout(timer);
        // A TLS failure is the configuration's: every front-end would refuse it alike.
        const final = this.tls && (e.code?.startsWith?.("ERR_TLS") || /certificate|SSL|alert/i.test(`${e.code} ${e.message}`));
        reject(new ConnectionError(`${addr.text}: ${e.message}`, Boolean(final)));
      });
    });
  }

  async dial(signal) {
    const failed = [];
    for (let k = 0; k < this.addrs.length; k++) {
      const i = (this.start + k) % this.addrs.length;
      let conn;
      try {
        conn = await this.open(this.addrs[i]);
      } catch (e) {
        if (e.final) throw e;
        failed.push(e.message);
        continue;
      }
      this.conn = conn;
      this.at = this.start = i;
      if (!this.user) return;
      conn.sock.write(`AUTH ${this.user} ${this.secret}\n`);
      let reply;
      try {
        reply = await conn.readLine(this.timeout, signal);
      } catch (e) {
        this.drop(true);
        throw e;
      }
      if (reply.startsWith("OK") || reply.startsWith("ERR DENIED authentication is off") || reply.startsWith(`ERR DENIED already authenticated as ${this.user};`)) return;
      this.drop(false);
      const e = parseErr(reply);
      if (e) throw new LockdError(e.code, `lockd at ${this.addrs[i].text} refused to log in user ${this.user}: ${e.detail}`);
      throw new ConnectionError(`unexpected reply to AUTH: ${reply}`);
    }
    throw new ConnectionError(`cannot connect to lockd at ${failed.join("; nor at ")}`);
  }

  /** Sends `line`, returns the text after OK or throws the ERR; `read` reads a many-line answer. */
  request(line, { limit = this.timeout, signal, read } = {}) {
    const run = this.queue.then(async () => {
      if (!this.conn) await this.dial(signal);
      const conn = this.conn;
      let reply;
      try {
        conn.sock.write(line + "\n");
        reply = await conn.readLine(limit, signal);
        if (read) reply = await read(reply, (l) => conn.readLine(this.timeout, signal));
      } catch (e) {
        this.drop(true); // a reply may still come: it must not answer a later request
        throw e;
      }
      if (reply === "OK" || reply.startsWith("OK ")) return reply.slice(3);
      const e = parseErr(reply);
      if (!e) {
        this.drop(true);
        throw new ConnectionError(`unexpected reply ${JSON.stringify(reply)}`);
      }
      if (["TOOLONG", "LAGGED", "SHUTDOWN", "TLS"].includes(e.code)) this.drop(true);
      throw e;
    });
    this.queue = run.catch(() => {});
    return run;
  }

  async connect({ signal } = {}) {
    await this.request("PING", { signal });
  }

  /**
   * LOCK: the fencing token, after waiting in the FIFO queue while the lock is held. Options:
   * ttl, wait (0 tries once), session (true, or with grace ms), detach (the default), plain,
   * shared, limit, signal (aborting it ends the wait), and:
   * - note: a text for people ("release 1.4.2 by ci job 8812"), kept with the holder and shown
   *   by status() and detail() (`note`) and WATCH's acquired events; printable (a control
   *   character is a TypeError), at most the server's --max-note bytes (else BADARG); "" is none.
   *   A repeat LOCK of the same id with a note replaces the holder's note, without one keeps it.
   * - supersede: newest wins. If the LOCK must wait, every request waiting on the name is
   *   answered ERR SUPERSEDED (their lock() rejects with a LockdError of that code; one of this
   *   same id, REPLACED) and this one waits alone at the head of the queue; the holder keeps
   *   the lock. Granted at once when the lock is free, as without it.
   * - and: further names of a set (proto.md, "Several names at once"), taken with `name` all
   *   at once or not at all, as one lease: every other option applies to each name, and a
   *   renew, check or unlock of any one of them, with the token given for it, applies to the
   *   whole set; a refusal of any name refuses the set and changes nothing. lock() resolves to
   *   the first name's token, lockTokens() to every name's. Not with supersede.
   * A LOCK whose connection is lost or that is answered ERR UNAVAILABLE or SHUTDOWN is sent
   * again, same id, through the next address, for the rest of its wait.
   */
  async lock(name, options = {}) {
    return (await this.lockTokens(name, options))[0];
  }

  /**
   * lock(), resolving to every name's token: `name`'s first, then those of `and` in their
   * order (one for a LOCK of one name). Fence a write to each resource with the token given
   * for its name, and assume nothing about how they compare (today they are one number).
   */
  async lockTokens(name, { ttl, wait, session, grace, detach, plain, shared, limit, supersede, note, and: also = [], signal } = {}) {
    word("name", name);
    if (!Array.isArray(also)) throw new TypeError(`and is a list of names, not ${JSON.stringify(also)}`);
    for (const n of also) word("name", n);
    if (shared && limit !== undefined) throw new TypeError("shared and limit exclude each other");
    if (supersede && also.length) throw new TypeError("supersede takes one name, not a set (and)");
    const noteText = noteOption(note);
    const head = `LOCK ${name} ${this.id ?? defaultId()}` + (ttl !== undefined ? ` ttl=${Math.round(ttl)}ms` : "");
    let tail = session ? ` session=${Math.round(grace ?? (typeof session === "number" ? session : 0))}ms` : plain ? "" : " detach";
    if (shared) tail += " shared";
    else if (limit !== undefined) tail += ` limit=${limit}`;
    if (supersede) tail += " supersede";
    for (const n of also) tail += ` and=${n}`;
    tail += noteText; // last: note= takes the rest of the line
    const until = wait === undefined ? null : performance.now() + wait;
    for (let tries = 1; ; tries++) {
      let line = head;
      let replyLimit = 0;
      if (until !== null) {
        const left = Math.max(0, Math.round(until - performance.now()));
        line += ` wait=${left}ms`;
        replyLimit = left + this.timeout;
      }
      try {
        const rest = await this.request(line + tail, { limit: replyLimit, signal });
        // OK <token> [<token2> ...]: one per name, in the request's order.
        const tokens = rest.split(" ");
        if (tokens.length !== 1 + also.length || !tokens.every((t) => /^\d+$/.test(t))) throw new ConnectionError(`unexpected reply to LOCK: ${rest}`);
        return tokens.map(Number);
      } catch (e) {
        const outOfTime = until !== null && performance.now() >= until;
        if (!retryable(e) || signal?.aborted || outOfTime || (this.addrs.length < 2 && until === null) || tries > 4 * this.addrs.length) throw e;
        // This front-end can't serve it now (UNAVAILABLE, SHUTDOWN): the next one may.
        if (e instanceof LockdError) this.drop(true);
        await sleep(50 * tries, signal);
      }
    }
  }

  async unlock(name, token, { signal } = {}) {
    await this.request(`UNLOCK ${word("name", name)} ${token}`, { signal });
  }

  /** RENEW: the ms the lease has left; LockdError NOTHELD if it is gone (stop: the lock is lost). */
  async renew(name, token, { ttl, signal } = {}) {
    const line = `RENEW ${word("name", name)} ${token}` + (ttl ? ` ttl=${Math.round(ttl)}ms` : "");
    return leftMs(await this.request(line, { signal }));
  }

  async check(name, token, { signal } = {}) {
    return leftMs(await this.request(`CHECK ${word("name", name)} ${token}`, { signal }));
  }

  /** STATUS <name>: `{name, free: true}` or the first holder, waiters, holders, mode and note (decoded; absent without one). */
  async status(name, { signal } = {}) {
    return parseStatus(await this.request(`STATUS ${word("name", name)}`, { signal }));
  }

  /** STATUS: every held lock this user may read, sorted by name. */
  async statusAll({ signal } = {}) {
    const held = [];
    await this.request("STATUS", {
      signal,
      read: async (line, next) => {
        while (line.startsWith("INFO ")) {
          held.push(parseStatus(line.slice(5)));
          line = await next();
        }
        return line;
      },
    });
    return held;
  }

  /**
   * STATUS <name> detail: `{status, holders, waiters}`, holders in grant order (each with its
   * own note), waiters in queue order; each holder's and waiter's `and` lists the other names
   * of its set (its and= fields, in its LOCK's order), [] for one name.
   */
  async detail(name, { signal } = {}) {
    const holders = [];
    const waiters = [];
    const rest = await this.request(`STATUS ${word("name", name)} detail`, {
      signal,
      read: async (line, next) => {
        for (;;) {
          const w = line.split(/\s+/);
          if (w[0] === "HOLDER") {
            const f = fields(w.slice(2));
            holders.push({ name: w[1], id: f.id, token: Number(f.token), heldMs: Number(f.held_ms), ttlMs: Number(f.ttl_ms), session: f.session === "1", mode: f.mode, user: f.user, note: decodeNote(f.note), and: ands(w.slice(2)) });
          } else if (w[0] === "WAITER") {
            const f = fields(w.slice(3));
            waiters.push({ name: w[1], position: Number(w[2]), id: f.id, waitedMs: Number(f.waited_ms), session: f.session === "1", mode: f.mode, and: ands(w.slice(3)) });
          } else return line;
          line = await next();
        }
      },
    });
    return { status: parseStatus(rest), holders, waiters };
  }

  /** WATCH on a connection of its own: a Watch, whose events `for await` reads. */
  async watch(name, { signal } = {}) {
    const c = this.clone();
    await c.request(name ? `WATCH ${word("name", name)}` : "WATCH", { signal });
    return new Watch(c);
  }

  /**
   * Runs `fn(token, signal)` holding the lock, renewing the lease in the background, and
   * releases it when `fn` settles. The lease is a session lease with a grace (`grace`, default
   * 10s, at most the ttl) on a connection of its own; renewals go every third of the time the
   * lease surely lives without one. When the lease can no longer be trusted (a renewal refused,
   * or none got through before that time, less a margin) `signal` is aborted at once, with a
   * LeaseLost as its reason, before lockd can grant the lock to anyone else; withLock then
   * rejects with that LeaseLost once `fn` has settled. `note` and `supersede` are lock()'s.
   */
  async withLock(name, fn, { ttl = DEFAULT_TTL, grace = DEFAULT_GRACE, wait, shared, limit, supersede, note, signal } = {}) {
    grace = Math.min(grace, ttl);
    const hold = grace > 0 ? grace : ttl;
    const margin = Math.max(hold / 10, 50);
    const rc = this.clone();
    const ac = new AbortController();
    const onOuter = () => ac.abort(signal.reason);
    signal?.addEventListener("abort", onOuter, { once: true });
    let lost = null;
    const stop = new AbortController();
    try {
      const token = await rc.lock(name, { ttl, wait, session: true, grace, shared, limit, supersede, note, signal });
      // A renewal at once: a LOCK that waited does not say when its lease began.
      let last = performance.now();
      await rc.renew(name, token, { signal });
      const markLost = (why) => {
        lost = new LeaseLost(name, token, why);
        ac.abort(lost);
      };
      const keeper = (async () => {
        while (!stop.signal.aborted) {
          const giveUp = last + hold - margin;
          await sleep(last + hold / 3 - performance.now(), stop.signal);
          while (!stop.signal.aborted) {
            if (performance.now() >= giveUp) return markLost(`no renewal got through within ${hold - margin}ms`);
            const sent = performance.now();
            try {
              const bound = AbortSignal.timeout(Math.max(1, Math.ceil(giveUp - sent)));
              await rc.renew(name, token, { signal: AbortSignal.any ? AbortSignal.any([stop.signal, bound]) : bound });
              last = sent;
              break;
            } catch (e) {
              if (stop.signal.aborted) return;
              if (!retryable(e) && !(e?.name === "TimeoutError")) return markLost(e.message);
              await sleep(50, stop.signal);
            }
          }
        }
      })();
      try {
        const result = await fn(token, ac.signal);
        if (lost) throw lost;
        return result;
      } catch (e) {
        throw lost ?? e;
      } finally {
        stop.abort();
        await keeper;
        if (!lost) {
          for (let i = 0; i < 2; i++) {
            try {
              await rc.unlock(name, token);
              break;
            } catch (e) {
              if (!(e instanceof ConnectionError)) break;
            }
          }
        }
      }
    } finally {
      signal?.removeEventListener("abort", onOuter);
      rc.close();
    }
  }
}

/** The events of one WATCH: `await watch.next()`, or `for await (const ev of watch)`. */
export class Watch {
  constructor(client) {
    this.client = client;
  }

  /** The next event: {kind, name, id, token, unixMs, note?, by?}. An ERR (LAGGED, SHUTDOWN) ends the watch. */
  async next({ signal } = {}) {
    for (;;) {
      const conn = this.client.conn;
      if (!conn) throw new ConnectionError("the watch has ended");
      const line = await conn.readLine(0, signal);
      const e = parseErr(line);
      if (e) {
        this.close();
        throw e;
      }
      const w = line.split(" ");
      if (w.length >= 6 && w[0] === "EVENT") {
        const event = { kind: w[1], name: w[2], id: w[3], token: Number(w[4]), unixMs: Number(w[5]) };
        // Fields after the fixed words are read by key (a newer lockd may add more).
        for (const f of w.slice(6)) {
          if (f.startsWith("note=")) {
            const note = decodeNote(f.slice(5));
            if (note !== undefined) event.note = note;
          } else if (f.startsWith("by=")) {
            event.by = f.slice(3);
          }
        }
        return event;
      }
    }
  }

  close() {
    this.client.close();
  }

  [Symbol.asyncIterator]() {
    return {
      next: async () => ({ value: await this.next(), done: false }),
      return: async () => {
        this.close();
        return { value: undefined, done: true };
      },
    };
  }
}

function parseErr(reply) {
  if (!reply.startsWith("ERR ")) return null;
  const rest = reply.slice(4);
  const i = rest.indexOf(" ");
  return i < 0 ? new LockdError(rest, "") : new LockdError(rest.slice(0, i), rest.slice(i + 1));
}

function fields(words) {
  const f = {};
  for (const w of words) {
    const i = w.indexOf("=");
    if (i > 0) f[w.slice(0, i)] = w.slice(i + 1);
  }
  return f;
}

/** The and= fields of a detail line (a set's other names; the one key that repeats), in order. */
function ands(words) {
  return words.filter((w) => w.startsWith("and=")).map((w) => w.slice(4));
}

function leftMs(rest) {
  if (!rest.startsWith("ttl_ms=")) throw new ConnectionError(`unexpected reply ${rest}`);
  return Number(rest.slice(7));
}

/** `<name> free ...` or `<name> held id=..`: a free lock is told by the word after its name. */
function parseStatus(text) {
  const w = text.split(/\s+/);
  if (w[1] === "free") return { name: w[0], free: true };
  if (w[1] !== "held") throw new ConnectionError(`unexpected STATUS line ${text}`);
  const f = fields(w.slice(2));
  const status = {
    name: w[0], free: false, id: f.id, token: Number(f.token), ttlMs: Number(f.ttl_ms), session: f.session === "1",
    waiters: Number(f.waiters), holders: f.mode ? Number(f.holders) : 1, mode: f.mode ?? "exclusive",
  };
  const note = decodeNote(f.note);
  if (note !== undefined) status.note = note;
  return status;
}
