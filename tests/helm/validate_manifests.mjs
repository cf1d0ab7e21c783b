// Validates rendered Kubernetes manifests offline:
//   node validate_manifests.mjs --modules DIR [--metrics FILE] [--options TABLE]... FILE...
// DIR is a node_modules folder holding this folder's package.json dependencies. --metrics names
// a file listing, one per line, the Prometheus metric names the binaries export (chart_test.sh
// collects them from the sources); autoscalers may then scale only on those.
//
// Each object is checked four ways, and every failure is reported as "FILE: Kind/name: ...":
//  1. its kind's JSON schema (kubernetes-models, generated from the Kubernetes OpenAPI spec;
//     @kubernetes-models/prometheus-operator for ServiceMonitor, @kubernetes-models/cert-manager
//     for Certificate and Issuer, @kubernetes-models/keda for ScaledObject,
//     @kubernetes-models/gateway-api for GRPCRoute and HTTPRoute, generated from the Gateway
//     API project's CRDs; Envoy Gateway's BackendTrafficPolicy, which no package models, from
//     envoy-gateway-backendtrafficpolicy.schema.json beside this file, a closed subset of its
//     CRD): types, required fields, enums, formats. A kind without a schema is an error.
//  2. unknown fields, which the OpenAPI schemas let through but the API server drops or
//     refuses: the field names come from the same packages' type declarations (.d.ts).
//  3. references between objects: selectors that select nothing, Service target ports and
//     probe ports the pods do not declare, volume mounts without a volume, $(VAR) references
//     to variables the container does not define, a StatefulSet's missing governing Service,
//     NetworkPolicies that select no pod or open ports the pods do not declare, a role's
//     Certificate whose Secret the pods of that role do not mount, a CA Issuer whose Secret no
//     Certificate writes; autoscalers (HorizontalPodAutoscaler, KEDA ScaledObject) whose
//     scaleTargetRef names no workload, whose workload still sets spec.replicas (helm upgrade
//     would undo the autoscaler), that share a workload, with min above max, or on metrics the
//     binaries do not export; PodDisruptionBudgets that protect nothing (every pod may go) or
//     block every eviction (no pod may go); a preStop sleep the grace period does not cover;
//     Ingress and Gateway API route backends that are no Service port of the manifests; a
//     BackendTrafficPolicy whose target is no route of the manifests.
//  4. baton's config file (a ConfigMap key "baton.yaml"): with --options (each a binary's
//     --print-options), sections and keys the binaries accept (their long flag names), lists
//     where a flag takes several values and scalars elsewhere, so that a typo cannot reach a pod.
//  5. the chart's pods (label app.kubernetes.io/part-of: baton): each names its ServiceAccount
//     and mounts no token, as does every ServiceAccount of the chart; when the chart renders
//     its own account, every pod runs as it except the pre-install/upgrade/rollback hooks, which
//     run before the release's objects exist, so a hook pod may only use an account that is a
//     hook of each of its phases with a lower weight; and every container that runs a baton
//     binary runs one image, a digest reference (NAME@sha256:<64 hex>) carrying no tag.
import { readFileSync, existsSync } from "node:fs";
import { createRequire } from "node:module";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";

const args = process.argv.slice(2);
const option = (name) => {
  const at = args.indexOf(name);
  if (at < 0) return undefined;
  const value = args[at + 1];
  args.splice(at, 2);
  return value;
};
const modulesOption = option("--modules");
const metricsOption = option("--metrics");
const optionFiles = [];
for (let file = option("--options"); file !== undefined; file = option("--options")) optionFiles.push(file);
if (modulesOption === undefined || args.length === 0) {
  console.error("usage: node validate_manifests.mjs --modules NODE_MODULES [--metrics FILE] FILE...");
  process.exit(2);
}
const modules = resolve(modulesOption);
const files = args;
// The metric names the binaries export, or null when not given.
const exportedMetrics = metricsOption === undefined ? null
  : new Set(readFileSync(metricsOption, "utf8").split("\n").map((l) => l.trim()).filter(Boolean));
const requireModule = createRequire(join(modules, "noop.js"));
const YAML = requireModule("yaml");

// The keys each section of baton.yaml may hold, from the binaries' tables of options (each
// --options FILE is one binary's --print-options): its section holds its long flag names, and
// `common` any binary's. Null without tables: the keys go unchecked.
const tables = optionFiles.map((f) => JSON.parse(readFileSync(f, "utf8")));
const BATON_CONFIG_KEYS = tables.length === 0 ? null : { common: [] };
// Keys that take a list of values (a repeatable flag).
const BATON_LIST_KEYS = [];
for (const table of tables) {
  const names = table.options.map((o) => o.name);
  BATON_CONFIG_KEYS[table.section] = names;
  BATON_CONFIG_KEYS.common.push(...names);
  for (const o of table.options) if (o.list) BATON_LIST_KEYS.push(o.name);
}

// Where a kind's model lives: kubernetes-models/<group>/<version>/<Kind>.js ("v1" for the core
// group), CRDs in their own packages.
function modelPath(apiVersion, kind) {
  if (apiVersion === "monitoring.coreos.com/v1") {
    return join(modules, "@kubernetes-models/prometheus-operator", apiVersion, `${kind}.js`);
  }
  if (apiVersion === "cert-manager.io/v1") {
    return join(modules, "@kubernetes-models/cert-manager", apiVersion, `${kind}.js`);
  }
  if (apiVersion === "keda.sh/v1alpha1") {
    return join(modules, "@kubernetes-models/keda", apiVersion, `${kind}.js`);
  }
  if (apiVersion.startsWith("gateway.networking.k8s.io/")) {
    return join(modules, "@kubernetes-models/gateway-api", apiVersion, `${kind}.js`);
  }
  return join(modules, "kubernetes-models", apiVersion, `${kind}.js`);
}

// --- Field names from the .d.ts declarations --------------------------------------------
// A declaration file holds one interface, `export interface IName [extends TypeMeta] {`, with
// members `"name"?: Type;` (4-space indent; map types span lines as `{ [key: string]: T; }`).
// An interface may also extend an imported one (cert-manager's IssuerSpec extends IssuerConfig
// and declares nothing itself): its fields and their types' imports are inherited.
const declarations = new Map();

function declaration(file) {
  if (declarations.has(file)) return declarations.get(file);
  const text = readFileSync(file, "utf8").replace(/\/\*\*[\s\S]*?\*\//g, "");
  const imports = new Map();
  for (const m of text.matchAll(/^import \{ ([^}]+) \} from "([^"]+)";$/gm)) {
    const spec = m[2];
    const target = spec.startsWith(".")
      ? resolve(dirname(file), spec.replace(/\.js$/, ".d.ts"))
      : join(modules, `${spec.replace(/\.js$/, "")}.d.ts`);
    for (const name of m[1].split(",")) imports.set(name.trim(), target);
  }
  const body = text.match(/^export interface \w+(?: extends ([\w, ]+))? \{\n([\s\S]*?)^\}$/m);
  let result = null;
  if (body) {
    const fields = new Map();
    let open = false;
    for (const parent of (body[1] ?? "").split(",").map((n) => n.trim())) {
      const file = imports.get(parent);
      const inherited = file && existsSync(file) ? declaration(file) : null;
      if (!inherited) continue;
      for (const [k, v] of inherited.fields) fields.set(k, v);
      for (const [k, v] of inherited.imports) if (!imports.has(k)) imports.set(k, v);
      open ||= inherited.open;
    }
    const lines = body[2].split("\n");
    for (let i = 0; i < lines.length; ++i) {
      const m = lines[i].match(/^ {4}"([^"]+)"\??: (.*)$/);
      if (!m) continue;
      let type = m[2];
      if (type === "{") {
        const inner = lines[i + 1].match(/^\s*\[key: string\]: (.*);$/);
        type = inner ? `map:${inner[1]}` : "any";
        while (i < lines.length && !/^ {4}\};$/.test(lines[i])) ++i;
      }
      fields.set(m[1], type.replace(/;$/, ""));
    }
    open ||= /^ {4}\[key: string\]/m.test(body[2]);
    result = { fields, imports, open };
  }
  declarations.set(file, result);
  return result;
}

// Walks `value` against a type expression from a declaration in `owner`, reporting fields that
// the type does not declare.
function checkFields(value, type, owner, path, errors) {
  if (value === null || value === undefined) return;
  const array = type.match(/^Array<(.+)>$/);
  if (array) {
    if (Array.isArray(value)) value.forEach((v, i) => checkFields(v, array[1], owner, `${path}[${i}]`, errors));
    return;
  }
  if (type.startsWith("map:")) {
    if (typeof value === "object") {
      for (const [k, v] of Object.entries(value)) checkFields(v, type.slice(4), owner, `${path}.${k}`, errors);
    }
    return;
  }
  const file = owner.imports.get(type);
  if (!file || !existsSync(file)) return;  // a primitive, an enum, or a type alias
  const decl = declaration(file);
  if (decl) checkObject(value, decl, path, errors);
}

function checkObject(value, decl, path, errors) {
  if (typeof value !== "object" || Array.isArray(value)) return;  // the schema reports the type
  for (const [key, child] of Object.entries(value)) {
    const type = decl.fields.get(key);
    if (type === undefined) {
      if (!decl.open) errors.push(`${path ? `${path}.` : ""}${key}: unknown field`);
      continue;
    }
    checkFields(child, type, decl, path ? `${path}.${key}` : key, errors);
  }
}

// --- Schema validation ----------------------------------------------------------------------
// Kinds no package models, by "apiVersion kind": a JSON schema file beside this script.
const LOCAL_SCHEMAS = {
  "gateway.envoyproxy.io/v1alpha1 BackendTrafficPolicy": "envoy-gateway-backendtrafficpolicy.schema.json",
};
const localValidators = new Map();

function checkLocalSchema(object, schemaFile) {
  if (!localValidators.has(schemaFile)) {
    const Ajv = requireModule("ajv").default;
    const schema = JSON.parse(readFileSync(join(dirname(fileURLToPath(import.meta.url)), schemaFile), "utf8"));
    localValidators.set(schemaFile, new Ajv({ allErrors: true }).compile(schema));
  }
  const validate = localValidators.get(schemaFile);
  if (validate(object)) return [];
  return validate.errors.map((e) => `schema: ${e.instancePath || "/"} ${e.message}` +
    (e.params?.additionalProperty ? `: ${e.params.additionalProperty} (unknown field)` : ""));
}

async function checkSchema(object) {
  const local = LOCAL_SCHEMAS[`${object.apiVersion} ${object.kind}`];
  if (local) return checkLocalSchema(object, local);
  const file = modelPath(object.apiVersion, object.kind);
  if (!existsSync(file)) return [`no schema for ${object.apiVersion} ${object.kind}`];
  const module = await import(pathToFileURL(file).href);
  const Model = module[object.kind];
  const errors = [];
  try {
    new Model(object).validate();
  } catch (e) {
    errors.push(`schema: ${e.message.replace(/\s+/g, " ")}`);
  }
  const decl = declaration(file.replace(/\.js$/, ".d.ts"));
  if (decl) checkObject(object, decl, "", errors);
  return errors;
}

// --- References between objects --------------------------------------------------------
const POD_OWNERS = new Set(["Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job"]);

function podTemplates(objects) {
  const pods = [];
  for (const o of objects) {
    if (POD_OWNERS.has(o.kind)) pods.push({ owner: o, labels: o.spec?.template?.metadata?.labels ?? {}, spec: o.spec?.template?.spec ?? {} });
    if (o.kind === "Pod") pods.push({ owner: o, labels: o.metadata?.labels ?? {}, spec: o.spec ?? {} });
  }
  return pods;
}

const matches = (selector, labels) => Object.entries(selector ?? {}).every(([k, v]) => labels?.[k] === v);
const containersOf = (spec) => [...(spec.initContainers ?? []), ...(spec.containers ?? [])];

function checkReferences(objects, report) {
  const pods = podTemplates(objects);
  const services = objects.filter((o) => o.kind === "Service");
  const configMaps = new Set(objects.filter((o) => o.kind === "ConfigMap").map((o) => o.metadata?.name));

  for (const pod of pods) {
    const o = pod.owner;
    if (o.kind !== "Pod" && !matches(o.spec?.selector?.matchLabels, pod.labels)) {
      report(o, "spec.selector.matchLabels: does not match the pod template's labels");
    }
    if (o.kind === "StatefulSet") {
      const governing = services.find((s) => s.metadata?.name === o.spec?.serviceName);
      if (!governing) report(o, `spec.serviceName: no Service named ${o.spec?.serviceName}`);
      else if (governing.spec?.clusterIP !== "None") report(o, `spec.serviceName: Service ${o.spec.serviceName} is not headless`);
    }
    const volumes = new Set([...(pod.spec.volumes ?? []).map((v) => v.name),
                             ...(o.spec?.volumeClaimTemplates ?? []).map((c) => c.metadata?.name)]);
    for (const v of pod.spec.volumes ?? []) {
      if (v.configMap && !configMaps.has(v.configMap.name)) report(o, `volume ${v.name}: no ConfigMap named ${v.configMap.name}`);
    }
    for (const c of containersOf(pod.spec)) {
      for (const m of c.volumeMounts ?? []) {
        if (!volumes.has(m.name)) report(o, `container ${c.name}: volumeMount ${m.name} has no volume`);
      }
      const env = new Set((c.env ?? []).map((e) => e.name));
      for (const arg of [...(c.command ?? []), ...(c.args ?? [])]) {
        for (const ref of String(arg).matchAll(/\$\(([A-Za-z_][A-Za-z0-9_]*)\)/g)) {
          if (!env.has(ref[1])) report(o, `container ${c.name}: $(${ref[1]}) is not an environment variable of the container`);
        }
      }
      const ports = new Set((c.ports ?? []).map((p) => p.containerPort));
      for (const probe of ["startupProbe", "readinessProbe", "livenessProbe"]) {
        const port = c[probe]?.grpc?.port;
        if (port !== undefined && !ports.has(port)) report(o, `container ${c.name}: ${probe}.grpc.port ${port} is not a container port`);
      }
    }
  }

  for (const s of services) {
    const selector = s.spec?.selector;
    if (!selector || Object.keys(selector).length === 0) continue;
    const selected = pods.filter((p) => matches(selector, p.labels));
    if (selected.length === 0) {
      report(s, "spec.selector: selects no pod template");
      continue;
    }
    for (const port of s.spec?.ports ?? []) {
      const target = port.targetPort ?? port.port;
      const found = selected.some((p) => (p.spec.containers ?? []).some((c) => (c.ports ?? []).some(
        (cp) => (typeof target === "string" ? cp.name === target : cp.containerPort === target))));
      if (!found) report(s, `port ${port.name ?? port.port}: targetPort ${target} is not a port of the selected pods`);
    }
  }

  checkAutoscalers(objects, report);

  // A PodDisruptionBudget must select pods, and between none and all of them must be allowed
  // to go: integers are checked against the workload's replicas (its autoscaler's minimum when
  // it has none), percentages at 0% and 100%.
  for (const o of objects.filter((x) => x.kind === "PodDisruptionBudget")) {
    const selected = pods.filter((p) => matches(o.spec?.selector?.matchLabels, p.labels));
    if (selected.length === 0) {
      report(o, "spec.selector: selects no pod template");
      continue;
    }
    const count = selected.reduce((n, p) => n + (p.owner.kind === "Pod" ? 1 : fewestReplicas(objects, p.owner)), 0);
    const { minAvailable, maxUnavailable } = o.spec ?? {};
    if (minAvailable === 0 || minAvailable === "0%" || maxUnavailable === "100%" ||
        (Number.isInteger(maxUnavailable) && maxUnavailable >= count)) {
      report(o, `lets all ${count} selected pods go at once: the budget protects nothing`);
    }
    if (minAvailable === "100%" || maxUnavailable === 0 || maxUnavailable === "0%" ||
        (Number.isInteger(minAvailable) && minAvailable >= count)) {
      report(o, `lets none of the ${count} selected pods go: every eviction (node drain) would hang`);
    }
  }

  // A preStop sleep must end well inside the grace period, or SIGKILL comes before the drain.
  for (const pod of pods) {
    const grace = pod.spec.terminationGracePeriodSeconds ?? 30;
    for (const c of pod.spec.containers ?? []) {
      const command = c.lifecycle?.preStop?.exec?.command ?? [];
      if (command[0] === "/bin/sleep" && Number(command[1]) >= grace) {
        report(pod.owner, `container ${c.name}: preStop sleeps ${command[1]} s, not less than terminationGracePeriodSeconds ${grace}`);
      }
    }
  }

  // NetworkPolicies: spec.podSelector must select pods (matchLabels only; an empty selector
  // selects every pod), and each ingress port must be one the selected pods declare (a
  // number, or a container port's name).
  for (const o of objects.filter((x) => x.kind === "NetworkPolicy")) {
    const selected = pods.filter((p) => matches(o.spec?.podSelector?.matchLabels, p.labels));
    if (selected.length === 0) {
      report(o, "spec.podSelector: selects no pod template");
      continue;
    }
    for (const [i, rule] of (o.spec?.ingress ?? []).entries()) {
      for (const port of rule.ports ?? []) {
        if (port.port === undefined || port.endPort !== undefined) continue;
        const found = selected.some((p) => containersOf(p.spec).some((c) => (c.ports ?? []).some(
          (cp) => (typeof port.port === "string" ? cp.name === port.port : cp.containerPort === port.port))));
        if (!found) report(o, `spec.ingress[${i}]: port ${port.port} is not a container port of the selected pods`);
      }
    }
  }

  // cert-manager: a Certificate labelled with a component (a role) must be mounted, as a secret
  // volume, by the pods of that role when the manifests hold any; a CA Issuer's Secret must be
  // written by a Certificate with isCA.
  const certificates = objects.filter((x) => x.kind === "Certificate");
  for (const o of certificates) {
    const component = o.metadata?.labels?.["app.kubernetes.io/component"];
    if (!component || o.spec?.isCA) continue;
    const rolePods = pods.filter((p) => p.labels["app.kubernetes.io/component"] === component);
    if (rolePods.length === 0) continue;
    const mounting = rolePods.filter((p) => (p.spec.volumes ?? []).some((v) => v.secret?.secretName === o.spec?.secretName));
    if (mounting.length < rolePods.length) {
      report(o, `spec.secretName ${o.spec?.secretName}: not a secret volume of every ${component} pod`);
    }
  }
  for (const o of objects.filter((x) => x.kind === "Issuer" || x.kind === "ClusterIssuer")) {
    const secret = o.spec?.ca?.secretName;
    if (secret && !certificates.some((c) => c.spec?.isCA && c.spec?.secretName === secret)) {
      report(o, `spec.ca.secretName: no CA Certificate writes Secret ${secret}`);
    }
  }

  // Ingresses and Gateway API routes: every backend is a Service of the manifests, on one of
  // its ports (by name or number).
  const backend = (o, where, name, port) => {
    const s = services.find((x) => x.metadata?.name === name);
    if (!s) report(o, `${where}: no Service named ${name}`);
    else if (!(s.spec?.ports ?? []).some((p) => (typeof port === "string" ? p.name === port : p.port === port))) {
      report(o, `${where}: Service ${name} has no port ${port}`);
    }
  };
  for (const o of objects.filter((x) => x.kind === "Ingress")) {
    for (const [i, rule] of (o.spec?.rules ?? []).entries()) {
      for (const [j, path] of (rule.http?.paths ?? []).entries()) {
        const b = path.backend?.service;
        if (b) backend(o, `spec.rules[${i}].http.paths[${j}].backend`, b.name, b.port?.name ?? b.port?.number);
      }
    }
  }
  for (const o of objects.filter((x) => x.kind === "GRPCRoute" || x.kind === "HTTPRoute")) {
    for (const [i, rule] of (o.spec?.rules ?? []).entries()) {
      for (const [j, ref] of (rule.backendRefs ?? []).entries()) {
        if ((ref.kind ?? "Service") === "Service" && !ref.namespace) backend(o, `spec.rules[${i}].backendRefs[${j}]`, ref.name, ref.port);
      }
    }
  }

  // Envoy Gateway policies attach to routes of the manifests (a policy on a missing route does
  // nothing, silently).
  for (const o of objects.filter((x) => x.kind === "BackendTrafficPolicy")) {
    for (const [i, ref] of (o.spec?.targetRefs ?? []).entries()) {
      const found = objects.some((r) => r.kind === ref.kind && r.metadata?.name === ref.name &&
                                        String(r.apiVersion).startsWith(`${ref.group}/`));
      if (!found) report(o, `spec.targetRefs[${i}]: no ${ref.group} ${ref.kind} named ${ref.name}`);
    }
  }

  checkChartPods(objects, pods, report);

  for (const o of objects.filter((x) => x.kind === "ServiceMonitor")) {
    const selected = services.filter((s) => matches(o.spec?.selector?.matchLabels, s.metadata?.labels));
    if (selected.length === 0) report(o, "spec.selector: selects no Service");
    for (const e of o.spec?.endpoints ?? []) {
      if (e.port && !selected.some((s) => (s.spec?.ports ?? []).some((p) => p.name === e.port))) {
        report(o, `endpoint port ${e.port}: no selected Service has a port of that name`);
      }
    }
  }
}

// --- The chart's own pods ---------------------------------------------------------------------
const PRE_HOOKS = ["pre-install", "pre-upgrade", "pre-rollback"];
const hookPhases = (o) => String(o.metadata?.annotations?.["helm.sh/hook"] ?? "").split(",")
  .map((p) => p.trim()).filter(Boolean);
const hookWeight = (o) => Number(o.metadata?.annotations?.["helm.sh/hook-weight"] ?? 0);
const ofChart = (labels) => labels?.["app.kubernetes.io/part-of"] === "baton";
const DIGEST_REFERENCE = /^[^@]+@sha256:[0-9a-f]{64}$/;

// ServiceAccounts and images of the pods labelled app.kubernetes.io/part-of: baton (see 5 at
// the top). baton never calls the Kubernetes API, so no account or pod mounts a token. A Helm
// pre-install hook runs before the release's objects are created: a hook pod running as the
// release's account would wait for an account that comes only after it, and the install hangs.
function checkChartPods(objects, pods, report) {
  const accounts = objects.filter((o) => o.kind === "ServiceAccount");
  for (const a of accounts.filter((x) => ofChart(x.metadata?.labels))) {
    if (a.automountServiceAccountToken !== false) report(a, "automountServiceAccountToken: not false, though baton never calls the Kubernetes API");
  }
  const own = accounts.find((a) => ofChart(a.metadata?.labels) && hookPhases(a).length === 0);
  let image = null;  // the first baton container's image and where it was seen
  for (const pod of pods.filter((p) => ofChart(p.labels))) {
    const o = pod.owner;
    const name = pod.spec.serviceAccountName;
    if (!name) report(o, "spec.serviceAccountName: not set, so the pod runs as whatever the namespace's \"default\" is");
    if (pod.spec.automountServiceAccountToken !== false) report(o, "spec.automountServiceAccountToken: not false, though baton never calls the Kubernetes API");
    const phases = hookPhases(o).filter((p) => PRE_HOOKS.includes(p));
    const account = accounts.find((a) => a.metadata?.name === name);
    if (phases.length === 0) {
      if (own && name && name !== own.metadata?.name) report(o, `spec.serviceAccountName: ${name}, not the chart's ServiceAccount ${own.metadata?.name}`);
    } else if (account && (!phases.every((p) => hookPhases(account).includes(p)) || hookWeight(account) >= hookWeight(o))) {
      report(o, `spec.serviceAccountName: ${name} is not a ${phases.join(",")} hook of a lower weight than this one, so it does not exist yet when the hook runs`);
    }
    for (const c of containersOf(pod.spec)) {
      if (!String(c.command?.[0] ?? "").startsWith("/usr/local/bin/")) continue;
      const ref = String(c.image ?? "");
      if (ref.includes("@") && (!DIGEST_REFERENCE.test(ref) || /:[^/]*@/.test(ref))) {
        report(o, `container ${c.name}: image ${ref} is not NAME@sha256:<64 hex digits> (a digest reference carries no tag)`);
      }
      if (!image) image = { ref, where: `${o.kind}/${o.metadata?.name}` };
      else if (ref !== image.ref) report(o, `container ${c.name}: image ${ref} is not ${image.ref}, the image of ${image.where}`);
    }
  }
}

// --- Autoscalers ----------------------------------------------------------------------------
const WORKLOADS = new Set(["Deployment", "StatefulSet", "ReplicaSet"]);

// A workload's replicas, or the minimum of the autoscaler that owns it (1 when neither says).
function fewestReplicas(objects, workload) {
  if (workload.spec?.replicas !== undefined) return workload.spec.replicas;
  const scaler = objects.find((a) => scalerTarget(a) && scalerTarget(a).kind === workload.kind &&
                                     scalerTarget(a).name === workload.metadata?.name);
  if (scaler?.kind === "HorizontalPodAutoscaler") return scaler.spec?.minReplicas ?? 1;
  if (scaler?.kind === "ScaledObject") return scaler.spec?.minReplicaCount ?? 0;
  return 1;
}

function scalerTarget(o) {
  if (o.kind === "HorizontalPodAutoscaler" || o.kind === "ScaledObject") {
    const ref = o.spec?.scaleTargetRef ?? {};
    return { apiVersion: ref.apiVersion ?? "apps/v1", kind: ref.kind ?? "Deployment", name: ref.name };
  }
  return null;
}

// HorizontalPodAutoscalers and KEDA ScaledObjects: the workload they scale exists and leaves
// its replicas to them, one autoscaler per workload, min <= max, and (with --metrics) every
// metric is one the binaries export: HPA metric names, and the metric names in KEDA's
// Prometheus queries.
function checkAutoscalers(objects, report) {
  const owners = new Map();
  for (const o of objects.filter((x) => scalerTarget(x))) {
    const target = scalerTarget(o);
    const workload = objects.find((w) => WORKLOADS.has(w.kind) && w.kind === target.kind &&
                                         w.apiVersion === target.apiVersion && w.metadata?.name === target.name);
    if (!workload) {
      report(o, `spec.scaleTargetRef: no ${target.apiVersion} ${target.kind} named ${target.name}`);
    } else if (workload.spec?.replicas !== undefined) {
      report(o, `spec.scaleTargetRef: ${target.kind}/${target.name} sets spec.replicas, which every helm upgrade would reset under the autoscaler`);
    }
    const key = `${target.kind}/${target.name}`;
    if (owners.has(key)) report(o, `spec.scaleTargetRef: ${key} is scaled by ${owners.get(key)} too`);
    owners.set(key, `${o.kind}/${o.metadata?.name}`);
    const [min, max] = o.kind === "ScaledObject"
      ? [o.spec?.minReplicaCount ?? 0, o.spec?.maxReplicaCount ?? 100]
      : [o.spec?.minReplicas ?? 1, o.spec?.maxReplicas];
    if (max !== undefined && min > max) report(o, `min replicas ${min} above max replicas ${max}`);
    const metrics = [];
    if (o.kind === "HorizontalPodAutoscaler") {
      if ((o.spec?.metrics ?? []).length === 0) report(o, "spec.metrics: empty (the HPA would fall back to CPU, which baton pods are not sized for)");
      for (const m of o.spec?.metrics ?? []) {
        const source = m.pods ?? m.external ?? m.object;
        if (source?.metric?.name) metrics.push(source.metric.name);
      }
    } else {
      const triggers = o.spec?.triggers ?? [];
      if (triggers.length === 0) report(o, "spec.triggers: empty");
      for (const [i, t] of triggers.entries()) {
        if (t.type !== "prometheus") continue;
        for (const field of ["serverAddress", "query", "threshold"]) {
          if (typeof t.metadata?.[field] !== "string" || t.metadata[field] === "") {
            report(o, `spec.triggers[${i}].metadata.${field}: a prometheus trigger needs it (a string)`);
          }
        }
        if (typeof t.metadata?.threshold === "string" && !(Number(t.metadata.threshold) > 0)) {
          report(o, `spec.triggers[${i}].metadata.threshold: ${t.metadata.threshold} is not a positive number`);
        }
        for (const name of String(t.metadata?.query ?? "").matchAll(/\bbaton_[a-z0-9_]+/g)) metrics.push(name[0]);
      }
    }
    if (exportedMetrics) {
      for (const name of metrics) {
        if (!exportedMetrics.has(name)) report(o, `metric ${name}: no baton binary exports it`);
      }
    }
  }
}

// --- baton's config file ------------------------------------------------------------------
function checkBatonConfig(configMap, report) {
  const text = configMap.data?.["baton.yaml"];
  if (text === undefined) return;
  let config;
  try {
    config = YAML.parse(text);
  } catch (e) {
    report(configMap, `baton.yaml: not YAML: ${e.message}`);
    return;
  }
  for (const [section, values] of Object.entries(BATON_CONFIG_KEYS === null ? {} : config ?? {})) {
    const allowed = BATON_CONFIG_KEYS[section];
    if (!allowed) {
      report(configMap, `baton.yaml: unknown section ${section}`);
      continue;
    }
    for (const [key, value] of Object.entries(values ?? {})) {
      if (!allowed.includes(key)) report(configMap, `baton.yaml: ${section}.${key} is not a flag of that section`);
      else if (BATON_LIST_KEYS.includes(key)) {
        if (!Array.isArray(value) || value.some((v) => typeof v !== "string")) {
          report(configMap, `baton.yaml: ${section}.${key} must be a list of strings`);
        }
      } else if (value === null || typeof value === "object") report(configMap, `baton.yaml: ${section}.${key} must be a scalar`);
    }
  }
  // A downloaded model lives in the directory its files' digests name, and each role checks
  // the files it fetched (issue 49: a rollback must not serve the weights an upgrade left).
  const model = String(config?.common?.model ?? "");
  const sourced = /^\/models\/[0-9a-f]{64}\/baton$/.test(model);
  for (const section of ["router", "prefill", "decode", "kvstore"]) {
    const files = config?.[section]?.["model-file"];
    if (files === undefined) {
      if (sourced) report(configMap, `baton.yaml: ${section}.model-file: missing for the downloaded model ${model}`);
      continue;
    }
    if (!sourced) report(configMap, `baton.yaml: ${section}.model-file without a downloaded model (common.model ${model})`);
    for (const file of files ?? []) {
      if (!/^[^/=]+=[0-9a-f]{64}$/.test(file)) report(configMap, `baton.yaml: ${section}.model-file: ${file} is not NAME=SHA256`);
    }
    if (!(files ?? []).some((f) => f.startsWith("config.json="))) {
      report(configMap, `baton.yaml: ${section}.model-file does not check config.json`);
    }
  }
  if (sourced && !config?.kvstore?.["model-file"]?.some((f) => f.startsWith("model.safetensors=")) &&
      !/^[0-9a-f]{64}$/.test(String(config?.kvstore?.["weights-sha256"] ?? ""))) {
    report(configMap, "baton.yaml: kvstore: neither fetches model.safetensors nor names its digest (weights-sha256)");
  }
}

// --- Main ---------------------------------------------------------------------------------
let failures = 0;
for (const file of files) {
  const objects = [];
  const documents = YAML.parseAllDocuments(readFileSync(file, "utf8"));
  for (const doc of documents) {
    if (doc.errors.length > 0) {
      console.error(`${file}: YAML error: ${doc.errors[0].message}`);
      ++failures;
      continue;
    }
    const object = doc.toJS();
    if (object !== null && object !== undefined) objects.push(object);
  }
  const report = (o, message) => {
    console.error(`${file}: ${o.kind ?? "?"}/${o.metadata?.name ?? "?"}: ${message}`);
    ++failures;
  };
  for (const object of objects) {
    if (typeof object.apiVersion !== "string" || typeof object.kind !== "string") {
      report(object, "apiVersion and kind are required");
      continue;
    }
    for (const error of await checkSchema(object)) report(object, error);
    if (object.kind === "ConfigMap") checkBatonConfig(object, report);
  }
  checkReferences(objects, report);
  const kinds = {};
  for (const o of objects) kinds[o.kind] = (kinds[o.kind] ?? 0) + 1;
  console.log(`${file}: ${objects.length} objects (${Object.entries(kinds).map(([k, n]) => `${n} ${k}`).join(", ")})`);
}
if (failures > 0) {
  console.error(`${failures} problem(s) found`);
  process.exit(1);
}
