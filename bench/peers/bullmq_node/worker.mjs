// node worker.mjs URL CONCURRENCY: one BullMQ worker (one process) until SIGTERM.
import { LAT_KEY, QUEUE, Redis, Worker, connection, now } from "./common.mjs";

const [url, c] = process.argv.slice(2);
const recorder = new Redis(connection(url));
const worker = new Worker(
  QUEUE,
  async (job) => {
    const t = job.data.t;
    if (t) {
      const started = now();
      await recorder.rpush(LAT_KEY, `${t} ${started}`);
    }
  },
  { connection: connection(url), concurrency: Number(c) },
);
worker.on("error", (err) => console.error("worker error", err));

let stopping = false;
async function stop() {
  if (stopping) process.exit(1);
  stopping = true;
  await worker.close();
  await recorder.quit();
  process.exit(0);
}
process.on("SIGTERM", stop);
process.on("SIGINT", stop);
