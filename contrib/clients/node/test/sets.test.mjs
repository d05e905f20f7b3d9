// The LOCK of a set of names (`and`) against a fake server on 127.0.0.1 that grants every LOCK
// with one token per name and keeps the lines it got: the words sent (and=<name> per further
// name, before the note), the tokens read back, and the and= fields of STATUS <name> detail.
// No lockd needed. (The set's grant by a real lockd is the conformance scenarios'.)
import { test } from "node:test";
import assert from "node:assert/strict";
import net from "node:net";
import { Client, ConnectionError } from "../lockd.js";

async function fakeServer({ short = false } = {}) {
  const lines = [];
  const sockets = [];
  const server = net.createServer((sock) => {
    sockets.push(sock);
    let buf = "";
    sock.on("data", (d) => {
      buf += d;
      let i;
      while ((i = buf.indexOf("\n")) >= 0) {
        const line = buf.slice(0, i);
        buf = buf.slice(i + 1);
        lines.push(line);
        if (line.startsWith("LOCK ")) {
          const names = 1 + line.split(" note=")[0].split(" ").filter((w) => w.startsWith("and=")).length;
          const tokens = Array.from({ length: names - (short ? 1 : 0) }, (_, k) => 40 + k);
          sock.write(`OK ${tokens.join(" ")}\n`);
        } else if (line.startsWith("STATUS ")) {
          sock.write(
            "HOLDER db-migrate id=ci-7 token=40 held_ms=5 ttl_ms=9 session=0 mode=exclusive granted=1700000000000 and=cache-flush note=two%20names\n" +
              "WAITER db-migrate 1 id=ci-8 waited_ms=3 session=0 mode=shared and=cache-flush and=queue\n" +
              "WAITER db-migrate 2 id=ci-9 waited_ms=1 session=0 mode=exclusive\n" +
              "OK db-migrate held id=ci-7 token=40 ttl_ms=9 session=0 waiters=2 note=two%20names\n",
          );
        } else sock.write("OK PONG\n");
      }
    });
    sock.on("error", () => {});
  });
  await new Promise((r) => server.listen(0, "127.0.0.1", r));
  return {
    addr: `127.0.0.1:${server.address().port}`,
    locks: () => lines.filter((l) => l.startsWith("LOCK ")),
    close: () => {
      for (const s of sockets) s.destroy();
      server.close();
    },
  };
}

test("a set sends and= words and resolves to a token per name", async () => {
  const fake = await fakeServer();
  const c = new Client({ addrs: fake.addr, id: "ci-7", timeout: 5000, tls: false });
  try {
    assert.deepEqual(await c.lockTokens("db-migrate", { ttl: 600000, and: ["cache-flush", "queue"], note: "two names" }), [40, 41, 42]);
    const line = fake.locks().at(-1);
    assert.ok(line.startsWith("LOCK db-migrate ci-7 ttl=600000ms"), line);
    assert.ok(line.endsWith(" and=cache-flush and=queue note=two names"), line);
    // lock() resolves to the first name's token; of one name, its token alone.
    assert.equal(await c.lock("db-migrate", { and: ["cache-flush"] }), 40);
    assert.deepEqual(await c.lockTokens("db-migrate"), [40]);
    assert.ok(!fake.locks().at(-1).includes("and="));
  } finally {
    c.close();
    fake.close();
  }
});

test("a reply without a token per name is a ConnectionError", async () => {
  const fake = await fakeServer({ short: true });
  const c = new Client({ addrs: fake.addr, id: "ci-7", timeout: 5000, tls: false });
  try {
    await assert.rejects(c.lockTokens("a", { and: ["b", "c"] }), ConnectionError);
  } finally {
    c.close();
    fake.close();
  }
});

test("a set is checked before it is sent", async () => {
  const fake = await fakeServer();
  const c = new Client({ addrs: fake.addr, id: "ci-7", timeout: 5000, tls: false });
  try {
    await assert.rejects(c.lock("a", { and: ["b c"] }), TypeError);
    await assert.rejects(c.lock("a", { and: "b" }), TypeError);
    await assert.rejects(c.lock("a", { and: ["b"], supersede: true }), TypeError);
    assert.deepEqual(fake.locks(), []);
  } finally {
    c.close();
    fake.close();
  }
});

test("detail names a set's other names in `and`", async () => {
  const fake = await fakeServer();
  const c = new Client({ addrs: fake.addr, id: "ci-7", timeout: 5000, tls: false });
  try {
    const d = await c.detail("db-migrate");
    assert.deepEqual(d.holders.map((h) => [h.and, h.note]), [[["cache-flush"], "two names"]]);
    assert.deepEqual(d.waiters.map((w) => w.and), [["cache-flush", "queue"], []]);
  } finally {
    c.close();
    fake.close();
  }
});
