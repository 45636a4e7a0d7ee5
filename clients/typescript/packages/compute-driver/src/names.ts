// The controller's identities as capstan names. capstan names a namespace, workload,
// revision and host with a DNS label (1-63 of [a-z0-9-], a letter or digit at each
// end); the controller's ids may be anything. An id that is a label already is kept
// as it is (so operators see the same name on both sides); any other gets a readable
// part and a hash of the whole id, so two ids never share a name.
import { createHash } from "node:crypto";

const LABEL = /^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$/;

/** The capstan name for a controller id: the id itself when it is a DNS label, else
 * `<its label-safe part, at most 45 chars>-<16 hex of its SHA-256>`. */
export function capstanName(id: string): string {
  if (id.length === 0) throw new RangeError("an identity cannot be empty");
  if (LABEL.test(id)) return id;
  const readable = id
    .toLowerCase()
    .replace(/[^a-z0-9-]+/g, "-")
    .replace(/^-+|-+$/g, "")
    .slice(0, 45)
    .replace(/-+$/, "");
  const hash = createHash("sha256").update(id, "utf8").digest("hex").slice(0, 16);
  return readable ? `${readable}-${hash}` : `id-${hash}`;
}
