// Shared by the BullMQ (Node) adapter: loads bullmq + ioredis from bench/node/node_modules
// (installed by bench/setup.sh) and turns the bench URL into connection options.
import { createRequire } from "node:module";
import { performance } from "node:perf_hooks";

const require = createRequire(new URL("../../node/package.json", import.meta.url));
export const { Queue, Worker } = require("bullmq");
const ioredis = require("ioredis");
export const Redis = ioredis.Redis ?? ioredis.default ?? ioredis;

export const QUEUE = "bench";
export const LAT_KEY = "bench:lat";
export const WARMUP = -1.0;

export function connection(url) {
  const u = new URL(url);
  const db = u.pathname && u.pathname.length > 1 ? Number(u.pathname.slice(1)) : 0;
  return { host: u.hostname, port: Number(u.port || 6379), db, maxRetriesPerRequest: null };
}

// Unix time in seconds with sub-millisecond resolution (same clock as Python's time.time()).
export function now() {
  return (performance.timeOrigin + performance.now()) / 1000;
}

export const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
