// The README's example (../example.mjs) runs against a real lockd.
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";

const root = path.join(path.dirname(fileURLToPath(import.meta.url)), "..", "..", "..", "..");

test("the README example runs", async () => {
  const bin = [process.env.LOCKD_BIN, `${root}/target/release/lockd`, `${root}/target/debug/lockd`].find((p) => p && fs.existsSync(p));
  assert.ok(bin, "no lockd: set LOCKD_BIN or build it (cargo build)");
  const lockd = spawn(bin, ["--listen", "127.0.0.1:0"], { stdio: ["ignore", "ignore", "pipe"] });
  try {
    process.env.LOCKD_ADDR = await new Promise((resolve, reject) => {
      let log = "";
      lockd.stderr.on("data", (d) => {
        const m = /listening.*?(\d+\.\d+\.\d+\.\d+:\d+)/.exec((log += d));
        if (m) resolve(m[1]);
      });
      setTimeout(() => reject(new Error("lockd did not say where it listens")), 10000);
    });
    const { example } = await import("../example.mjs");
    assert.match(await example(), /^deployed with fencing token \d+$/);
  } finally {
    lockd.kill("SIGKILL");
    delete process.env.LOCKD_ADDR;
  }
});
