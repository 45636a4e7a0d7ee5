// The API's shapes under readable names, all taken from the generated description
// (./generated/openapi.ts): a change of the API shows here as a type error.
import type { components, operations } from "./generated/openapi.js";

type Schemas = components["schemas"];

/** A lifecycle command, as `POST /v1/commands` takes it: a union narrowed by `op`. */
export type Command = Schemas["Command"];
/** The ops a command can name. */
export type Op = Command["op"];
/** A command of one op: `CommandOf<"activate_revision">`. */
export type CommandOf<O extends Op> = Extract<Command, { op: O }>;
/** What a revision runs. */
export type Spec = Schemas["Spec"];
/** A namespace, workload, revision or host name: a DNS label. */
export type Name = Schemas["Name"];
/** `202` of `POST /v1/commands`. */
export type Accepted = Schemas["Accepted"];
/** What happened to one command (`GET /v1/commands/{id}` and its `wait`). */
export type CommandStatus = Schemas["CommandStatus"];
/** `pending`, `running`, `succeeded`, `failed` or `rejected`. */
export type CommandState = CommandStatus["status"];
/** The answer of `POST /v1/commands/{id}/cancel`. */
export type CancelAnswer = Schemas["CancelAnswer"];
/** One record of a host's audit log. */
export type LogRecord = Schemas["LogRecord"];
/** The kinds of record. */
export type RecordKind = LogRecord["kind"];
/** `GET /v1/hosts`. */
export type Hosts = Schemas["Hosts"];
/** One host of `GET /v1/hosts`. */
export type HostEntry = Hosts["hosts"][number];
/** A host's heartbeat (`capstan.v1.beat.<host>`), as its agent signed it. */
export type HostBeat = Schemas["HostBeat"];
/** The running intent a host rebuilt from its log (`GET /v1/hosts/{host}/intent`). */
export type Intent = Schemas["Intent"];
/** A host's status (`GET /v1/hosts/{host}/status`). */
export type HostStatus = Schemas["Status"];
/** A page of a host's records from the central stream (`GET /v1/hosts/{host}/events`). */
export type Events = Schemas["Events"];
/** A page of the host's own copy of its log (`GET /v1/hosts/{host}/log`). */
export type HostLog = Schemas["HostLog"];
/** The host's log against its published copy (`GET /v1/hosts/{host}/verify`). */
export type Verdict = Schemas["Verdict"];
/** A host's registered public keys. */
export type HostKeys = Schemas["HostKeys"];
/** A protocol error code (a command refused or failed). */
export type ErrorCode = Schemas["ErrorCode"];
/** Every code an error answer of the API can carry. */
export type ApiErrorCode = Schemas["ApiError"]["error"]["code"];
/** `GET /healthz`. */
export type Health = operations["getHealth"]["responses"][200]["content"]["application/json"];
