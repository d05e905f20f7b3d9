// The conformance scenarios (../../conformance/scenarios.json; its README says the format),
// played by this client against a real lockd per scenario: `node --test`. LOCKD_BIN names the
// binary (default: the repository's target/release/lockd, then target/debug/lockd). A lock
// step's "and" names are lockTokens()'s `and`; a detail entry's "and" its holder's or waiter's.

import { test } from "node:test";
import assert from "node:assert/strict";
import { spawn, execFileSync } from "node:child_process";
import fs from "node:fs";
import net from "node:net";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { performance } from "node:perf_hooks";
import { Client, LockdError, LeaseLost } from "../lockd.js";

const here = path.dirname(fileURLToPath(import.meta.url));
const root = path.join(here, "..", "..", "..", "..");
const conformance = path.join(here, "..", "..", "conformance");
const doc = JSON.parse(fs.readFileSync(path.join(conformance, "scenarios.json"), "utf8"));
const GUARD = 10000;
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const within = (p, what) => Promise.race([p, sleep(GUARD).then(() => { throw new Error(`${what} within ${GUARD}ms`); })]);

function lockdBin() {
  const found = [process.env.LOCKD_BIN, `${root}/target/release/lockd`, `${root}/target/debug/lockd`].find((p) => p && fs.existsSync(p));
  assert.ok(found, "no lockd: set LOCKD_BIN or build it (cargo build)");
  return found;
}

class World {
  constructor(scenario, tmp) {
    Object.assign(this, { tmp, args: [], pki: null, clients: {}, tokens: {}, pending: {}, holds: {}, watches: {}, proxy: null, cut: false, sockets: [], fakes: [] });
    const server = scenario.server ?? {};
    if (server.tls) {
      this.pki = tmp;
      execFileSync(path.join(conformance, "make-pki"), [tmp]);
      this.args.push("--tls-cert", `${tmp}/server.pem`, "--tls-key", `${tmp}/server.key`, "--tls-client-ca", `${tmp}/ca.pem`);
    }
    if (server.auth) {
      let text = "";
      for (const [user, u] of Object.entries(doc.users)) {
        text += execFileSync(lockdBin(), ["--auth-hash", `${user} ${u.rights}`], { input: u.secret + "\n" }).toString();
      }
      fs.writeFileSync(`${tmp}/users`, text);
      this.args.push("--auth-file", `${tmp}/users`);
    }
  }

  start(listen) {
    const env = Object.fromEntries(Object.entries(process.env).filter(([k]) => !k.startsWith("LOCKD_") && k !== "RUST_LOG"));
    this.proc = spawn(lockdBin(), ["--listen", listen, ...this.args], { env, stdio: ["ignore", "ignore", "pipe"] });
    return within(new Promise((resolve) => {
      let log = "";
      this.proc.stderr.on("data", (d) => {
        log += d;
        const m = /listening.*?(\d+\.\d+\.\d+\.\d+:\d+)/.exec(log);
        if (m && !this.addr0) {
          this.addr0 = true;
          this.addr = m[1];
          resolve();
        }
      });
    }), "lockd says where it listens");
  }

  stop() {
    for (const c of Object.values(this.clients)) c.close();
    for (const w of Object.values(this.watches)) w.close();
    for (const s of this.sockets) s.destroy();
    this.proxy?.close();
    for (const f of this.fakes) f.close();
    this.proc.kill("SIGCONT");
    this.proc.kill("SIGKILL");
  }

  // A fake front-end cut off from etcd: OK PONG to PING, ERR UNAVAILABLE to everything else.
  async startUnavailable() {
    const fake = net.createServer((sock) => {
      this.sockets.push(sock);
      let buf = "";
      sock.on("data", (d) => {
        buf += d;
        let i;
        while ((i = buf.indexOf("\n")) >= 0) {
          const line = buf.slice(0, i).trim();
          buf = buf.slice(i + 1);
          sock.write(line.toUpperCase() === "PING" ? "OK PONG\n" : "ERR UNAVAILABLE etcd has no leader; try again\n");
        }
      });
      sock.on("error", () => {});
    });
    this.fakes.push(fake);
    await new Promise((r) => fake.listen(0, "127.0.0.1", r));
    return `127.0.0.1:${fake.address().port}`;
  }

  async startProxy() {
    if (!this.proxy) {
      this.proxy = net.createServer((inner) => {
        const outer = net.connect(...this.addr.split(":").reverse().map((v, i) => (i === 0 ? Number(v) : v)));
        this.sockets.push(inner, outer);
        for (const [a, b] of [[inner, outer], [outer, inner]]) {
          a.on("data", (d) => !this.cut && b.write(d));
          a.on("end", () => !this.cut && b.end());
          a.on("error", () => b.destroy());
        }
      });
      await new Promise((r) => this.proxy.listen(0, "127.0.0.1", r));
    }
    return `127.0.0.1:${this.proxy.address().port}`;
  }

  async options(name, step) {
    let addrs = [this.addr];
    if (step.addrs) {
      addrs = [];
      for (const a of step.addrs) {
        if (a === "proxy") addrs.push(await this.startProxy());
        else if (a === "unavailable") addrs.push(await this.startUnavailable());
        else if (a !== "dead") addrs.push(this.addr);
        else {
          const s = net.createServer();
          await new Promise((r) => s.listen(0, "127.0.0.1", r));
          addrs.push(`127.0.0.1:${s.address().port}`);
          await new Promise((r) => s.close(r));
        }
      }
    }
    if (step.via === "proxy") addrs = [await this.startProxy()];
    const o = { addrs, id: name, timeout: 5000, tls: false };
    if (step.id === "default") delete o.id;
    if (this.pki) Object.assign(o, { tls: true, ca: `${this.pki}/ca.pem`, cert: `${this.pki}/client.pem`, key: `${this.pki}/client.key` });
    if (step.user) {
      o.user = step.user;
      const secret = doc.users[step.user].secret;
      if (step.secret === "env") process.env.LOCKD_SECRET = secret; // read by new Client(), deleted after it
      else if (step.secret === "file") fs.writeFileSync((o.secretFile = `${this.tmp}/${step.user}.secret`), secret + "\n");
      else o.secret = "not-the-secret-0123456789";
    }
    return o;
  }

  token(v) {
    return typeof v === "string" ? this.tokens[v] : v;
  }

  async outcome(step, fn) {
    let got;
    try {
      got = await fn();
    } catch (e) {
      if (!(e instanceof LockdError)) throw new Error(`${e}; expected ${step.expect ?? "success"}`);
      assert.equal(e.code, step.expect, `${e}`);
      return;
    }
    assert.equal(step.expect, undefined, `answered ${JSON.stringify(got)}; expected ${step.expect}`);
    for (const [k, v] of Object.entries(step.result ?? {})) {
      const want = k === "token" ? this.token(v) : Array.isArray(v) ? v.map((x) => (typeof x === "object" && "token" in x ? { ...x, token: this.token(x.token) } : x)) : v;
      assert.deepEqual(got[k], want, `answered ${JSON.stringify(got)}; ${k}`);
    }
  }

  lock(s) {
    const c = this.clients[s.client];
    const box = { done: false, names: [s.name, ...(s.and ?? [])] };
    box.promise = c.lockTokens(s.name, { ttl: s.ttl_ms, wait: s.wait_ms, session: s.session, grace: s.grace_ms, shared: s.shared, limit: s.limit, supersede: s.supersede, note: s.note, and: s.and })
      .then((tokens) => (box.tokens = tokens), (e) => (box.error = e))
      .finally(() => Object.assign(box, { done: true, at: performance.now() }));
    this.pending[s.as ?? "_"] = box;
    return s.async ? undefined : this.await(s.as ?? "_", s);
  }

  async await(of, s) {
    const box = this.pending[of];
    await within(box.promise, `the LOCK ${of} answered`);
    await this.outcome(s, () => {
      if (box.error) throw box.error;
      assert.equal(box.tokens.length, box.names.length, `granted ${box.tokens} for ${box.names}`);
      // `of` is the first name's token, `of.<name>` each name's.
      this.tokens[of] = box.tokens[0];
      box.names.forEach((name, i) => (this.tokens[`${of}.${name}`] = box.tokens[i]));
    });
  }

  async hold(s) {
    const c = new Client(await this.options(s.client, s));
    const h = { ended: null };
    h.end = new Promise((r) => (h.ended = r));
    h.lost = new Promise((r) => (h.lostSignal = r));
    h.ttl = s.ttl_ms;
    h.got = new Promise((resolve) => {
      h.result = c.withLock(s.name, async (token, signal) => {
        this.tokens[s.as] = token;
        h.granted = true;
        resolve();
        signal.addEventListener("abort", () => {
          h.lostAt = performance.now();
          h.lostSignal();
        });
        await Promise.race([h.end, h.lost]);
      }, { ttl: s.ttl_ms }).then(() => null, (e) => e);
    });
    this.holds[s.as] = h;
    h.result.then(() => (h.returned = true));
    if (!s.async) await this.granted(h);
  }

  /** Waits for the function of the hold `h` to run (its token saved under its `as`). */
  async granted(h) {
    await within(Promise.race([h.got, h.result.then((e) => { throw new Error(`withLock: ${e}`); })]), "the helper holds the lock");
  }

  async step(s) {
    const c = this.clients[s.client];
    switch (s.op) {
      case "connect": {
        const o = await this.options(s.client, s);
        let client;
        try {
          client = this.clients[s.client] = new Client(o);
        } finally {
          delete process.env.LOCKD_SECRET;
        }
        return this.outcome(s, () => client.connect());
      }
      case "lock": return this.lock(s);
      case "await": return this.holds[s.of] ? this.granted(this.holds[s.of]) : this.await(s.of, s);
      case "pending":
        await sleep(s.ms ?? 300);
        if (this.holds[s.of]) {
          const h = this.holds[s.of];
          return assert.ok(!h.granted && !h.returned, `the helper ${s.of} runs (or returned); it should still wait`);
        }
        return assert.ok(!this.pending[s.of].done, `the LOCK ${s.of} was answered; it should still wait`);
      case "distinct": {
        const tokens = s.tokens.map((t) => this.tokens[t]);
        return assert.equal(new Set(tokens).size, tokens.length, `${s.tokens} are ${tokens}: not all different`);
      }
      case "unlock": return this.outcome(s, () => c.unlock(s.name, this.token(s.token)));
      case "renew":
      case "check": return this.outcome(s, async () => {
        const left = await c[s.op](s.name, this.token(s.token), { ttl: s.ttl_ms });
        assert.ok(left > 0, "no lease left");
      });
      case "status": return this.outcome(s, () => c.status(s.name));
      case "status_all": return this.outcome(s, async () => ({ names: (await c.statusAll()).map((x) => x.name) }));
      case "detail": return this.outcome(s, async () => {
        const d = await c.detail(s.name);
        if (d.status.free) return { free: true };
        // A set's other names ("and") are named only where it has them (the lists compare whole).
        const and = (x) => (x.and.length ? { and: x.and } : {});
        return { holders: d.holders.map((h) => ({ id: h.id, token: h.token, mode: h.mode, ...and(h) })), waiters: d.waiters.map((w) => ({ id: w.id, position: w.position, mode: w.mode, ...and(w) })) };
      });
      case "watch": return this.outcome(s, async () => { this.watches[s.client] = await c.watch(s.name); });
      case "event": return this.outcome(s, () => within(this.watches[s.client].next(), "an event"));
      case "hold": return this.hold(s);
      case "end": {
        const h = this.holds[s.of];
        h.ended();
        const e = await within(h.result, "the helper returned");
        return assert.equal(e, null, `the helper failed: ${e}`);
      }
      case "lost": {
        const h = this.holds[s.of];
        await within(h.lost, "the loss signalled");
        const e = await within(h.result, "the helper returned after the loss");
        assert.ok(e instanceof LeaseLost, `the helper ended with ${e}`);
        if (s.before) {
          const at = this.pending[s.before].at;
          assert.ok(at !== undefined && h.lostAt < at, `signalled ${(h.lostAt - at).toFixed(0)}ms after ${s.before} was granted`);
        }
        if (s.within_ttl_of_freeze) assert.ok(h.lostAt <= this.frozeAt + h.ttl, `signalled ${(h.lostAt - this.frozeAt).toFixed(0)}ms after the freeze`);
        return;
      }
      case "sleep": return sleep(s.ms);
      case "freeze":
        this.frozeAt = performance.now();
        this.proc.kill("SIGSTOP");
        await sleep(s.ms);
        this.proc.kill("SIGCONT");
        return;
      case "cut":
        this.cut = true;
        return;
      case "drop":
        for (const sock of this.sockets.splice(0)) sock.destroy();
        return;
      case "restart":
        this.proc.kill("SIGKILL");
        await new Promise((r) => this.proc.once("exit", r));
        this.addr0 = false;
        return this.start(this.addr);
      default: throw new Error(`unknown op ${s.op}`);
    }
  }
}

for (const scenario of doc.scenarios) {
  test(scenario.name, async () => {
    const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "lockd-conformance-"));
    const world = new World(scenario, tmp);
    await world.start("127.0.0.1:0");
    try {
      for (const [i, step] of scenario.steps.entries()) {
        try {
          await world.step(step);
        } catch (e) {
          e.message = `step ${i + 1} ${JSON.stringify(step)}: ${e.message}`;
          throw e;
        }
      }
    } finally {
      world.stop();
      fs.rmSync(tmp, { recursive: true, force: true });
    }
  });
}
