// Sequential searches with the TypeScript client (clients/typescript, built): the questions
// come as a JSON array on stdin, the latencies (ms, one per question) go to stdout as JSON.
// Run by bench/bench_telemetry.py: node bench/ts_search.mjs HOST:PORT < questions.json
import { readFileSync } from "node:fs";
import { KnowledgeClient } from "../clients/typescript/dist/src/index.js";

const address = process.argv[2];
const questions = JSON.parse(readFileSync(0, "utf8"));
const client = new KnowledgeClient({ address, deadlineMs: 30_000 });
await client.search("warm up");
const out = [];
for (const query of questions) {
  const t = performance.now();
  await client.search(query);
  out.push(performance.now() - t);
}
process.stdout.write(JSON.stringify(out));
