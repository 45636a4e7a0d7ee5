// Command ids. The agent never carries an id out twice: a command sent again under
// its id is answered from the host's log. So an id made from what the caller means —
// the command's content, the caller's own key for the operation, and which attempt
// this is — lets a controller that crashed and came back ask again and be answered,
// instead of doing the work a second time; and an id is never used for other content.
import { createHash, randomBytes } from "node:crypto";
import type { Command } from "./types.js";

/** Fields that are not part of what a command asks (docs/protocol.md, the content an
 * id is bound to leaves out `issued_at` and `sig`; `id` and `v` name it). */
const NOT_CONTENT = new Set(["id", "v", "issued_at", "sig"]);

export interface IdOptions {
  /**
   * The caller's own name for the operation: what makes two operations with the same
   * content two commands (a workload stopped, started and stopped again; a rollback to
   * a revision that ran before). Use something the caller keeps durably — a deployment
   * id, an operation id. Required and not empty (`RangeError`): with no key, the
   * same content would be the same operation, and a rollback to a revision that ran
   * before would be answered from the host's log instead of run.
   */
  key: string;
  /** Which attempt (0, 1, …): a retry of a command that failed retryably is a new
   * command, so it needs a new id (docs/protocol.md: "sent again under a new id"). */
  attempt?: number | undefined;
}

/**
 * The id for `command` (its `id`, `v`, `issued_at` and `sig` left out): `<op>.<32 hex
 * of SHA-256>.a<attempt>`, e.g. `activate-revision.5f0c…e1.a0`. Deterministic: the
 * same content, key and attempt always give the same id; any difference gives another.
 */
export function commandId(command: Command, options: IdOptions): string {
  const key: unknown = options?.key;
  if (typeof key !== "string" || key === "") {
    throw new RangeError(
      "commandId needs a key for the operation (not empty): the same content under no key would be answered with an earlier operation's outcome",
    );
  }
  const attempt = options.attempt ?? 0;
  if (!Number.isSafeInteger(attempt) || attempt < 0) {
    throw new RangeError(`attempt must be a non-negative integer, not ${attempt}`);
  }
  const content = canonicalJson(command, NOT_CONTENT);
  const digest = createHash("sha256")
    .update(`capstan-intent-v1\n${key}\n${attempt}\n${content}`)
    .digest("hex");
  return `${command.op.replaceAll("_", "-")}.${digest.slice(0, 32)}.a${attempt}`;
}

/** A fresh random id (`c-<16 hex>`, as the coordinator makes one), for a command
 * submitted without one: made here, so that asking again after a lost answer sends
 * the same id. */
export function randomId(): string {
  return `c-${randomBytes(8).toString("hex")}`;
}

/** JSON with object keys sorted at every depth and `undefined` members left out;
 * `skip` names top-level keys to leave out. */
export function canonicalJson(value: unknown, skip: ReadonlySet<string> = new Set()): string {
  return JSON.stringify(sorted(value, skip));
}

function sorted(value: unknown, skip: ReadonlySet<string>): unknown {
  if (Array.isArray(value)) return value.map((v) => sorted(v, new Set()));
  if (value !== null && typeof value === "object") {
    const out: Record<string, unknown> = {};
    for (const key of Object.keys(value).sort()) {
      const member = (value as Record<string, unknown>)[key];
      if (skip.has(key) || member === undefined) continue;
      out[key] = sorted(member, new Set());
    }
    return out;
  }
  return value;
}
