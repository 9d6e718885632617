// Typed errors: every failed call surfaces as a subclass of KnowledgeError. The server
// sends a google.rpc.Status in the `grpc-status-details-bin` trailer; its ErrorInfo
// gives `reason` and `metadata`, an EditionRefusal (PERMISSION_DENIED for an RPC the
// server's edition lacks) gives the refusal's fields. `requestId` is the `x-request-id`
// the server sent back, the id of the call's line in the server log.

import { Code, ConnectError } from "@connectrpc/connect";
import { ErrorInfoSchema } from "./gen/google/rpc/error_details_pb.js";
import { EditionRefusalSchema } from "./gen/knowledge/v1/errors_pb.js";

export interface ErrorFields {
  code: Code;
  message: string;
  reason: string;
  metadata: Record<string, string>;
  requestId: string;
  cause?: unknown;
}

/** A failed call. `code` is the gRPC status code (`Code` of @connectrpc/connect). */
export class KnowledgeError extends Error {
  readonly code: Code;
  readonly reason: string;
  readonly metadata: Record<string, string>;
  readonly requestId: string;

  constructor(fields: ErrorFields) {
    super(fields.message, { cause: fields.cause });
    this.name = new.target.name;
    this.code = fields.code;
    this.reason = fields.reason;
    this.metadata = fields.metadata;
    this.requestId = fields.requestId;
  }
}

/** INVALID_ARGUMENT: the request breaks a documented rule (`metadata.field` names it). */
export class InvalidRequest extends KnowledgeError {}
/** UNAUTHENTICATED: no bearer token, or one the server does not know. */
export class Unauthenticated extends KnowledgeError {}
/** PERMISSION_DENIED: the caller's role or workspaces do not allow the call. */
export class PermissionDenied extends KnowledgeError {}
/** NOT_FOUND: the episode, chunk or item does not exist (or is outside the caller's scope). */
export class NotFound extends KnowledgeError {}
/** FAILED_PRECONDITION: e.g. an index that is not built yet. */
export class FailedPrecondition extends KnowledgeError {}
/** RESOURCE_EXHAUSTED: a quota, a size limit or a full disk. */
export class ResourceExhausted extends KnowledgeError {}
/** UNIMPLEMENTED: the server does not have the capability. */
export class Unimplemented extends KnowledgeError {}
/** DEADLINE_EXCEEDED: the call did not finish within `deadlineMs`. */
export class DeadlineExceeded extends KnowledgeError {}
/** UNAVAILABLE: the service could not be reached. */
export class Unavailable extends KnowledgeError {}
/** INTERNAL: a server bug; only the request id is told (see the server log). */
export class InternalError extends KnowledgeError {}
/** CANCELED: the caller aborted the call. */
export class Cancelled extends KnowledgeError {}

/** The server's edition lacks the feature the RPC needs (PERMISSION_DENIED with an
 * `EditionRefusal` detail; reason `KNOWLEDGE_EDITION_REQUIRED`). */
export class EditionRefused extends PermissionDenied {
  readonly feature: string;
  readonly requiredEdition: string;
  readonly currentEdition: string;
  readonly licenceState: string;
  readonly method: string;

  constructor(
    fields: ErrorFields & {
      feature: string;
      requiredEdition: string;
      currentEdition: string;
      licenceState: string;
      method: string;
    },
  ) {
    super(fields);
    this.feature = fields.feature;
    this.requiredEdition = fields.requiredEdition;
    this.currentEdition = fields.currentEdition;
    this.licenceState = fields.licenceState;
    this.method = fields.method;
  }
}

const BY_CODE: Partial<Record<Code, new (fields: ErrorFields) => KnowledgeError>> = {
  [Code.InvalidArgument]: InvalidRequest,
  [Code.Unauthenticated]: Unauthenticated,
  [Code.PermissionDenied]: PermissionDenied,
  [Code.NotFound]: NotFound,
  [Code.FailedPrecondition]: FailedPrecondition,
  [Code.ResourceExhausted]: ResourceExhausted,
  [Code.Unimplemented]: Unimplemented,
  [Code.DeadlineExceeded]: DeadlineExceeded,
  [Code.Unavailable]: Unavailable,
  [Code.Internal]: InternalError,
  [Code.Canceled]: Cancelled,
};

/** The typed error for anything a call threw (a ConnectError or another error). A call
 * whose caller aborted it (``signal``, whatever reason it gave) is ``Cancelled``: Connect
 * reads an abort reason that is not an AbortError as an unknown failure, which would be
 * taken for a server bug. */
export function toKnowledgeError(err: unknown, signal?: AbortSignal): KnowledgeError {
  if (err instanceof KnowledgeError) {
    return err;
  }
  if (signal?.aborted && !(err instanceof ConnectError && err.code === Code.DeadlineExceeded)) {
    return new Cancelled({
      code: Code.Canceled,
      message: `the call was cancelled by its caller${describe(signal.reason)}`,
      reason: "",
      metadata: {},
      requestId: "",
      cause: err,
    });
  }
  const ce = ConnectError.from(err);
  let reason = "";
  let metadata: Record<string, string> = {};
  for (const info of ce.findDetails(ErrorInfoSchema)) {
    reason = info.reason;
    metadata = { ...info.metadata };
  }
  const fields: ErrorFields = {
    code: ce.code,
    message: ce.rawMessage,
    reason,
    metadata,
    requestId: ce.metadata.get("x-request-id") ?? "",
    cause: err,
  };
  const [refusal] = ce.findDetails(EditionRefusalSchema);
  if (refusal !== undefined) {
    return new EditionRefused({
      ...fields,
      message: refusal.message || fields.message,
      reason: reason || "KNOWLEDGE_EDITION_REQUIRED",
      feature: refusal.feature,
      requiredEdition: refusal.requiredEdition,
      currentEdition: refusal.currentEdition,
      licenceState: refusal.licenceState,
      method: refusal.method,
    });
  }
  if (!reason && (ce.code === Code.Internal || ce.code === Code.Unknown) && fromTheNetwork(err)) {
    // The connection failed (a TLS handshake with a plain-text server, a reset): the
    // service was not reached, which is not a server bug.
    return new Unavailable({ ...fields, code: Code.Unavailable });
  }
  const cls = BY_CODE[ce.code] ?? KnowledgeError;
  return new cls(fields);
}

/** Whether ``err`` or one of its causes is a socket or TLS error of Node's. */
function fromTheNetwork(err: unknown): boolean {
  let seen: unknown = err;
  for (let i = 0; i < 8 && seen instanceof Error; i += 1) {
    const code = (seen as { code?: unknown }).code;
    if (typeof code === "string" && /^(E[A-Z]+|ERR_(SSL|TLS)_\w+)$/.test(code)) {
      return true;
    }
    seen = (seen as { cause?: unknown }).cause;
  }
  return false;
}


function describe(reason: unknown): string {
  if (reason instanceof Error && reason.name !== "AbortError") {
    return `: ${reason.message}`;
  }
  return typeof reason === "string" && reason ? `: ${reason}` : "";
}
