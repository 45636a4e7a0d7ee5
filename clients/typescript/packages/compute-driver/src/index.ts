// @capstan/compute-driver: the controller's compute driver on capstan hosts.
export { CapstanComputeDriver } from "./driver.js";
export type {
  ComputeDriverOptions,
  Done,
  HookFailure,
  HostResult,
  NamespaceRef,
  PrepareInput,
  Prepared,
  RevisionRef,
  Target,
} from "./driver.js";
export { capstanName } from "./names.js";
