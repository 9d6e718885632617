// Runs against a real server that tests/test_ts_client_e2e.py starts on a free port,
// with authentication on, the Community edition, one workspace and one session log:
//   KNOWLEDGE_TS_ADDRESS   host:port of the server
//   KNOWLEDGE_TS_TOKEN     an operator token
//   KNOWLEDGE_TS_WORKSPACE the workspace root to index
//   KNOWLEDGE_TS_SESSIONS  the folder of session logs to ingest
//   KNOWLEDGE_TS_WORD      a word both the code and the session log contain
// The tests run in order (node:test runs a file's top-level tests one after another).

import assert from "node:assert/strict";
import { test } from "node:test";
import {
  Cancelled,
  Code,
  DeadlineExceeded,
  EditionRefused,
  InvalidRequest,
  KnowledgeClient,
  SEARCH_SCHEMA,
  Unauthenticated,
  Unavailable,
} from "../src/index.js";
import { DocGraphService } from "../src/gen/knowledge/v1/docgraph_pb.js";
import { IndexService } from "../src/gen/knowledge/v1/index_service_pb.js";
import { KnowledgeBaseAdminService } from "../src/gen/knowledge/v1/kb_admin_pb.js";
import { KnowledgeBaseService } from "../src/gen/knowledge/v1/kb_retrieve_pb.js";
import { MemoryService } from "../src/gen/knowledge/v1/memory_pb.js";
import { KnowledgeService } from "../src/gen/knowledge/v1/knowledge_service_pb.js";

function env(name: string): string {
  const value = process.env[name];
  if (!value) {
    throw new Error(`${name} is not set: run these tests through tests/test_ts_client_e2e.py`);
  }
  return value;
}

const address = env("KNOWLEDGE_TS_ADDRESS");
const token = env("KNOWLEDGE_TS_TOKEN");
const workspace = env("KNOWLEDGE_TS_WORKSPACE");
const sessions = env("KNOWLEDGE_TS_SESSIONS");
const word = env("KNOWLEDGE_TS_WORD");
const client = new KnowledgeClient({ address, token, deadlineMs: 30_000 });

test("every RPC of every service has a client method", () => {
  const services = [
    KnowledgeService,
    DocGraphService,
    IndexService,
    KnowledgeBaseService,
    KnowledgeBaseAdminService,
    MemoryService,
  ];
  for (const service of services) {
    for (const method of service.methods) {
      const fn = (client as unknown as Record<string, unknown>)[method.localName];
      assert.equal(typeof fn, "function", `${service.typeName}.${method.name} has no method`);
    }
  }
});

test("a call without a token, or with an unknown one, is Unauthenticated", async () => {
  const anonymous = new KnowledgeClient({ address, token: "" });
  const missing = await anonymous.getStatus().then(
    () => assert.fail("answered without a token"),
    (err: unknown) => err,
  );
  assert.ok(missing instanceof Unauthenticated, String(missing));
  assert.equal(missing.code, Code.Unauthenticated);
  assert.equal(missing.reason, "KNOWLEDGE_UNAUTHENTICATED");
  assert.notEqual(missing.requestId, "");
  const wrong = new KnowledgeClient({ address, token: "kn_" + "x".repeat(43) });
  await assert.rejects(wrong.search("anything"), (err: unknown) => {
    assert.ok(err instanceof Unauthenticated);
    assert.equal(err.message, missing.message);
    return true;
  });
});

test("IndexWorkspace streams progress, then its summary", async () => {
  const phases: string[] = [];
  let summary: { counters: Record<string, bigint> } | undefined;
  for await (const event of client.indexWorkspace({ root: workspace, full: true })) {
    if (event.event.case === "progress") {
      phases.push(event.event.value.phase);
    } else if (event.event.case === "summary") {
      summary = event.event.value;
    }
  }
  assert.ok(phases.length > 0, "no progress event");
  assert.ok(summary !== undefined, "no summary");
  const counters = Object.values(summary.counters).reduce((a, b) => a + b, 0n);
  assert.ok(counters > 0n, JSON.stringify(summary.counters, (_, v) => String(v)));
});

test("IngestSessions reads the session log", async () => {
  const events = [];
  for await (const event of client.ingestSessions({ paths: [sessions] })) {
    events.push(event);
  }
  const last = events.at(-1);
  assert.equal(last?.event.case, "summary");
});

test("a search answers with code and episode evidence, schema filled in", async () => {
  const requestId = "ts-search-1";
  const answer = await client.search({
    query: `where is ${word} handled`,
    include: ["episodes", "code"],
    requestId,
  });
  assert.equal(answer.schema, SEARCH_SCHEMA);
  assert.equal(answer.requestId, requestId);
  assert.ok(answer.found);
  const code = answer.lanes?.code?.items ?? [];
  const episodes = answer.lanes?.episodes?.items ?? [];
  assert.ok(code.length > 0, "no code evidence");
  assert.ok(episodes.length > 0, "no episode evidence");
  assert.ok(code.some((item) => item.path.endsWith(".py")));
});

test("a dispatch dry run plans without recording", async () => {
  const answer = await client.dispatch({
    task: { text: `fix the ${word} parser`, acceptance: ["tests pass"] },
    dryRun: true,
  });
  assert.equal(answer.schema, "knowledge.dispatch/v1");
  assert.equal(answer.mode, "dry_run");
  assert.equal(answer.assignment, undefined);
});

test("the document graph under Community is an EditionRefused with its fields", async () => {
  await assert.rejects(client.themes(), (err: unknown) => {
    assert.ok(err instanceof EditionRefused, String(err));
    assert.equal(err.code, Code.PermissionDenied);
    assert.equal(err.reason, "KNOWLEDGE_EDITION_REQUIRED");
    assert.equal(err.feature, "doc-graph");
    assert.equal(err.requiredEdition, "enterprise");
    assert.equal(err.currentEdition, "community");
    assert.equal(err.method, "/knowledge.v1.DocGraphService/Themes");
    return true;
  });
  // A refused stream is refused the same way, when it is read.
  await assert.rejects(
    (async () => {
      for await (const _ of client.buildDocGraph()) {
        // nothing: the refusal comes first
      }
    })(),
    (err: unknown) => err instanceof EditionRefused && err.feature === "doc-graph",
  );
});

test("the knowledge base answers NO_EVIDENCE under the caller's trace id", async () => {
  // Nothing is published on this server: no evidence is an answer, not an error.
  const traceId = "ts-trace-1";
  const found = await client.retrieve({ query: `how does the ${word} parser work`, topK: 3 }, { traceId });
  assert.equal(found.answerable, false);
  assert.equal(found.reasonCode, "NO_EVIDENCE");
  assert.equal(found.traceId, traceId);
  assert.deepEqual(found.sources, []);
  const answered = await client.answer(`how does the ${word} parser work`, { traceId: "ts-trace-2" });
  assert.equal(answered.answerable, false);
  assert.equal(answered.traceId, "ts-trace-2");
  assert.equal(answered.citationCheck?.status, "no_evidence");
  assert.equal(answered.modelMs, 0);
  assert.notEqual(answered.answer, "");
  // A trace id that is not a plain token is replaced by the service's own.
  const replaced = await client.retrieve(word, { traceId: "not a token!" });
  assert.match(replaced.traceId, /^trace_[0-9a-f]+$/);
  // A tag code the organisation does not have is refused before any retrieval.
  await assert.rejects(client.retrieve({ query: word, allTagCodes: ["no-such-tag"] }), (err: unknown) => {
    assert.ok(err instanceof InvalidRequest, String(err));
    assert.equal(err.reason, "KNOWLEDGE_UNKNOWN_TAG");
    return true;
  });
});

test("a deadline shorter than the call answers DeadlineExceeded", async () => {
  await assert.rejects(client.search(word, { deadlineMs: 0.001 }), (err: unknown) => {
    assert.ok(err instanceof Error && "code" in err);
    assert.equal((err as { code: Code }).code, Code.DeadlineExceeded);
    return true;
  });
});

test("a deadline in fractions of a millisecond is sent whole; a spent one is not sent", async () => {
  // gRPC's timeout header holds whole milliseconds: 3333.33 ms is sent as 3334.
  const found = await client.search(word, { deadlineMs: 10_000 / 3 });
  assert.equal(found.schema, SEARCH_SCHEMA);
  // And the connection serves the next timed call.
  assert.equal((await client.search(word, { deadlineMs: 5_000 })).schema, SEARCH_SCHEMA);
  for (const spent of [0, -5]) {
    await assert.rejects(client.search(word, { deadlineMs: spent }), (err: unknown) => {
      assert.ok(err instanceof DeadlineExceeded, String(err));
      return true;
    });
  }
});

test("leaving a stream's loop early ends the stream on the wire", async () => {
  const signals: AbortSignal[] = [];
  const watching = new KnowledgeClient({
    address,
    token,
    interceptors: [
      (next) => async (req) => {
        signals.push(req.signal);
        return next(req);
      },
    ],
  });
  for await (const _ of watching.ingestSessions({ paths: [sessions] })) {
    break;
  }
  assert.equal(signals.length, 1);
  assert.equal(signals[0]!.aborted, true);
});

test("a token a header cannot carry, or TLS asked of an http:// address, is refused at once", () => {
  const secret = "kn_abc\ndef";
  assert.throws(
    () => new KnowledgeClient({ address, token: secret }),
    (err: unknown) => err instanceof Error && !err.message.includes("kn_abc") && /token/.test(err.message),
  );
  assert.throws(() => new KnowledgeClient({ address: `http://${address}`, token, tls: true }), /http:\/\//);
  // Surrounding white space (a token read from a file) is trimmed.
  assert.ok(new KnowledgeClient({ address, token: `${token}\n` }));
});

test("TLS asked of a plain-text server is Unavailable, not a server bug", async () => {
  const wrong = new KnowledgeClient({ address, token, tls: true, deadlineMs: 5_000 });
  await assert.rejects(wrong.getStatus({}), (err: unknown) => {
    assert.ok(err instanceof Unavailable, String(err));
    return true;
  });
});

test("a call its caller aborts, with any reason, answers Cancelled", async () => {
  // Connect reads an abort reason that is not an AbortError as an unknown failure: it was
  // answered InternalError, "a server bug", with the caller's own reason as its message.
  for (const reason of [undefined, new Error("user navigated away"), "stop"]) {
    const ac = new AbortController();
    ac.abort(reason);
    await assert.rejects(client.search(word, { signal: ac.signal }), (err: unknown) => {
      assert.ok(err instanceof Cancelled, String(err));
      return true;
    });
    const stream = client.ingestSessions({ paths: [sessions] }, { signal: ac.signal });
    await assert.rejects(
      (async () => {
        for await (const _ of stream) {
          // nothing: the call was aborted before it began
        }
      })(),
      (err: unknown) => err instanceof Cancelled,
    );
  }
});

test("a deadline longer than gRPC's timeout header can hold is sent as the longest", async () => {
  // 2^31 ms and more overflowed Node's timer: the call failed DeadlineExceeded at once.
  for (const long of [2 ** 31, 30 * 24 * 3_600_000]) {
    assert.equal((await client.search(word, { deadlineMs: long })).schema, SEARCH_SCHEMA);
  }
});
