// Types of lockd.js (hand-written: no TypeScript compiler is needed to use the client).
// Durations are milliseconds; tokens are numbers (proto.md: they fit in 53 bits).

export const DEFAULT_ADDR: string;
export const DEFAULT_TTL: number;
export const DEFAULT_GRACE: number;

/**
 * The ERR codes of proto.md. SUPERSEDED: a waiting LOCK whose place a newer `supersede` LOCK
 * (of another id) took; the connection stays usable.
 */
export type ErrorCode =
  | "SYNTAX" | "UNKNOWN" | "BADARG" | "ENCODING" | "TOOLONG" | "TIMEOUT" | "NOTHELD" | "CONFLICT"
  | "REPLACED" | "LIMIT" | "LAGGED" | "SHUTDOWN" | "NOAUTH" | "DENIED" | "UNAVAILABLE" | "TLS"
  | "SUPERSEDED";

/** An ERR reply. */
export class LockdError extends Error {
  readonly code: ErrorCode | string;
  /** The text after the code, for people. */
  readonly detail: string;
}

/** No connection to lockd, or no reply from it; `final` when trying again would fail alike. */
export class ConnectionError extends Error {
  readonly final: boolean;
}

/** The lease ended while withLock's function ran. */
export class LeaseLost extends Error {
  readonly lock: string;
  readonly token: number;
  readonly reason: string;
}

export interface ClientOptions {
  /** "host:port", several comma-separated, or a list: one lockd or the front-ends of a cluster. Default $LOCKD_ADDR, then 127.0.0.1:5001. */
  addrs?: string | string[];
  /**
   * The id every LOCK of this Client sends. Without one, each LOCK (each withLock) takes a new
   * id, `defaultId()`, kept across that LOCK's own resends: the same id is the same client to
   * lockd (a LOCK again is a retry, answered with the same grant), so two holders in one
   * process (async tasks, Clients, withLock calls) never share one.
   */
  id?: string;
  /** Bound of each connection attempt and each reply that should come at once (default 10000). */
  timeout?: number;
  /** TLS: `true` for the system's CAs; or a CA file, and a client certificate and key (mutual TLS). Default $LOCKD_TLS_CA, $LOCKD_CLIENT_CERT, $LOCKD_CLIENT_KEY; `false` ignores them. */
  tls?: boolean;
  ca?: string;
  cert?: string;
  key?: string;
  /** AUTH on every connection, with `secret` or the first line of `secretFile`. Default $LOCKD_USER with $LOCKD_SECRET or $LOCKD_SECRET_FILE. */
  user?: string;
  secret?: string;
  secretFile?: string;
}

export interface Signalled {
  signal?: AbortSignal;
}

export interface LockOptions extends Signalled {
  ttl?: number;
  /** How long to wait in the queue (0: try once); without it, as long as it takes. */
  wait?: number;
  /** A session lease; `grace` (ms) or a number here: how long it outlives its connection. */
  session?: boolean | number;
  grace?: number;
  /** Only the wait is tied to the connection (the default). */
  detach?: boolean;
  /** Neither session nor detach. */
  plain?: boolean;
  shared?: boolean;
  limit?: number;
  /**
   * Newest wins: if the LOCK must wait, every request waiting on the name fails with
   * LockdError code "SUPERSEDED" (one of this same id, "REPLACED") and this one waits alone at
   * the head of the queue. The holder keeps the lock.
   */
  supersede?: boolean;
  /**
   * A note for people ("release 1.4.2 by ci job 8812"), shown with the holder (Status.note,
   * Holder.note, LockEvent.note). Printable text: a control character is a TypeError; at most
   * the server's --max-note bytes (256 by default) else "BADARG". "" (or only spaces) is none.
   */
  note?: string;
  /**
   * Further names of a set, taken with the LOCK's own name all at once or not at all, as one
   * lease (sent as `and=<name>` each); every other option applies to each name, and a renew,
   * check or unlock of any one of them, with its token, applies to the whole set. lock()
   * resolves to the first name's token, lockTokens() to every name's. Not with `supersede`.
   */
  and?: string[];
}

export interface Status {
  name: string;
  free: boolean;
  id?: string;
  token?: number;
  ttlMs?: number;
  session?: boolean;
  waiters?: number;
  holders?: number;
  /** "exclusive", "shared" or "limit:<n>". */
  mode?: string;
  /** The (first) holder's note, decoded; absent without one. */
  note?: string;
}

export interface Holder {
  name: string;
  id: string;
  token: number;
  heldMs: number;
  ttlMs: number;
  session: boolean;
  mode: string;
  user?: string;
  /** This holder's note, decoded; undefined without one. */
  note?: string;
  /** The other names of this holder's set (its and= fields, in its LOCK's order); [] for a lease of one name. */
  and: string[];
}

export interface Waiter {
  name: string;
  position: number;
  id: string;
  waitedMs: number;
  session: boolean;
  mode: string;
  /** The other names of this waiter's set (and=, in its LOCK's order); [] for a request of one name. */
  and: string[];
}

export interface Detail {
  status: Status;
  holders: Holder[];
  waiters: Waiter[];
}

export interface LockEvent {
  kind: "acquired" | "released" | "expired" | "dropped" | "broken";
  name: string;
  id: string;
  token: number;
  unixMs: number;
  /** The new holder's note (acquired events only), decoded. */
  note?: string;
  /** Who broke the lease (broken events only). */
  by?: string;
}

export class Watch implements AsyncIterable<LockEvent> {
  next(options?: Signalled): Promise<LockEvent>;
  close(): void;
  [Symbol.asyncIterator](): AsyncIterator<LockEvent>;
}

export interface WithLockOptions extends Signalled {
  ttl?: number;
  grace?: number;
  wait?: number;
  shared?: boolean;
  limit?: number;
  /** As LockOptions.supersede. */
  supersede?: boolean;
  /** As LockOptions.note. */
  note?: string;
}

/** A new holder's id: `<hostname>:<pid>:<n>`, n counting in this process. */
export function defaultId(): string;

export class Client {
  constructor(options?: ClientOptions);
  /** The id given; undefined when each LOCK takes a new one (see ClientOptions.id). */
  readonly id: string | undefined;
  clone(): Client;
  close(): void;
  connect(options?: Signalled): Promise<void>;
  /** The fencing token; of a set (`and`), the first name's. */
  lock(name: string, options?: LockOptions): Promise<number>;
  /** lock(), resolving to every name's token: `name`'s first, then those of `and` in order. */
  lockTokens(name: string, options?: LockOptions): Promise<number[]>;
  unlock(name: string, token: number, options?: Signalled): Promise<void>;
  renew(name: string, token: number, options?: Signalled & { ttl?: number }): Promise<number>;
  check(name: string, token: number, options?: Signalled): Promise<number>;
  status(name: string, options?: Signalled): Promise<Status>;
  statusAll(options?: Signalled): Promise<Status[]>;
  detail(name: string, options?: Signalled): Promise<Detail>;
  watch(name?: string, options?: Signalled): Promise<Watch>;
  withLock<T>(name: string, fn: (token: number, signal: AbortSignal) => Promise<T> | T, options?: WithLockOptions): Promise<T>;
}
