// The README's example: a function run under the lock, renewed in the background
// (test/example.test.mjs runs it against a real lockd).
import { Client } from "./lockd.js";

async function deploy(token, signal) {
  signal.throwIfAborted(); // the lease was lost: stop
  return `deployed with fencing token ${token}`;
}

export async function example() {
  // README begin
  const client = new Client(); // $LOCKD_ADDR, or 127.0.0.1:5001
  const done = await client.withLock("deploy", async (token, signal) => {
    return deploy(token, signal); // signal aborts the moment the lease is lost
  }, { ttl: 30000 });
  client.close();
  // README end
  return done;
}
