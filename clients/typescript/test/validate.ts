// Every answer of the coordinator checked against its OpenAPI description: a fetch
// wrapper that finds the operation (method and path template), the response for the
// status, and validates the JSON body against its schema (JSON Schema 2020-12, as
// OpenAPI 3.1 uses). A mismatch throws, so the test making the request fails.

import { readFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { Ajv2020, type ValidateFunction } from "ajv/dist/2020.js";
import addFormats from "ajv-formats";

/** The spec the coordinator serves (test/build/validate.js → the repository). */
const DEFAULT_SPEC = fileURLToPath(new URL("../../../../coordinator/src/openapi.json", import.meta.url));

/** The $id the spec's components are added under, so that its `#/components/…` refs resolve. */
const SPEC_ID = "https://capstan.invalid/openapi.json";

type Schema = Record<string, unknown>;

interface ResponseObject {
  content?: Record<string, { schema?: Schema }>;
}

interface Operation {
  responses?: Record<string, ResponseObject>;
}

interface OpenApi {
  paths: Record<string, Record<string, Operation | undefined>>;
  components?: Record<string, unknown>;
}

export interface ValidatingFetch {
  /** `fetch`, throwing when an answer does not match the spec. */
  fetch: typeof fetch;
  /** How many JSON bodies were validated so far. */
  checked(): number;
}

/** A fetch that validates every answer of the coordinator against `specPath`. */
export function validatingFetch(specPath: string = DEFAULT_SPEC): ValidatingFetch {
  const validator = new SpecValidator(JSON.parse(readFileSync(specPath, "utf8")) as OpenApi);
  let checked = 0;
  const validating = async (input: string | URL | Request, init?: RequestInit): Promise<Response> => {
    const res = await fetch(input, init);
    const method = (init?.method ?? (input instanceof Request ? input.method : "GET")).toUpperCase();
    const url = new URL(input instanceof Request ? input.url : input);
    if (await validator.check(method, url.pathname, res)) checked += 1;
    return res;
  };
  return { fetch: validating, checked: () => checked };
}

/** A path template of the spec, split into segments (`{param}` matches any one). */
interface Route {
  template: string;
  segments: string[];
  literals: number;
}

class SpecValidator {
  private readonly ajv = new Ajv2020({ strict: false, allErrors: true });
  private readonly routes: Route[];
  private readonly compiled = new Map<string, ValidateFunction>();

  constructor(private readonly spec: OpenApi) {
    addFormats.default(this.ajv);
    // The whole components object under one $id: a schema's `#/components/schemas/X`
    // rewritten to `SPEC_ID#/components/schemas/X` resolves there, and the refs
    // inside the components resolve against the same base.
    this.ajv.addSchema({ $id: SPEC_ID, components: spec.components ?? {} });
    this.routes = Object.keys(spec.paths).map((template) => {
      const segments = template.split("/");
      return { template, segments, literals: segments.filter((s) => !isParam(s)).length };
    });
  }

  /**
   * Checks one answer; true when a JSON body was validated. Throws for an answer
   * the spec does not allow: an unknown operation answering JSON, a status the
   * operation does not list, a body not matching its schema, or not JSON where
   * only JSON is described.
   */
  async check(method: string, pathname: string, res: Response): Promise<boolean> {
    if (method === "HEAD") return false; // No body to check.
    const route = this.route(pathname);
    const covered = pathname.startsWith("/v1/") || pathname === "/healthz" || route !== undefined;
    if (!covered) return false;
    const json = isJson(res.headers.get("content-type"));
    const where = `${method} ${pathname} answered ${res.status}`;
    const operation =
      route === undefined ? undefined : this.spec.paths[route.template]?.[method.toLowerCase()];
    if (route === undefined || operation === undefined) {
      if (json) throw new Error(`${where} with JSON, but the spec has no operation ${method} for that path`);
      return false;
    }
    const [statusKey, response] = findResponse(operation, res.status);
    if (response === undefined) {
      const listed = Object.keys(operation.responses ?? {}).join(", ");
      throw new Error(
        `${where}: a status the spec does not list for ${method} ${route.template} (it lists ${listed})`,
      );
    }
    const content = response.content ?? {};
    const schema = content["application/json"]?.schema;
    if (!json) {
      const types = Object.keys(content);
      if (types.length > 0 && types.every(isJson)) {
        const type = res.headers.get("content-type") ?? "no Content-Type";
        throw new Error(
          `${where} with ${type}, but the spec describes only ${types.join(", ")} for ${statusKey}`,
        );
      }
      return false; // Not JSON, as described (the metrics' text).
    }
    if (schema === undefined) {
      throw new Error(`${where} with JSON, but the spec describes no JSON body for ${statusKey}`);
    }
    const body: unknown = await res.clone().json();
    const validate = this.validator(`${method} ${route.template} ${statusKey}`, schema);
    if (!validate(body)) {
      const errors = this.ajv.errorsText(validate.errors, { separator: "\n  ", dataVar: "body" });
      throw new Error(
        `${where}: the body does not match the spec's schema (${method} ${route.template}, ${statusKey}):\n  ${errors}\n` +
          `body: ${JSON.stringify(body).slice(0, 2000)}`,
      );
    }
    return true;
  }

  /** The template matching `pathname`; the most literal one when several do. */
  private route(pathname: string): Route | undefined {
    const segments = pathname.split("/");
    let best: Route | undefined;
    for (const route of this.routes) {
      if (route.segments.length !== segments.length) continue;
      const matches = route.segments.every((s, i) => (isParam(s) ? segments[i] !== "" : s === segments[i]));
      if (matches && (best === undefined || route.literals > best.literals)) best = route;
    }
    return best;
  }

  private validator(key: string, schema: Schema): ValidateFunction {
    let validate = this.compiled.get(key);
    if (validate === undefined) {
      validate = this.ajv.compile(rebase(schema));
      this.compiled.set(key, validate);
    }
    return validate;
  }
}

/** The response for `status`: exact, then `4XX`-style, then `default`. */
function findResponse(operation: Operation, status: number): [string, ResponseObject | undefined] {
  const responses = operation.responses ?? {};
  for (const key of [String(status), `${Math.floor(status / 100)}XX`, "default"]) {
    const response = responses[key];
    if (response !== undefined) return [key, response];
  }
  return [String(status), undefined];
}

/** A copy of `schema` whose local refs (`#/…`) point into the spec's $id. */
function rebase<T>(schema: T): T {
  if (Array.isArray(schema)) return schema.map(rebase) as T;
  if (schema === null || typeof schema !== "object") return schema;
  const copy: Record<string, unknown> = {};
  for (const [key, value] of Object.entries(schema)) {
    copy[key] =
      key === "$ref" && typeof value === "string" && value.startsWith("#")
        ? `${SPEC_ID}${value}`
        : rebase(value);
  }
  return copy as T;
}

function isParam(segment: string): boolean {
  return segment.startsWith("{") && segment.endsWith("}");
}

function isJson(contentType: string | null): boolean {
  if (contentType === null) return false;
  const type = contentType.split(";")[0]?.trim().toLowerCase() ?? "";
  return type === "application/json" || type.endsWith("+json");
}
