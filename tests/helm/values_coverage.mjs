// Every value the chart's schema accepts must change what the chart renders: a value that
// changes nothing is a field the templates drop, and a user who sets it is misled.
//
//   node values_coverage.mjs --helm HELM --chart DIR --modules NODE_MODULES [--jobs N]
//
// Walks values.schema.json down to its leaves (a property without sub-properties: a scalar, a
// list, a map or a free-form object such as a Kubernetes Affinity), gives each leaf a valid
// value other than its default (MUTATIONS below, else one derived from the leaf's type), and
// renders the chart with `helm template` (as if cert-manager and Envoy Gateway were installed:
// --api-versions for both, so the objects of their APIs render) twice: with the leaf's
// prerequisites alone (PREREQUISITES: the values under which the leaf matters, e.g.
// autoscaling.enabled for the autoscaler's fields) and with the leaf changed as well. It fails
// naming every leaf whose change leaves the output identical, every leaf it has no value for,
// and every changed value the chart refuses. A leaf that only ever affects what the chart
// accepts (model.ringCapacity, which checks config.router.default-keep;
// router.exposeWithoutAuth, which accepts an exposed router without client authentication;
// image.flavor, which accepts GPU pods) is listed in REFUSALS with values under which the
// change must turn an accepted render into a refused one.
import { execFile } from "node:child_process";
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import { cpus, tmpdir } from "node:os";
import { join, resolve } from "node:path";

const args = process.argv.slice(2);
const option = (name, fallback) => {
  const at = args.indexOf(name);
  return at < 0 ? fallback : args[at + 1];
};
const helm = option("--helm");
const chart = option("--chart");
const modules = option("--modules");
if (!helm || !chart || !modules) {
  console.error("usage: node values_coverage.mjs --helm HELM --chart DIR --modules NODE_MODULES [--jobs N]");
  process.exit(2);
}
const jobs = Number(option("--jobs", Math.max(2, cpus().length)));
const YAML = createRequire(join(resolve(modules), "noop.js"))("yaml");
const schema = JSON.parse(readFileSync(join(chart, "values.schema.json"), "utf8"));
const defaults = YAML.parse(readFileSync(join(chart, "values.yaml"), "utf8"));

const SHA = "0123456789abcdef".repeat(4);
const ROLES = ["router", "prefill", "decode"];
const PROMETHEUS = "http://prometheus.monitoring.svc:9090";

// Values under which a leaf matters, by path prefix (the longest matching prefix wins; "*"
// stands for any one path segment). Both renders of a leaf get them.
const PREREQUISITES = {
  "*.autoscaling.": (role) => ({ [role]: { autoscaling: { enabled: true, keda: { serverAddress: PROMETHEUS } } } }),
  "*.autoscaling.keda.": (role) => ({ [role]: { autoscaling: { enabled: true, kind: "keda", keda: { serverAddress: PROMETHEUS } } } }),
  "*.autoscaling.enabled": () => ({}),
  "*.pdb.": (role) => ({ [role]: { replicas: 3 } }),
  // Two owners per value need two store pods.
  "config.kvstore.replication": () => ({ kvstore: { replicas: 3 } }),
  "*.pdb.maxUnavailable": (role) => ({ [role]: { replicas: 3, pdb: { minAvailable: "", maxUnavailable: 1 } } }),
  // GPU pods need the CUDA build of the image.
  "gpu.": () => ({ image: { flavor: "cuda" }, prefill: { gpus: 1, resources: GUARANTEED } }),
  "*.gpus": (role) => ({ image: { flavor: "cuda" }, [role]: { resources: GUARANTEED } }),
  "model.volume.": () => ({ model: { builtin: "", volume: { claimName: "weights" } } }),
  "model.volume.path": () => ({ model: { builtin: "", volume: { type: "hostPath", path: "/srv/models/a" } } }),
  "model.volume.type": () => ({ model: { builtin: "", volume: { claimName: "weights", path: "/srv/models/a" } } }),
  "model.volume.sizeLimit": () => ({ model: { builtin: "", volume: { type: "emptyDir" }, source: SOURCE } }),
  "model.volume.routerSizeLimit": () => ({ model: { builtin: "", volume: { type: "emptyDir" }, source: SOURCE } }),
  "model.source.": () => ({ model: { builtin: "", volume: { claimName: "weights" }, source: SOURCE } }),
  "model.source.endpoint": () => ({ model: { builtin: "", volume: { claimName: "weights" }, source: { ...SOURCE, uri: "s3://weights/ced" } } }),
  "model.source.job.": () => ({ model: { builtin: "", volume: { claimName: "weights" }, source: { ...SOURCE, job: { enabled: true } } } }),
  "model.source.job.enabled": () => ({ model: { builtin: "", volume: { claimName: "weights" }, source: SOURCE } }),
  "model.generateSizeLimit": () => ({ model: { generate: "small" } }),
  "model.generateResources": () => ({ model: { generate: "small" } }),
  // UCX between pods needs the rdma profile, or TCP allowed (the chart refuses ucx on tcp).
  "ucx.profile": () => ({ config: { router: { transport: "ucx" } }, ucx: { allowUnprotectedTcp: true } }),
  "config.router.transport": () => ({ ucx: { allowUnprotectedTcp: true } }),
  "ucx.rdma.": () => ({ config: { router: { transport: "ucx" } }, ucx: { profile: "rdma" } }),
  "router.service.type": () => ({ router: { exposeWithoutAuth: true } }),
  "router.service.externalTrafficPolicy": () => ({ router: { exposeWithoutAuth: true, service: { type: "LoadBalancer" } } }),
  "router.service.loadBalancerSourceRanges": () => ({ router: { exposeWithoutAuth: true, service: { type: "LoadBalancer" } } }),
  "router.ingress.": () => ({ router: { exposeWithoutAuth: true, ingress: { enabled: true, grpcHost: "grpc.example.com" } } }),
  "router.ingress.enabled": () => ({ router: { exposeWithoutAuth: true, ingress: { grpcHost: "grpc.example.com" } } }),
  "router.gateway.": () => ({ router: { exposeWithoutAuth: true, gateway: { enabled: true, parentRefs: [{ name: "edge" }] } } }),
  "router.gateway.enabled": () => ({ router: { exposeWithoutAuth: true, gateway: { parentRefs: [{ name: "edge" }] } } }),
  "router.gateway.envoyGateway.backendTrafficPolicy.": () => ({ router: { exposeWithoutAuth: true, gateway: { enabled: true, parentRefs: [{ name: "edge" }], envoyGateway: { backendTrafficPolicy: { enabled: true } } } } }),
  "router.gateway.envoyGateway.backendTrafficPolicy.enabled": () => ({ router: { exposeWithoutAuth: true, gateway: { enabled: true, parentRefs: [{ name: "edge" }] } } }),
  "metrics.serviceMonitor.": () => ({ metrics: { serviceMonitor: { enabled: true } } }),
  "router.clientTls.requireClientCert": () => ({ router: { clientTls: { secretName: "public-tls" } } }),
  "router.apiKeys.secretName": () => ({ tests: { apiKey: { secretName: "test-key" } } }),
  "router.apiKeys.key": () => ({ router: { apiKeys: { secretName: "api-keys" } }, tests: { apiKey: { secretName: "test-key" } } }),
  "tests.apiKey.": () => ({ router: { apiKeys: { secretName: "api-keys" } }, tests: { apiKey: { secretName: "test-key" } } }),
  "tests.clientCertSecretName": () => ({ router: { clientTls: { secretName: "public-tls", requireClientCert: true } } }),
  "tls.certManager.enabled": () => ({ tls: { existingSecrets: { router: "r", prefill: "p", decode: "d", kvstore: "k" } } }),
  "config.prefill.no-ucx": () => ({ config: { router: { transport: "grpc" } } }),
  "config.decode.no-ucx": () => ({ config: { router: { transport: "grpc" } } }),
  "model.generate": () => ({}),
  "monitoring.prometheusRule.": () => ({ monitoring: { prometheusRule: { enabled: true } } }),
  "monitoring.prometheusRule.enabled": () => ({}),
  "monitoring.dashboard.": () => ({ monitoring: { dashboard: { enabled: true } } }),
  "monitoring.dashboard.enabled": () => ({}),
};
const GUARANTEED = { requests: { cpu: "2", memory: "3Gi" }, limits: { cpu: "2", memory: "3Gi" } };
const SOURCE = { uri: "https://models.example.com/ced", files: { "config.json": SHA, "model.safetensors": SHA } };

// Changed values where the type alone does not give a valid one (patterns, clashes, relations).
const MUTATIONS = {
  "nameOverride": "ced",
  "fullnameOverride": "ced",
  "clusterDomain": "example.internal",
  "config.router.trace-sample-ratio": 0.25,
  "serviceAccountName": "baton",
  "serviceAccount.name": "baton-pods",
  "serviceAccount.annotations": { "example.com/owner": "serving" },
  "image.repository": "registry.example.com/baton",
  "image.tag": "9.9.9",
  "image.digest": `sha256:${SHA}`,
  "imagePullSecrets": [{ name: "registry" }],
  "extraEnv": [{ name: "UCX_LOG_LEVEL", value: "warn" }],
  "podSecurityContext": { runAsNonRoot: true, runAsUser: 20002 },
  "securityContext": { runAsUser: 20002, runAsGroup: 20002 },
  "tmpSizeLimit": "512Mi",
  "antiAffinityTopologyKey": "topology.kubernetes.io/zone",
  "model.generate": "small",
  "model.servedName": "ced-b",
  "model.generateSizeLimit": "2Gi",
  "model.generateResources": { requests: { cpu: "1", memory: "1Gi" } },
  "model.source.resources": { requests: { cpu: "1", memory: "512Mi" } },
  "model.volume.claimName": "weights-b",
  "model.volume.path": "/srv/models/b",
  "model.volume.subPath": "ced-1b",
  "model.volume.sizeLimit": "40Gi",
  "model.volume.routerSizeLimit": "2Gi",
  "model.volume.type": "hostPath",
  "model.source.uri": "hf://example/ced@main",
  "model.source.endpoint": "https://minio.example.com",
  "model.source.files": { "config.json": SHA, "model.safetensors": SHA, "tokenizer.model": SHA },
  "model.source.credentialsSecret": "model-credentials",
  "config.common.metrics-port": 9500,
  "config.common.health-port": 9501,
  "config.router.port": 50151,
  "config.router.internal-port": 50150,
  "config.router.http-port": 8080,
  "config.router.default-keep": 200,
  "config.router.stream-idle-timeout": "90s",
  "config.router.drain-timeout": "45s",
  "config.decode.speculative": "ngram",
  "config.prefill.port": 50152,
  "config.prefill.drain-timeout": "90s",
  "config.decode.port": 50153,
  "config.decode.stream-idle-timeout": "2m",
  "config.decode.drain-timeout": "300s",
  "config.kvstore.port": 50154,
  "config.kvstore.budget-bytes": 4294967296,
  "config.kvstore.replication": 2,
  "kvstore.replicas": 3,
  "config.router.heartbeat-ms": 400,
  "config.router.client-max-connection-age": "5m",
  "config.router.client-max-connection-age-grace": "10m",
  "ucx.rdma.resourceName": "rdma/hca",
  "ucx.rdma.networks": "rdma-net",
  "router.service.loadBalancerSourceRanges": ["10.0.0.0/8"],
  "config.router.http-trusted-proxies": ["10.244.0.0/16", "fd00::/8"],
  "router.ingress.className": "nginx",
  "router.ingress.annotations": { "nginx.ingress.kubernetes.io/limit-connections": "100" },
  "router.ingress.grpcHost": "grpc2.example.com",
  "router.ingress.httpHost": "api.example.com",
  "router.ingress.tls": [{ hosts: ["grpc.example.com"], secretName: "edge-tls" }],
  "router.gateway.parentRefs": [{ name: "edge", namespace: "gateway" }],
  "router.gateway.annotations": { "example.com/team": "serving" },
  "router.gateway.grpc.hostnames": ["grpc.example.com"],
  "router.gateway.http.hostnames": ["api.example.com"],
  "router.gateway.http.requestTimeout": "10m",
  "router.gateway.envoyGateway.backendTrafficPolicy.requestTimeout": "1h",
  "extraObjects": [{ apiVersion: "v1", kind: "ConfigMap", metadata: { name: "extra" }, data: { a: "b" } }],
  "*.extraVolumes": [{ name: "scratch", emptyDir: {} }],
  "*.extraVolumeMounts": [{ name: "tmp", mountPath: "/scratch" }],
  "*.extraContainers": [{ name: "sidecar", image: "registry.example.com/sidecar:1" }],
  "tls.certManager.enabled": false,
  "tls.certManager.issuerRef": { name: "baton-ca", kind: "ClusterIssuer" },
  "tls.certManager.duration": "720h",
  "tls.certManager.renewBefore": "240h",
  "tls.certManager.caDuration": "43800h",
  "tls.existingSecrets.router": "router-mtls",
  "tls.existingSecrets.prefill": "prefill-mtls",
  "tls.existingSecrets.decode": "decode-mtls",
  "tls.existingSecrets.kvstore": "kvstore-mtls",
  "tls.existingSecrets.client": "client-mtls",
  "networkPolicy.clientFrom": [{ namespaceSelector: { matchLabels: { "kubernetes.io/metadata.name": "gateway" } } }],
  "networkPolicy.metricsFrom": [{ namespaceSelector: { matchLabels: { "kubernetes.io/metadata.name": "monitoring" } } }],
  "ucx.tls": "rc,sm,self",
  "ucx.allowUnprotectedTcp": true,
  "ucx.netDevices": "eth0",
  "gpu.resourceName": "amd.com/gpu",
  "gpu.nodeSelector": { "accelerator": "h200" },
  "gpu.tolerations": [{ key: "dedicated", operator: "Equal", value: "gpu", effect: "NoSchedule" }],
  "gpu.runtimeClassName": "nvidia",
  "metrics.serviceMonitor.interval": "30s",
  "metrics.serviceMonitor.scrapeTimeout": "5s",
  "metrics.serviceMonitor.labels": { release: "prometheus" },
  "kvstore.persistence.size": "20Gi",
  "kvstore.persistence.storageClass": "fast-ssd",
  "kvstore.persistence.accessModes": ["ReadWriteOncePod"],
  "kvstore.persistence.existingClaim": "store-data",
  // The store's default spreads over zones already: spread over hosts instead.
  "kvstore.topologySpreadConstraints": [{ maxSkew: 1, topologyKey: "kubernetes.io/hostname", whenUnsatisfiable: "DoNotSchedule" }],
  "router.service.port": 443,
  "router.service.httpPort": 80,
  "router.service.annotations": { "service.beta.kubernetes.io/aws-load-balancer-type": "nlb" },
  "router.clientTls.secretName": "public-tls",
  "router.apiKeys.secretName": "api-keys",
  "router.apiKeys.key": "keys.yaml",
  "tests.apiKey.secretName": "other-test-key",
  "tests.apiKey.key": "token",
  "tests.clientCertSecretName": "client-cert",
  "monitoring.prometheusRule.labels": { release: "prometheus" },
  "monitoring.prometheusRule.runbookUrl": "https://git.example.com/baton/blob/main/docs/deploy.md",
  "monitoring.dashboard.labels": { grafana_dashboard: "2" },
  "monitoring.dashboard.annotations": { grafana_folder: "baton" },
  "*.replicas": (role) => (role === "router" ? 3 : 2),
  "*.resources": { requests: { cpu: "3", memory: "3Gi" } },
  "*.nodeSelector": { "baton.io/pool": "serving" },
  "*.tolerations": [{ key: "baton.io/dedicated", operator: "Exists", effect: "NoSchedule" }],
  "*.affinity": { nodeAffinity: { requiredDuringSchedulingIgnoredDuringExecution: { nodeSelectorTerms: [{ matchExpressions: [{ key: "pool", operator: "In", values: ["a"] }] }] } } },
  "*.podAnnotations": { "example.com/owner": "serving" },
  "*.podLabels": { "example.com/team": "serving" },
  "*.priorityClassName": "baton-serving",
  "*.extraArgs": ["--log-level=debug"],
  "*.runtimeClassName": "gvisor",
  "*.topologySpreadConstraints": [{ maxSkew: 1, topologyKey: "topology.kubernetes.io/zone", whenUnsatisfiable: "ScheduleAnyway" }],
  "*.rollingUpdate.maxSurge": "50%",
  "*.rollingUpdate.maxUnavailable": 1,
  "*.pdb.minAvailable": "50%",
  "*.pdb.maxUnavailable": "50%",
  "*.autoscaling.minReplicas": 3,
  "*.autoscaling.maxReplicas": 12,
  "*.autoscaling.behavior": { scaleUp: { stabilizationWindowSeconds: 30 } },
  "*.autoscaling.keda.serverAddress": "http://prometheus.example.com:9090",
};

// Leaves that change only what the chart accepts: the change must refuse a render that the
// values alone accept.
const REFUSALS = {
  "model.ringCapacity": {
    values: { model: { builtin: "", volume: { claimName: "weights" } }, config: { router: { "default-keep": 200 } } },
    change: 300,
  },
  "router.exposeWithoutAuth": {
    values: { router: { exposeWithoutAuth: true, service: { type: "LoadBalancer" } } },
    change: false,
  },
  "image.flavor": {
    values: { image: { flavor: "cuda" }, decode: { gpus: 1, resources: GUARANTEED } },
    change: "cpu",
  },
};

// Leaves that are not the chart's: Helm's own.
const SKIP = new Set(["global"]);

// --- The schema's leaves ----------------------------------------------------------------------
function resolveRef(node) {
  while (node && node.$ref) node = schema.definitions[node.$ref.replace("#/definitions/", "")];
  return node;
}

// The properties of an object node, allOf's included (their if/then parts only constrain).
function propertiesOf(node) {
  node = resolveRef(node);
  const props = { ...(node.properties ?? {}) };
  for (const part of node.allOf ?? []) Object.assign(props, propertiesOf(part));
  return props;
}

// The node's own shape, allOf's refs merged (for type, enum, bounds).
function shapeOf(node) {
  node = resolveRef(node);
  let shape = { ...node };
  for (const part of node.allOf ?? []) shape = { ...shapeOf(part), ...shape, allOf: undefined };
  return shape;
}

// Objects with properties that are still set whole: by definition, and by path.
const OPAQUE = new Set(["resources"]);
const OPAQUE_PATHS = new Set(["tls.certManager.issuerRef"]);

function leaves(node, path, out) {
  const ref = node.$ref?.replace("#/definitions/", "");
  const props = propertiesOf(node);
  if (Object.keys(props).length > 0 && !OPAQUE.has(ref) && !OPAQUE_PATHS.has(path)) {
    for (const [key, child] of Object.entries(props)) leaves(child, path ? `${path}.${key}` : key, out);
  } else {
    out.push({ path, shape: shapeOf(node) });
  }
  return out;
}

// --- Values -----------------------------------------------------------------------------------
const get = (object, path) => path.split(".").reduce((o, k) => (o === undefined || o === null ? undefined : o[k]), object);

function set(object, path, value) {
  const keys = path.split(".");
  let o = object;
  for (const k of keys.slice(0, -1)) o = o[k] ??= {};
  o[keys.at(-1)] = value;
  return object;
}

function deepMerge(a, b) {
  if (typeof a !== "object" || a === null || Array.isArray(a) || typeof b !== "object" || b === null || Array.isArray(b)) return b;
  const out = { ...a };
  for (const [k, v] of Object.entries(b)) out[k] = k in a ? deepMerge(a[k], v) : v;
  return out;
}

// The table entry for `path`: an exact key, else one with "*" standing for the first segment;
// for prefix tables (PREREQUISITES) the longest key that `path` starts with.
function lookup(table, path, prefix) {
  const [first, ...rest] = path.split(".");
  const starred = ["*", ...rest].join(".");
  let best = null;
  for (const key of Object.keys(table)) {
    for (const candidate of [path, starred]) {
      const hit = prefix ? (key.endsWith(".") ? candidate.startsWith(key) : candidate === key) : candidate === key;
      if (hit && (!best || key.length > best.length)) best = key;
    }
  }
  if (!best) return undefined;
  const entry = table[best];
  return typeof entry === "function" ? entry(first) : entry;
}

// A valid value other than `current` from the leaf's type, or undefined.
function derive(shape, current) {
  const types = [].concat(shape.type ?? []);
  if (shape.enum) return shape.enum.find((v) => v !== current && v !== "");
  if (types.includes("boolean")) return !current;
  if (types.includes("integer") || types.includes("number")) {
    const integer = types.includes("integer");
    if (current === undefined) return shape.maximum !== undefined && shape.maximum < 7 ? shape.maximum : 7;
    if (!integer && (shape.maximum ?? shape.exclusiveMaximum) === 1) return (current + 1) / 2;
    const up = current + 1;
    return shape.maximum === undefined || up <= shape.maximum ? up : current - 1;
  }
  if (types.includes("string") && !shape.pattern && !shape.oneOf) return `${current ?? ""}x`;
  return undefined;
}

// --- Rendering --------------------------------------------------------------------------------
const work = mkdtempSync(join(tmpdir(), "baton-values-coverage-"));
let files = 0;
function render(values) {
  const file = join(work, `values-${files++}.json`);
  writeFileSync(file, JSON.stringify(values));
  return new Promise((done) => {
    execFile(helm, ["template", "baton", chart, "--namespace", "baton", "--kube-version", "1.30.0",
                    "--api-versions", "cert-manager.io/v1", "--api-versions", "gateway.envoyproxy.io/v1alpha1",
                    "-f", file],
             { maxBuffer: 64 << 20 }, (error, stdout, stderr) => {
      done(error ? { error: (stderr || error.message).trim().split("\n").slice(-1)[0] } : { output: stdout });
    });
  });
}
const baselines = new Map();  // by prerequisite values: one render each
function baseline(values) {
  const key = JSON.stringify(values);
  if (!baselines.has(key)) baselines.set(key, render(values));
  return baselines.get(key);
}

async function check(leaf) {
  const { path, shape } = leaf;
  const refusal = REFUSALS[path];
  if (refusal) {
    const before = await baseline(refusal.values);
    const after = await render(set(structuredClone(refusal.values), path, refusal.change));
    if (before.error) return `${path}: the values that should be accepted are refused: ${before.error}`;
    if (!after.error) return `${path}: changing it to ${JSON.stringify(refusal.change)} was meant to be refused and was not`;
    return null;
  }
  const prerequisites = lookup(PREREQUISITES, path, true) ?? {};
  const current = get(deepMerge(defaults, prerequisites), path);
  let changed = lookup(MUTATIONS, path, false);
  if (changed === undefined) changed = derive(shape, current);
  if (changed === undefined) return `${path}: no changed value known (add one to MUTATIONS in values_coverage.mjs)`;
  if (JSON.stringify(changed) === JSON.stringify(current)) return `${path}: its changed value equals its default`;
  const before = await baseline(prerequisites);
  if (before.error) return `${path}: its prerequisites ${JSON.stringify(prerequisites)} are refused: ${before.error}`;
  const after = await render(set(structuredClone(prerequisites), path, changed));
  if (after.error) return `${path}: ${JSON.stringify(changed)} is refused: ${after.error}`;
  if (after.output === before.output) {
    return `${path}: setting it to ${JSON.stringify(changed)} (default ${JSON.stringify(current)}) changes nothing the chart renders`;
  }
  return null;
}

const all = leaves(schema, "", []).filter((l) => !SKIP.has(l.path));
const problems = [];
let next = 0;
await Promise.all(Array.from({ length: jobs }, async () => {
  while (next < all.length) {
    const leaf = all[next++];
    const problem = await check(leaf);
    if (problem) problems.push(problem);
  }
}));
rmSync(work, { recursive: true, force: true });
for (const p of problems.sort()) console.error(`dropped or untested value: ${p}`);
console.log(`values_coverage: ${all.length} schema leaves, ${all.length - problems.length} change the rendered chart, ${problems.length} do not`);
process.exit(problems.length > 0 ? 1 : 0);
