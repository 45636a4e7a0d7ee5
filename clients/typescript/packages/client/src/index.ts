// @capstan/client: the capstan coordinator's HTTP API for TypeScript (Node 20+).
export { CapstanClient, MAX_PAGE } from "./client.js";
export type {
  CallOptions,
  ClientOptions,
  LogOptions,
  PageOptions,
  RolloutTemplate,
  SubmitOptions,
  WaitOptions,
} from "./client.js";
export { CapstanError, isCapstanError } from "./errors.js";
export type { CapstanCode, CapstanErrorInit, ClientCode, HookFailure } from "./errors.js";
export { canonicalJson, commandId, randomId } from "./ids.js";
export type { IdOptions } from "./ids.js";
export { sleep, withRetry } from "./retry.js";
export type { RetryPolicy } from "./retry.js";
export type { RolloutOptions, RolloutProgress, RolloutResult, RolloutSummary } from "./rollout.js";
export type * from "./types.js";
export type { components, operations, paths } from "./generated/openapi.js";
