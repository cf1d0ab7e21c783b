// The chart's pods as processes on this machine (chart_run_test.sh): reads what `helm template`
// rendered and writes, under OUT, what starting each pod's containers here takes:
//
//   OUT/plan.json   {skip, roles: [{name, component, steps: [{argv, env}]}], test: {argv, env},
//                    certs: [{dir, uris, dns, ca}], ports: {...}, apiKey}
//   OUT/plan.sh     the same as bash variables (plan_skip, plan_role_name[i], ...), sourced by
//                   chart_run_test.sh
//   OUT/<pod>/...   the pod's volumes: its ConfigMap's files (baton.yaml rewritten), emptyDirs
//
// Every container runs as the chart wrote it: its command, its args and its env, with its
// volumes' mount paths mapped to local directories, the image's paths (/usr/local/bin,
// /usr/local/share/baton) to this build's and this tree's, and the addresses and ports
// rewritten to local ones: every listening port a free port of 127.0.0.1 (each pod has its own
// network namespace in a cluster, so their ports may repeat there and not here), each Service
// name to 127.0.0.1 and the port of what it selects, $(POD_IP) to 127.0.0.1. Nothing else in
// baton.yaml or on a command line changes. Secrets get a throwaway PKI with the names the chart's
// Certificates (or csi-driver volumes) give them; a Secret the release does not issue
// (tls.existingSecrets, router.clientTls) gets spiffe://baton/<component> as docs/deploy.md
// asks, and every server certificate also names 127.0.0.1, which clients here dial.
//
// A release this machine cannot run says why in plan.skip: CUDA pods, RDMA transports, a model
// downloaded from the network.
//
// With CHART_RUN_IMAGE set (an image name), the pods run as containers of that image instead:
// paths stay as the pods see them, and each step lists its volumes as mounts ([mountPath,
// local folder, readOnly]) for `docker run -v`; ports and addresses are rewritten the same way,
// since the containers share the host's network.
//
//   node chart_run.mjs NODE_MODULES RENDERED.yaml OUT BUILD_DIR REPO_ROOT
// NODE_MODULES holds this folder's package.json dependencies (chart_test.sh installs them).
import fs from "node:fs";
import { createRequire } from "node:module";
import net from "node:net";
import path from "node:path";

const [modules, rendered, out, buildDir, repoRoot] = process.argv.slice(2);
const image = process.env.CHART_RUN_IMAGE ?? "";
const YAML = createRequire(path.resolve(modules, "noop.js"))("yaml");
const docs = YAML.parseAllDocuments(fs.readFileSync(rendered, "utf8"))
  .map((d) => d.toJS())
  .filter((d) => d && d.kind);

function binaryPath(name) {
  const where = { "baton-router": "router", "baton-prefill": "prefill_node",
                  "baton-decode": "decode_node", "baton-kvstore": "kvstore",
                  batonctl: "tools", baton: "tools" }[name];
  if (!where) throw new Error(`no local build of the image's /usr/local/bin/${name}`);
  return path.join(buildDir, where, name);
}

// Ports for the pods' listeners. They stay free for a few seconds before the pods bind them, and
// the suite beside this test makes thousands of outgoing connections meanwhile, each taking a
// port of the kernel's ephemeral range: so these come from below that range, where only
// listeners that name their port live, each checked free and none given twice.
const ephemeralLow = Number(
  fs.readFileSync("/proc/sys/net/ipv4/ip_local_port_range", "utf8").trim().split(/\s+/)[0]);
const given = new Set();
function canListen(port) {
  return new Promise((resolve) => {
    const server = net.createServer();
    server.once("error", () => resolve(false));
    server.listen(port, "127.0.0.1", () => server.close(() => resolve(true)));
  });
}
async function freePort() {
  const low = 10000, high = ephemeralLow - 1;
  for (let attempt = 0; high - low >= 1000 && attempt < 200; attempt++) {
    const port = low + Math.floor(Math.random() * (high - low + 1));
    if (!given.has(port) && await canListen(port)) {
      given.add(port);
      return port;
    }
  }
  // No room below the ephemeral range here: the kernel's choice.
  return new Promise((resolve, reject) => {
    const server = net.createServer();
    server.once("error", reject);
    server.listen(0, "127.0.0.1", () => {
      const { port } = server.address();
      server.close(() => resolve(port));
    });
  });
}

const byKind = (kind) => docs.filter((d) => d.kind === kind);
const configMaps = Object.fromEntries(byKind("ConfigMap").map((c) => [c.metadata.name, c]));
const certificates = Object.fromEntries(
  byKind("Certificate").map((c) => [c.spec.secretName, c.spec]));
// Hook Jobs (the model Job) run to completion first, then the pods.
const workloads = [...byKind("Job"), ...byKind("StatefulSet"), ...byKind("Deployment")];
const component = (o) => o.metadata.labels?.["app.kubernetes.io/component"] ?? o.metadata.name;
const plan = { skip: "", roles: [], certs: [], ports: {}, apiKey: "chart-run-key-0123456789",
               image };

// Ports: each role's listening ports in baton.yaml, fresh per pod for the common ones.
const config = YAML.parse(configMaps[Object.keys(configMaps).find((n) => n.endsWith("-config"))]
  .data["baton.yaml"]);
const rolePorts = {
  router: ["port", "internal-port", "http-port"], prefill: ["port"], decode: ["port"],
  kvstore: ["port"],
};
const ports = {};
for (const [role, keys] of Object.entries(rolePorts)) {
  for (const key of keys) {
    if (config[role]?.[key] !== undefined) ports[`${role}.${key}`] = await freePort();
  }
}
plan.ports = ports;

// Services: a name resolves to 127.0.0.1 and the local port of what it selects.
const services = {};
for (const svc of byKind("Service")) {
  const role = svc.spec.selector?.["app.kubernetes.io/component"];
  const workload = workloads.find((w) => component(w) === role);
  if (!workload || !rolePorts[role]) continue;
  const named = Object.fromEntries(workload.spec.template.spec.containers
    .flatMap((c) => c.ports ?? []).map((p) => [p.name, p.containerPort]));
  for (const p of svc.spec.ports ?? []) {
    const target = typeof p.targetPort === "string" ? named[p.targetPort] : (p.targetPort ?? p.port);
    const key = rolePorts[role].find((k) => config[role]?.[k] === target);
    if (key) services[`${svc.metadata.name}:${p.port}`] = `127.0.0.1:${ports[`${role}.${key}`]}`;
  }
}
function localAddress(address) {
  const colon = address.lastIndexOf(":");
  const labels = address.slice(0, colon).replace(/\.$/, "").split(".");
  const port = address.slice(colon + 1);
  // A Service's name, or a StatefulSet pod's (<set>-0.<service>.<namespace>...).
  for (const label of labels.slice(0, 2)) {
    if (services[`${label}:${port}`]) return services[`${label}:${port}`];
  }
  throw new Error(`no Service of this release serves ${address}`);
}

const mountMapOf = (pod, dir, container) => {
  const volumes = Object.fromEntries((pod.spec.volumes ?? []).map((v) => [v.name, v]));
  const claims = Object.fromEntries((pod.volumeClaimTemplates ?? []).map((c) => [c.metadata.name, c]));
  const map = [];
  for (const m of container.volumeMounts ?? []) {
    const v = volumes[m.name];
    let local;
    if (v?.configMap) {
      local = path.join(dir, "configmap", v.configMap.name);
    } else if (v?.secret) {
      local = secretDir(v.secret.secretName, pod);
    } else if (v?.csi) {
      local = csiDir(v, pod, dir);
    } else if (v?.emptyDir) {
      local = path.join(dir, "emptydir", m.name);
    } else if (v?.hostPath) {
      local = path.join(out, "hostpath", v.hostPath.path);
    } else if (v?.persistentVolumeClaim) {
      local = path.join(out, "pvc", v.persistentVolumeClaim.claimName);
    } else if (claims[m.name]) {
      local = path.join(out, "pvc", `${m.name}-${pod.podName}`);
    } else {
      throw new Error(`${pod.podName}: volume ${m.name} of a kind this test does not map`);
    }
    fs.mkdirSync(local, { recursive: true });
    map.push([m.mountPath.replace(/\/?$/, "/"), local + "/", Boolean(m.readOnly)]);
  }
  return map;
};
// Where a path of the pod's volumes lies on this machine (other paths as they are).
function localPath(value, map) {
  for (const [prefix, local] of map) {
    if (value === prefix.slice(0, -1)) return local.slice(0, -1);
    if (value.startsWith(prefix)) return local + value.slice(prefix.length);
  }
  return value;
}
// A path as this pod's process sees it: in a container of the image, the pod's own; as a process
// here, its mounts first, then the image's files.
function mapPath(value, map) {
  if (image) return value;
  const mapped = localPath(value, map);
  if (mapped !== value) return mapped;
  if (value.startsWith("/usr/local/bin/")) return binaryPath(value.slice("/usr/local/bin/".length));
  const models = "/usr/local/share/baton/models/";
  if (value.startsWith(models)) return path.join(repoRoot, "models", value.slice(models.length));
  return value;
}

const certByDir = {};
function issue(dir, uris, dns) {
  if (!certByDir[dir]) {
    certByDir[dir] = { dir, uris, dns: [...new Set([...(dns ?? []), "localhost"])] };
    plan.certs.push(certByDir[dir]);
  }
  return dir;
}
function secretDir(name, pod) {
  const dir = path.join(out, "secrets", name);
  const spec = certificates[name];
  if (spec) return issue(dir, spec.uris ?? [], spec.dnsNames);
  // Not issued by the release: what docs/deploy.md asks of such a Secret.
  return issue(dir, [`spiffe://baton/${component(pod)}`], serviceNames());
}
function csiDir(volume, pod, podDir) {
  const attrs = volume.csi.volumeAttributes ?? {};
  const uris = (attrs["csi.cert-manager.io/uri-sans"] ?? "").split(",").filter(Boolean)
    .map((u) => u.replaceAll("${POD_NAME}", pod.podName));
  return issue(path.join(podDir, "csi", volume.name), uris, []);
}
function serviceNames() {
  return byKind("Service").flatMap((s) => [s.metadata.name,
    `${s.metadata.name}.${s.metadata.namespace ?? "default"}.svc.cluster.local`]);
}

// baton.yaml as one pod reads it: its mounts mapped, its ports and addresses local.
function podConfig(pod, map, role) {
  const c = structuredClone(config);
  const walk = (o) => {
    for (const [k, v] of Object.entries(o)) {
      if (typeof v === "string") o[k] = mapPath(v, map);
      else if (v && typeof v === "object") walk(v);
    }
  };
  walk(c);
  c.common.host = "127.0.0.1";
  c.common["metrics-host"] = "127.0.0.1";
  c.common["metrics-port"] = pod.metricsPort;
  c.common["health-port"] = pod.healthPort;
  c.common.router = localAddress(c.common.router);
  for (const [key, port] of Object.entries({ ...ports, ...(pod.ports ?? {}) })) {
    const [section, name] = key.split(".");
    if (c[section]) c[section][name] = port;
  }
  return c;
}

function step(pod, container, map) {
  const env = {};
  for (const e of container.env ?? []) {
    if (e.value !== undefined) env[e.name] = String(e.value);
    else if (e.valueFrom?.fieldRef?.fieldPath === "metadata.name") env[e.name] = pod.podName;
    else if (e.valueFrom?.fieldRef?.fieldPath === "status.podIP") env[e.name] = "127.0.0.1";
    else if (e.valueFrom?.secretKeyRef) env[e.name] = plan.apiKey;
    else if (e.valueFrom?.resourceFieldRef) continue;
    else throw new Error(`${pod.podName}: env ${e.name} of a kind this test does not map`);
  }
  const expand = (a) => String(a).replace(/\$\(([A-Z_]+)\)/g, (_, n) => env[n] ?? `$(${n})`);
  const argv = [...(container.command ?? []), ...(container.args ?? [])].map(expand).map((a) => {
    const m = /^(--[a-z-]+=)(.*)$/.exec(a);
    if (m && m[1] === "--addr=") return m[1] + localAddress(m[2]);
    return m ? m[1] + mapPath(m[2], map) : mapPath(a, map);
  });
  // baton.yaml's file on this machine, from the path the pod gives it.
  const configFile = [...(container.command ?? []), ...(container.args ?? [])].map(expand)
    .find((a) => a.startsWith("--config="))?.slice("--config=".length);
  return { argv, env, mounts: map, config: configFile && localPath(configFile, map) };
}

// The model's download source: chart_run_test.sh serves the stand-in model over HTTPS on a
// local port (model_server.mjs) with a certificate of this run's CA, and renders the chart with
// the stand-in's digests in model.source.files. A fetch-model step's endpoint (or https source)
// becomes that server, and it trusts the CA (--ca-file, mounted for a container).
async function fromModelServer(s) {
  if (!plan.modelServer) {
    const dir = path.join(out, "model-server");
    plan.modelServer = { port: await freePort(), dir: issue(dir, [], []) };
  }
  const origin = `https://127.0.0.1:${plan.modelServer.port}`;
  const source = s.argv.find((a) => a.startsWith("--source="))?.slice("--source=".length) ?? "";
  s.argv = s.argv.filter((a) => !a.startsWith("--endpoint="));
  if (/^https?:\/\//.test(source)) {
    s.argv = s.argv.map((a) => a.startsWith("--source=") ? `--source=${origin}${new URL(source).pathname}` : a);
  } else {
    s.argv.push(`--endpoint=${origin}`);
  }
  let ca = path.join(plan.modelServer.dir, "ca.crt");
  if (image) {
    s.mounts.push(["/etc/chart-run-model-ca/", plan.modelServer.dir + "/", true]);
    ca = "/etc/chart-run-model-ca/ca.crt";
  }
  s.argv.push(`--ca-file=${ca}`);
}

// Each pod of a workload: one, except for a store fleet's StatefulSet (kvstore.replicas), whose
// pods each get their own gRPC port here (in a cluster each has its own network namespace).
const pods = [];
for (const w of workloads) {
  const role = component(w);
  const replicas = role === "kvstore" ? (w.spec.replicas ?? 1) : 1;
  for (let i = 0; i < replicas; i++) {
    const own = i === 0 ? {} : { "kvstore.port": await freePort() };
    pods.push({ w, role, podName: `${w.metadata.name}-${i}`, ports: own });
  }
}
for (const { w, role, podName, ports: own } of pods) {
  const pod = { ...w.spec.template, volumeClaimTemplates: w.spec.volumeClaimTemplates,
                podName, ports: own, metricsPort: await freePort(),
                healthPort: await freePort() };
  const dir = path.join(out, pod.podName);
  const steps = [];
  // Init containers in order, then the pod's baton container (a sidecar of another image, such
  // as extras-values.yaml's log shipper, is not baton's and is left out).
  const main = pod.spec.containers.filter((c) => /^\/usr\/local\/bin\/baton/.test(c.command?.[0] ?? ""));
  if (main.length !== 1) throw new Error(`${pod.podName}: ${main.length} baton containers`);
  for (const container of [...(pod.spec.initContainers ?? []), main[0]]) {
    const map = mountMapOf(pod, dir, container);
    const s = step(pod, container, map);
    if (s.argv.includes("fetch-model")) await fromModelServer(s);
    if (s.argv.some((a) => /^--?(uri|url)=?/.test(a))) {
      plan.skip ||= `${pod.podName}: ${container.name} downloads from a URL (${s.argv.join(" ")})`;
    }
    if (/(^|,)(rc|ud|dc|ib)[a-z_0-9]*(,|$)/.test(s.env.UCX_TLS ?? "")) {
      plan.skip ||= `${pod.podName}: UCX_TLS=${s.env.UCX_TLS} needs RDMA devices`;
    }
    steps.push(s);
    // The ConfigMap's files, baton.yaml as this pod reads it.
    for (const [mount, local] of map) {
      const cm = Object.values(configMaps).find((c) => local.includes(`/configmap/${c.metadata.name}/`));
      if (!cm) continue;
      for (const [file, text] of Object.entries(cm.data ?? {})) {
        const body = file === "baton.yaml" ? YAML.stringify(podConfig(pod, map, role)) : text;
        fs.writeFileSync(path.join(local, file), body);
      }
      if (YAML.parse(fs.readFileSync(path.join(local, "baton.yaml"), "utf8"))?.[role]?.device === "cuda") {
        plan.skip ||= `${pod.podName}: runs on a CUDA device`;
      }
    }
    // The API key file the router reads, holding the key the test client sends.
    // (A process here reads it where podConfig put it; a container, at the pod's path.)
    const keysPath = podConfig(pod, map, role).router?.["api-keys"];
    const keys = keysPath && (image ? localPath(keysPath, map) : keysPath);
    if (role === "router" && keys && !fs.existsSync(keys)) {
      fs.mkdirSync(path.dirname(keys), { recursive: true });
      fs.writeFileSync(keys, `${plan.apiKey}: chart-run\n`, { mode: 0o600 });
    }
  }
  plan.roles.push({ name: pod.podName, component: role, job: w.kind === "Job",
                    healthPort: pod.healthPort, steps });
}
// Start order: the router first (the nodes register with it), the store before prefill.
const order = ["router", "kvstore", "prefill", "decode"];
plan.roles.sort((a, b) => (b.job - a.job) || order.indexOf(a.component) - order.indexOf(b.component));

const testPod = byKind("Pod").find((p) => p.metadata.annotations?.["helm.sh/hook"] === "test");
if (testPod) {
  const pod = { ...testPod, podName: testPod.metadata.name };
  const container = testPod.spec.containers[0];
  plan.test = step(pod, container, mountMapOf(pod, path.join(out, pod.podName), container));
}
fs.writeFileSync(path.join(out, "plan.json"), JSON.stringify(plan, null, 2));

// The same plan as bash variables (OUT/plan.sh), so that chart_run_test.sh reads each field
// without starting a node process for it. A step's variables share a prefix: PREFIX_argv,
// PREFIX_env (NAME=VALUE), PREFIX_volumes (docker run --volume arguments), PREFIX_config and
// PREFIX_json (the step as plan.json has it).
const quote = (s) => `'${String(s ?? "").replace(/'/g, "'\\''")}'`;
const sh = [];
const array = (name, values) => sh.push(`${name}=(${values.map(quote).join(" ")})`);
const stepVariables = (prefix, s) => {
  array(`${prefix}_argv`, s.argv);
  array(`${prefix}_env`, Object.entries(s.env).map(([k, v]) => `${k}=${v}`));
  array(`${prefix}_volumes`, s.mounts.map(([mount, local, readOnly]) =>
    `--volume=${local.slice(0, -1)}:${mount.slice(0, -1)}${readOnly ? ":ro" : ""}`));
  sh.push(`${prefix}_config=${quote(s.config)}`, `${prefix}_json=${quote(JSON.stringify(s))}`);
};
sh.push(`plan_skip=${quote(plan.skip)}`, `plan_api_key=${quote(plan.apiKey)}`,
        `plan_model_server_port=${quote(plan.modelServer?.port)}`,
        `plan_model_server_dir=${quote(plan.modelServer?.dir)}`);
array("plan_cert_dirs", plan.certs.map((c) => c.dir));
array("plan_cert_sans", plan.certs.map((c) =>
  [...c.uris.map((u) => "URI:" + u), ...c.dns.map((d) => "DNS:" + d), "IP:127.0.0.1"].join(",")));
sh.push(`plan_roles=${plan.roles.length}`);
for (const field of ["name", "component", "job", "healthPort"]) {
  array(`plan_role_${field}`, plan.roles.map((r) => r[field]));
}
array("plan_role_steps", plan.roles.map((r) => r.steps.length));
plan.roles.forEach((r, i) => r.steps.forEach((s, j) => stepVariables(`plan_step_${i}_${j}`, s)));
sh.push(`plan_has_test=${plan.test ? 1 : 0}`);
if (plan.test) stepVariables("plan_test", plan.test);
fs.writeFileSync(path.join(out, "plan.sh"), sh.join("\n") + "\n");
