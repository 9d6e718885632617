export * from "./client.js";
export * from "./errors.js";
export { Code } from "@connectrpc/connect";
// The generated messages and service descriptors, for callers who need the types.
export * as docgraph from "./gen/knowledge/v1/docgraph_pb.js";
export * as dispatch from "./gen/knowledge/v1/dispatch_pb.js";
export * as errors from "./gen/knowledge/v1/errors_pb.js";
export * as index from "./gen/knowledge/v1/index_service_pb.js";
export * as kbAdmin from "./gen/knowledge/v1/kb_admin_pb.js";
export * as kbRetrieve from "./gen/knowledge/v1/kb_retrieve_pb.js";
export * as memory from "./gen/knowledge/v1/memory_pb.js";
export * as service from "./gen/knowledge/v1/knowledge_service_pb.js";
export * as search from "./gen/knowledge/v1/search_pb.js";
