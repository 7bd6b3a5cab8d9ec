// node produce.mjs single|bulk URL N        -> {"elapsed": seconds}
// node produce.mjs concurrent URL N C       -> {"elapsed": seconds} (C promises adding N jobs)
// node produce.mjs latency URL RATE SECONDS -> {"sent": n}
import { LAT_KEY, QUEUE, Queue, Redis, WARMUP, connection, now, sleep } from "./common.mjs";

const [mode, url, a, b] = process.argv.slice(2);
const queue = new Queue(QUEUE, { connection: connection(url) });
await queue.waitUntilReady();
await queue.getJobCounts("wait");

let out;
if (mode === "single") {
  const n = Number(a);
  const t0 = performance.now();
  for (let i = 0; i < n; i++) await queue.add("noop", { i });
  out = { elapsed: (performance.now() - t0) / 1000 };
} else if (mode === "concurrent") {
  // C producers in flight on the queue's one connection, each awaiting its own add: ioredis
  // writes every command as it is issued, without waiting for the replies before it.
  const n = Number(a);
  const c = Number(b);
  let next = 0;
  const one = async () => {
    while (next < n) {
      const i = next++;
      await queue.add("noop", { i });
    }
  };
  const t0 = performance.now();
  await Promise.all(Array.from({ length: c }, one));
  out = { elapsed: (performance.now() - t0) / 1000 };
} else if (mode === "bulk") {
  const n = Number(a);
  const jobs = Array.from({ length: n }, (_, i) => ({ name: "noop", data: { i } }));
  const t0 = performance.now();
  await queue.addBulk(jobs);
  out = { elapsed: (performance.now() - t0) / 1000 };
} else if (mode === "latency") {
  const rate = Number(a);
  const seconds = Number(b);
  const r = new Redis(connection(url));
  await queue.add("noop", { i: 0, t: WARMUP });
  const deadline = Date.now() + 120000;
  while ((await r.llen(LAT_KEY)) < 1) {
    if (Date.now() > deadline) throw new Error("the worker did not start the warm-up job");
    await sleep(10);
  }
  await r.del(LAT_KEY);
  const n = Math.floor(rate * seconds);
  const start = performance.now();
  for (let i = 0; i < n; i++) {
    const wait = start + (i * 1000) / rate - performance.now();
    if (wait > 0) await sleep(wait);
    await queue.add("noop", { i: 0, t: now() });
  }
  await r.quit();
  out = { sent: n };
} else {
  throw new Error(`unknown mode ${mode}`);
}
await queue.close();
console.log(JSON.stringify(out));
process.exit(0);
