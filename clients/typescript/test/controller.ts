// A controller process for the crash test (driver.test.ts): activates r2 of crash/web
// on $HOST under operation key deploy-2 and says `submitted <id>` on stdout as soon as
// the coordinator took its command, then never hears another answer (its requests
// hang), so the test's SIGKILL lands mid-call, before it learns the outcome.
import { CapstanClient } from "@capstan/client";
import { CapstanComputeDriver } from "@capstan/compute-driver";

const url = process.env["CAPSTAN_URL"]!;
const token = process.env["CAPSTAN_TOKEN"]!;
const host = process.env["HOST"]!;

let announced = false;

async function announcing(request: Request): Promise<Response> {
  if (announced) {
    setInterval(() => {}, 60_000); // stays up, waiting, until killed
    return new Promise<Response>(() => {});
  }
  const sent = request.method === "POST" && new URL(request.url).pathname === "/v1/commands";
  const body = sent ? ((await request.clone().json()) as { id: string }) : undefined;
  const response = await fetch(request);
  if (body && response.status === 202) {
    announced = true;
    process.stdout.write(`submitted ${body.id}\n`);
  }
  return response;
}

const client = new CapstanClient({ baseUrl: url, token, fetch: announcing });
const driver = new CapstanComputeDriver({ client });
await driver.activateRevision({
  namespace: "crash",
  workload: "web",
  revision: "r2",
  hosts: [host],
  operationKey: "deploy-2",
});
throw new Error("the controller was to be killed before its call ended");
