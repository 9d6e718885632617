// A thin typed wrapper over the generated service descriptors: one method per RPC,
// requests with their `schema` filled in, a bearer token and a deadline per client or
// per call (and a trace id on the knowledge base's Retrieve and Answer), server streams as
// async iterators, and failures as the typed errors of ./errors.ts.

import { create, type DescMessage, type MessageInitShape, type MessageShape } from "@bufbuild/protobuf";
import { Code, createClient, type Client, type Interceptor, type Transport } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { DeadlineExceeded, toKnowledgeError } from "./errors.js";
import {
  DocGraphService,
  DocRelationsRequestSchema,
  EntityNeighborsRequestSchema,
  GlobalOverviewRequestSchema,
  SearchLevelsRequestSchema,
  ThemesRequestSchema,
} from "./gen/knowledge/v1/docgraph_pb.js";
import { DispatchRequestSchema } from "./gen/knowledge/v1/dispatch_pb.js";
import {
  BuildDocGraphRequestSchema,
  GetStatusRequestSchema,
  IndexService,
  IndexWorkspaceRequestSchema,
  IngestSessionsRequestSchema,
  RebuildDerivedRequestSchema,
} from "./gen/knowledge/v1/index_service_pb.js";
import {
  GetChunkRequestSchema,
  GetEpisodeRequestSchema,
  KnowledgeService,
} from "./gen/knowledge/v1/knowledge_service_pb.js";
import {
  KnowledgeBaseAdminService,
  ApproveRevisionRequestSchema,
  CancelTaskRequestSchema,
  CreateFeedbackRequestSchema,
  CreateRevisionRequestSchema,
  CreateTagRequestSchema,
  CreateTopicRequestSchema,
  GetPolicyRequestSchema,
  GetRevisionRequestSchema,
  GetTopicRequestSchema,
  ListFeedbackRequestSchema,
  ListTagsRequestSchema,
  ListTemplatesRequestSchema,
  ListTopicsRequestSchema,
  OfflineTopicRequestSchema,
  ProcessRevisionRequestSchema,
  PublishRevisionRequestSchema,
  PutFaqRequestSchema,
  PutTemplateRequestSchema,
  ReconcileRequestSchema,
  RemoveSourceRequestSchema,
  ResolveFeedbackRequestSchema,
  RetryTaskRequestSchema,
  ReturnRevisionRequestSchema,
  RollbackTopicRequestSchema,
  SetPolicyRequestSchema,
  SubmitRevisionRequestSchema,
  UpdateRevisionRequestSchema,
  UpdateTagRequestSchema,
  UploadSourceRequestSchema,
  WatchTaskRequestSchema,
} from "./gen/knowledge/v1/kb_admin_pb.js";
import {
  AnswerRequestSchema,
  KnowledgeBaseService,
  RetrieveRequestSchema,
} from "./gen/knowledge/v1/kb_retrieve_pb.js";
import {
  MemoryService,
  ConsolidateRequestSchema,
  PolicyRequestSchema,
  RecallRequestSchema,
  RelationsRequestSchema,
  RememberRequestSchema,
  RestoreRequestSchema,
  RoomsRequestSchema,
  TimelineRequestSchema,
} from "./gen/knowledge/v1/memory_pb.js";
import { SearchRequestSchema } from "./gen/knowledge/v1/search_pb.js";

/** The `schema` value each versioned request carries (the client fills it in). */
/** The longest deadline sent: gRPC's timeout header holds at most eight digits of
 * milliseconds (about 27.7 hours); a longer one is sent as this. */
export const MAX_DEADLINE_MS = 99_999_999;
export const SEARCH_SCHEMA = "knowledge.search/v1";
export const DISPATCH_SCHEMA = "knowledge.dispatch/v1";

/** A request without its `schema` (filled in by the client). */
export type KnowledgeRequest<Desc extends DescMessage> = Omit<MessageInitShape<Desc>, "schema" | "$typeName">;

export interface TlsOptions {
  /** PEM of the CA that signed the server's certificate (default: the system's CAs). */
  ca?: string | Buffer;
  /** Client certificate and key (PEM) when the server asks for mutual TLS. */
  cert?: string | Buffer;
  key?: string | Buffer;
  /** The name the server's certificate is checked against, when it differs from the host. */
  serverName?: string;
}

export interface ClientOptions {
  /** `host:port` (default 127.0.0.1:50151), or an `http://` / `https://` URL. */
  address?: string;
  /** Bearer token (`knowledge token create`); sent as `authorization: Bearer <token>`. */
  token?: string;
  /** Connect with TLS: `true` for the system's CAs, or the CA / client certificate. */
  tls?: boolean | TlsOptions;
  /** Default deadline of unary calls, in milliseconds (none by default). */
  deadlineMs?: number;
  /** More interceptors (they run after the one that adds the token). */
  interceptors?: Interceptor[];
}

export interface CallOptions {
  /** Deadline of this call in milliseconds (overrides the client's). */
  deadlineMs?: number;
  /** Aborts the call (answered as `Cancelled`). */
  signal?: AbortSignal;
  /** Extra request metadata, e.g. `x-request-id`. */
  headers?: Record<string, string>;
}

export interface TracedCallOptions extends CallOptions {
  /** Trace id of the call, sent as `x-trace-id`: kept by the service when it is a plain
   * token of at most 128 characters (`[A-Za-z0-9._:-]`), else replaced by a new one; the
   * answer's `traceId` and an error's `metadata.trace_id` carry it. */
  traceId?: string;
}

function traced(call: TracedCallOptions): CallOptions {
  const { traceId, ...rest } = call;
  return traceId ? { ...rest, headers: { ...rest.headers, "x-trace-id": traceId } } : rest;
}

function baseUrl(address: string, tls: boolean): string {
  if (address.startsWith("http://")) {
    if (tls) {
      // The token would go out in clear text while the caller asked for TLS.
      throw new Error("tls is set but the address starts with http://: use https:// or leave tls out");
    }
    return address;
  }
  if (address.startsWith("https://")) {
    return address;
  }
  return `${tls ? "https" : "http"}://${address}`;
}

/** The token as sent: trimmed, and one word of printable ASCII (a header value cannot hold
 * anything else, and the error would quote it). */
function checkedToken(token: string): string {
  const t = token.trim();
  if (t && !/^[\x21-\x7e]+$/.test(t)) {
    throw new Error("token: not a token (it must be printable ASCII without spaces or line breaks)");
  }
  return t;
}

/** A client of every service (KnowledgeService, DocGraphService, IndexService,
 * KnowledgeBaseService, KnowledgeBaseAdminService, MemoryService). */
export class KnowledgeClient {
  readonly address: string;
  private readonly deadlineMs: number | undefined;
  private readonly knowledge: Client<typeof KnowledgeService>;
  private readonly docgraph: Client<typeof DocGraphService>;
  private readonly index: Client<typeof IndexService>;
  private readonly kb: Client<typeof KnowledgeBaseService>;
  private readonly kbAdmin: Client<typeof KnowledgeBaseAdminService>;
  private readonly memory: Client<typeof MemoryService>;

  constructor(options: ClientOptions = {}) {
    this.address = options.address ?? process.env.KNOWLEDGE_ADDRESS ?? "127.0.0.1:50151";
    this.deadlineMs = options.deadlineMs;
    const token = checkedToken(options.token ?? process.env.KNOWLEDGE_TOKEN ?? "");
    const tls = options.tls ?? false;
    const auth: Interceptor = (next) => async (req) => {
      if (token) {
        req.header.set("authorization", `Bearer ${token}`);
      }
      return next(req);
    };
    const transport: Transport = createGrpcTransport({
      baseUrl: baseUrl(this.address, tls !== false),
      interceptors: [auth, ...(options.interceptors ?? [])],
      nodeOptions:
        typeof tls === "object"
          ? { ca: tls.ca, cert: tls.cert, key: tls.key, servername: tls.serverName }
          : {},
    });
    this.knowledge = createClient(KnowledgeService, transport);
    this.docgraph = createClient(DocGraphService, transport);
    this.index = createClient(IndexService, transport);
    this.kb = createClient(KnowledgeBaseService, transport);
    this.kbAdmin = createClient(KnowledgeBaseAdminService, transport);
    this.memory = createClient(MemoryService, transport);
  }

  private options(call: CallOptions, unary: boolean, signal?: AbortSignal) {
    const deadline = call.deadlineMs ?? (unary ? this.deadlineMs : undefined);
    if (deadline !== undefined && !(deadline > 0)) {
      // A spent budget: the call is not sent (gRPC would read 0 as "no deadline").
      throw new DeadlineExceeded({
        code: Code.DeadlineExceeded,
        message: `the deadline (${deadline} ms) has already passed; the call was not sent`,
        reason: "",
        metadata: {},
        requestId: "",
      });
    }
    return {
      // gRPC's timeout header holds whole milliseconds: a fraction would fail the call;
      // and at most eight digits (about 27.7 hours), which also keeps Node's timer from
      // overflowing (a deadline of 2^31 ms or more fired at once).
      timeoutMs: deadline === undefined ? undefined : Math.min(Math.ceil(deadline), MAX_DEADLINE_MS),
      signal: signal ?? call.signal,
      headers: call.headers,
    };
  }

  private async unary<Req extends DescMessage, Res>(
    run: (req: MessageShape<Req>, opts: ReturnType<KnowledgeClient["options"]>) => Promise<Res>,
    schema: Req,
    init: MessageInitShape<Req>,
    call: CallOptions,
  ): Promise<Res> {
    try {
      return await run(create(schema, init), this.options(call, true));
    } catch (err) {
      throw toKnowledgeError(err, call.signal);
    }
  }

  private async *stream<Req extends DescMessage, Res>(
    run: (req: MessageShape<Req>, opts: ReturnType<KnowledgeClient["options"]>) => AsyncIterable<Res>,
    schema: Req,
    init: MessageInitShape<Req>,
    call: CallOptions,
  ): AsyncGenerator<Res, void, undefined> {
    // A caller that leaves the loop early (break, return, an exception) ends the stream on
    // the wire too: the generator's finally aborts it (the underlying iterator cannot be
    // told otherwise).
    const controller = new AbortController();
    const outer = call.signal;
    const follow = () => controller.abort(outer?.reason);
    if (outer?.aborted) {
      controller.abort(outer.reason);
    } else {
      outer?.addEventListener("abort", follow, { once: true });
    }
    try {
      yield* run(create(schema, init), this.options(call, false, controller.signal));
    } catch (err) {
      throw toKnowledgeError(err, outer);
    } finally {
      outer?.removeEventListener("abort", follow);
      controller.abort();
    }
  }

  // KnowledgeService

  /** Search (`knowledge.search/v1`): a question, or the whole request without `schema`. */
  search(request: string | KnowledgeRequest<typeof SearchRequestSchema>, call: CallOptions = {}) {
    const init = typeof request === "string" ? { query: request } : request;
    return this.unary(
      (r, o) => this.knowledge.search(r, o),
      SearchRequestSchema,
      { ...init, schema: SEARCH_SCHEMA },
      call,
    );
  }

  /** Dispatch (`knowledge.dispatch/v1`); `dryRun: true` plans without recording. */
  dispatch(request: KnowledgeRequest<typeof DispatchRequestSchema>, call: CallOptions = {}) {
    return this.unary(
      (r, o) => this.knowledge.dispatch(r, o),
      DispatchRequestSchema,
      { ...request, schema: DISPATCH_SCHEMA },
      call,
    );
  }

  getEpisode(request: KnowledgeRequest<typeof GetEpisodeRequestSchema>, call: CallOptions = {}) {
    return this.unary((r, o) => this.knowledge.getEpisode(r, o), GetEpisodeRequestSchema, request, call);
  }

  getChunk(request: KnowledgeRequest<typeof GetChunkRequestSchema>, call: CallOptions = {}) {
    return this.unary((r, o) => this.knowledge.getChunk(r, o), GetChunkRequestSchema, request, call);
  }

  // DocGraphService (Enterprise: other editions answer EditionRefused)

  themes(request: KnowledgeRequest<typeof ThemesRequestSchema> = {}, call: CallOptions = {}) {
    return this.unary((r, o) => this.docgraph.themes(r, o), ThemesRequestSchema, request, call);
  }

  entityNeighbors(request: KnowledgeRequest<typeof EntityNeighborsRequestSchema>, call: CallOptions = {}) {
    return this.unary(
      (r, o) => this.docgraph.entityNeighbors(r, o),
      EntityNeighborsRequestSchema,
      request,
      call,
    );
  }

  docRelations(request: KnowledgeRequest<typeof DocRelationsRequestSchema>, call: CallOptions = {}) {
    return this.unary((r, o) => this.docgraph.docRelations(r, o), DocRelationsRequestSchema, request, call);
  }

  globalOverview(request: KnowledgeRequest<typeof GlobalOverviewRequestSchema> = {}, call: CallOptions = {}) {
    return this.unary(
      (r, o) => this.docgraph.globalOverview(r, o),
      GlobalOverviewRequestSchema,
      request,
      call,
    );
  }

  searchLevels(request: KnowledgeRequest<typeof SearchLevelsRequestSchema>, call: CallOptions = {}) {
    return this.unary((r, o) => this.docgraph.searchLevels(r, o), SearchLevelsRequestSchema, request, call);
  }

  // IndexService: the operator streams yield progress events, then one summary.

  indexWorkspace(request: KnowledgeRequest<typeof IndexWorkspaceRequestSchema> = {}, call: CallOptions = {}) {
    return this.stream((r, o) => this.index.indexWorkspace(r, o), IndexWorkspaceRequestSchema, request, call);
  }

  ingestSessions(request: KnowledgeRequest<typeof IngestSessionsRequestSchema> = {}, call: CallOptions = {}) {
    return this.stream((r, o) => this.index.ingestSessions(r, o), IngestSessionsRequestSchema, request, call);
  }

  rebuildDerived(request: KnowledgeRequest<typeof RebuildDerivedRequestSchema> = {}, call: CallOptions = {}) {
    return this.stream((r, o) => this.index.rebuildDerived(r, o), RebuildDerivedRequestSchema, request, call);
  }

  buildDocGraph(request: KnowledgeRequest<typeof BuildDocGraphRequestSchema> = {}, call: CallOptions = {}) {
    return this.stream((r, o) => this.index.buildDocGraph(r, o), BuildDocGraphRequestSchema, request, call);
  }

  getStatus(call: CallOptions = {}) {
    return this.unary((r, o) => this.index.getStatus(r, o), GetStatusRequestSchema, {}, call);
  }

  // MemoryService (the project memory: facts, timeline, rooms, relations)

  remember(request: KnowledgeRequest<typeof RememberRequestSchema> = {}, call: CallOptions = {}) {
    return this.unary((r, o) => this.memory.remember(r, o), RememberRequestSchema, request, call);
  }

  recall(request: KnowledgeRequest<typeof RecallRequestSchema> = {}, call: CallOptions = {}) {
    return this.unary((r, o) => this.memory.recall(r, o), RecallRequestSchema, request, call);
  }

  timeline(request: KnowledgeRequest<typeof TimelineRequestSchema> = {}, call: CallOptions = {}) {
    return this.unary((r, o) => this.memory.timeline(r, o), TimelineRequestSchema, request, call);
  }

  rooms(request: KnowledgeRequest<typeof RoomsRequestSchema> = {}, call: CallOptions = {}) {
    return this.unary((r, o) => this.memory.rooms(r, o), RoomsRequestSchema, request, call);
  }

  relations(request: KnowledgeRequest<typeof RelationsRequestSchema> = {}, call: CallOptions = {}) {
    return this.unary((r, o) => this.memory.relations(r, o), RelationsRequestSchema, request, call);
  }

  policy(request: KnowledgeRequest<typeof PolicyRequestSchema> = {}, call: CallOptions = {}) {
    return this.unary((r, o) => this.memory.policy(r, o), PolicyRequestSchema, request, call);
  }

  consolidate(request: KnowledgeRequest<typeof ConsolidateRequestSchema> = {}, call: CallOptions = {}) {
    return this.unary((r, o) => this.memory.consolidate(r, o), ConsolidateRequestSchema, request, call);
  }

  restore(request: KnowledgeRequest<typeof RestoreRequestSchema> = {}, call: CallOptions = {}) {
    return this.unary((r, o) => this.memory.restore(r, o), RestoreRequestSchema, request, call);
  }

  // KnowledgeBaseService (kb.read): published, citable evidence, and answers from it.
  // `answerable: false` with `reasonCode: "NO_EVIDENCE"` is an answer; a dependency of the
  // service that is down or too slow rejects with Unavailable
  // (KNOWLEDGE_DEPENDENCY_UNAVAILABLE, `metadata.trace_id`), which this client does not retry.

  /** Retrieve: a question, or the whole request (`allTagCodes`, `anyTagCodes`, `topK`). */
  retrieve(request: string | KnowledgeRequest<typeof RetrieveRequestSchema>, call: TracedCallOptions = {}) {
    const init = typeof request === "string" ? { query: request } : request;
    return this.unary((r, o) => this.kb.retrieve(r, o), RetrieveRequestSchema, init, traced(call));
  }

  /** Answer: Retrieve's fields plus `templateCode` (the organisation's ACTIVE template). */
  answer(request: string | KnowledgeRequest<typeof AnswerRequestSchema>, call: TracedCallOptions = {}) {
    const init = typeof request === "string" ? { query: request } : request;
    return this.unary((r, o) => this.kb.answer(r, o), AnswerRequestSchema, init, traced(call));
  }

  // KnowledgeBaseAdminService (topics, revisions, sources, tasks, tags, feedback)

  createTopic(request: KnowledgeRequest<typeof CreateTopicRequestSchema> = {}, call: CallOptions = {}) {
    return this.unary((r, o) => this.kbAdmin.createTopic(r, o), CreateTopicRequestSchema, request, call);
  }

  listTopics(request: KnowledgeRequest<typeof ListTopicsRequestSchema> = {}, call: CallOptions = {}) {
    return this.unary((r, o) => this.kbAdmin.listTopics(r, o), ListTopicsRequestSchema, request, call);
  }

  getTopic(request: KnowledgeRequest<typeof GetTopicRequestSchema> = {}, call: CallOptions = {}) {
    return this.unary((r, o) => this.kbAdmin.getTopic(r, o), GetTopicRequestSchema, request, call);
  }

  createRevision(request: KnowledgeRequest<typeof CreateRevisionRequestSchema> = {}, call: CallOptions = {}) {
    return this.unary((r, o) => this.kbAdmin.createRevision(r, o), CreateRevisionRequestSchema, request, call);
  }

  getRevision(request: KnowledgeRequest<typeof GetRevisionRequestSchema> = {}, call: CallOptions = {}) {
    return this.unary((r, o) => this.kbAdmin.getRevision(r, o), GetRevisionRequestSchema, request, call);
  }

  updateRevision(request: KnowledgeRequest<typeof UpdateRevisionRequestSchema> = {}, call: CallOptions = {}) {
    return this.unary((r, o) => this.kbAdmin.updateRevision(r, o), UpdateRevisionRequestSchema, request, call);
  }

  uploadSource(request: KnowledgeRequest<typeof UploadSourceRequestSchema> = {}, call: CallOptions = {}) {
    return this.unary((r, o) => this.kbAdmin.uploadSource(r, o), UploadSourceRequestSchema, request, call);
  }

  putFaq(request: KnowledgeRequest<typeof PutFaqRequestSchema> = {}, call: CallOptions = {}) {
    return this.unary((r, o) => this.kbAdmin.putFaq(r, o), PutFaqRequestSchema, request, call);
  }

  removeSource(request: KnowledgeRequest<typeof RemoveSourceRequestSchema> = {}, call: CallOptions = {}) {
    return this.unary((r, o) => this.kbAdmin.removeSource(r, o), RemoveSourceRequestSchema, request, call);
  }

  submitRevision(request: KnowledgeRequest<typeof SubmitRevisionRequestSchema> = {}, call: CallOptions = {}) {
    return this.unary((r, o) => this.kbAdmin.submitRevision(r, o), SubmitRevisionRequestSchema, request, call);
  }

  approveRevision(request: KnowledgeRequest<typeof ApproveRevisionRequestSchema> = {}, call: CallOptions = {}) {
    return this.unary((r, o) => this.kbAdmin.approveRevision(r, o), ApproveRevisionRequestSchema, request, call);
  }

  returnRevision(request: KnowledgeRequest<typeof ReturnRevisionRequestSchema> = {}, call: CallOptions = {}) {
    return this.unary((r, o) => this.kbAdmin.returnRevision(r, o), ReturnRevisionRequestSchema, request, call);
  }

  processRevision(request: KnowledgeRequest<typeof ProcessRevisionRequestSchema> = {}, call: CallOptions = {}) {
    return this.unary((r, o) => this.kbAdmin.processRevision(r, o), ProcessRevisionRequestSchema, request, call);
  }

  retryTask(request: KnowledgeRequest<typeof RetryTaskRequestSchema> = {}, call: CallOptions = {}) {
    return this.unary((r, o) => this.kbAdmin.retryTask(r, o), RetryTaskRequestSchema, request, call);
  }

  cancelTask(request: KnowledgeRequest<typeof CancelTaskRequestSchema> = {}, call: CallOptions = {}) {
    return this.unary((r, o) => this.kbAdmin.cancelTask(r, o), CancelTaskRequestSchema, request, call);
  }

  watchTask(request: KnowledgeRequest<typeof WatchTaskRequestSchema> = {}, call: CallOptions = {}) {
    return this.stream((r, o) => this.kbAdmin.watchTask(r, o), WatchTaskRequestSchema, request, call);
  }

  publishRevision(request: KnowledgeRequest<typeof PublishRevisionRequestSchema> = {}, call: CallOptions = {}) {
    return this.unary((r, o) => this.kbAdmin.publishRevision(r, o), PublishRevisionRequestSchema, request, call);
  }

  rollbackTopic(request: KnowledgeRequest<typeof RollbackTopicRequestSchema> = {}, call: CallOptions = {}) {
    return this.unary((r, o) => this.kbAdmin.rollbackTopic(r, o), RollbackTopicRequestSchema, request, call);
  }

  offlineTopic(request: KnowledgeRequest<typeof OfflineTopicRequestSchema> = {}, call: CallOptions = {}) {
    return this.unary((r, o) => this.kbAdmin.offlineTopic(r, o), OfflineTopicRequestSchema, request, call);
  }

  reconcile(request: KnowledgeRequest<typeof ReconcileRequestSchema> = {}, call: CallOptions = {}) {
    return this.unary((r, o) => this.kbAdmin.reconcile(r, o), ReconcileRequestSchema, request, call);
  }

  createTag(request: KnowledgeRequest<typeof CreateTagRequestSchema> = {}, call: CallOptions = {}) {
    return this.unary((r, o) => this.kbAdmin.createTag(r, o), CreateTagRequestSchema, request, call);
  }

  updateTag(request: KnowledgeRequest<typeof UpdateTagRequestSchema> = {}, call: CallOptions = {}) {
    return this.unary((r, o) => this.kbAdmin.updateTag(r, o), UpdateTagRequestSchema, request, call);
  }

  listTags(request: KnowledgeRequest<typeof ListTagsRequestSchema> = {}, call: CallOptions = {}) {
    return this.unary((r, o) => this.kbAdmin.listTags(r, o), ListTagsRequestSchema, request, call);
  }

  putTemplate(request: KnowledgeRequest<typeof PutTemplateRequestSchema> = {}, call: CallOptions = {}) {
    return this.unary((r, o) => this.kbAdmin.putTemplate(r, o), PutTemplateRequestSchema, request, call);
  }

  listTemplates(request: KnowledgeRequest<typeof ListTemplatesRequestSchema> = {}, call: CallOptions = {}) {
    return this.unary((r, o) => this.kbAdmin.listTemplates(r, o), ListTemplatesRequestSchema, request, call);
  }

  createFeedback(request: KnowledgeRequest<typeof CreateFeedbackRequestSchema> = {}, call: CallOptions = {}) {
    return this.unary((r, o) => this.kbAdmin.createFeedback(r, o), CreateFeedbackRequestSchema, request, call);
  }

  listFeedback(request: KnowledgeRequest<typeof ListFeedbackRequestSchema> = {}, call: CallOptions = {}) {
    return this.unary((r, o) => this.kbAdmin.listFeedback(r, o), ListFeedbackRequestSchema, request, call);
  }

  resolveFeedback(request: KnowledgeRequest<typeof ResolveFeedbackRequestSchema> = {}, call: CallOptions = {}) {
    return this.unary((r, o) => this.kbAdmin.resolveFeedback(r, o), ResolveFeedbackRequestSchema, request, call);
  }

  getPolicy(request: KnowledgeRequest<typeof GetPolicyRequestSchema> = {}, call: CallOptions = {}) {
    return this.unary((r, o) => this.kbAdmin.getPolicy(r, o), GetPolicyRequestSchema, request, call);
  }

  setPolicy(request: KnowledgeRequest<typeof SetPolicyRequestSchema> = {}, call: CallOptions = {}) {
    return this.unary((r, o) => this.kbAdmin.setPolicy(r, o), SetPolicyRequestSchema, request, call);
  }
}
