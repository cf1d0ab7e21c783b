#!/usr/bin/env bash
# The chart's configuration, run (ctest helm_chart_run): for the default values and each
# helm/baton/ci/*.yaml, renders the chart, and starts every pod's containers as processes on
# this machine with exactly the baton.yaml and command lines the chart gives them (chart_run.mjs
# maps volumes and the image's paths to local ones and rewrites addresses and ports to free ones
# on 127.0.0.1; nothing else changes). Then each role's health port must answer SERVING over
# grpc.health.v1 (`batonctl health`, as the kubelet's gRPC probe asks), and the chart's own
# `helm test` pod (batonctl generate through the router) must be served.
#
# Where the release needs what this machine lacks (a CUDA device, RDMA, a model downloaded from
# the network) it is reported as skipped, naming why; a volume the operator fills with weights
# (hostPath, a shared claim) gets this tree's models/ced-brown-shared, as the operator would.
#
#   chart_run_test.sh BUILD_DIR [VALUES.yaml...]     (default: "" for the chart's defaults, then
#                                                     every helm/baton/ci/*.yaml)
# Needs helm and the validator's packages under BUILD_DIR/helm-cache (the helm_chart test
# fetches them); without them it exits $BATON_SKIP_CODE (ctest: 77, skipped).
set -uo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
build="$(cd "$1" && pwd)"
shift
chart="$root/helm/baton"
helm="$build/helm-cache/helm-v3.17.2/helm"
modules="$build/helm-cache/validator/node_modules"
skip_code="${BATON_SKIP_CODE:-0}"
if [[ ! -x "$helm" || ! -d "$modules/yaml" ]] || ! command -v node >/dev/null ||
  ! command -v openssl >/dev/null; then
  echo "SKIP: needs helm and the validator's packages in $build/helm-cache (the helm_chart test" \
    "fetches them), node and openssl"
  exit "$skip_code"
fi
if (($# > 0)); then
  values=("$@")
else
  values=("" "$chart"/ci/*.yaml)
fi

work="$(mktemp -d)"
pids=()
stop_all() {
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null; done
  # Each gets its drain: wait for them with a deadline, then kill what is left.
  local deadline=$((SECONDS + 20))
  for pid in "${pids[@]}"; do
    while kill -0 "$pid" 2>/dev/null && ((SECONDS < deadline)); do sleep 0.2; done
    kill -KILL "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
  done
  pids=()
}
# CHART_RUN_KEEP=1 keeps the work folder (each release's render, plan, logs) for a look.
trap 'stop_all; if [[ -n "${CHART_RUN_KEEP:-}" ]]; then echo "kept $work"; else rm -rf "$work"; fi' EXIT

# A CA and, for each Secret the pods mount, a key and certificate with the names the plan gives
# (URI SANs, DNS names, and 127.0.0.1 for the clients here), under DIR/{ca.crt,tls.crt,tls.key}.
make_certs() {
  local out="$1" plan="$2"
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 1 \
    -subj "/CN=chart-run CA" -addext basicConstraints=critical,CA:TRUE \
    -addext keyUsage=critical,keyCertSign,cRLSign -keyout "$out/ca.key" -out "$out/ca.crt" \
    2>/dev/null || return 1
  node -e '
    const plan = require(process.argv[1]);
    for (const c of plan.certs) {
      const sans = [...c.uris.map((u) => "URI:" + u), ...c.dns.map((d) => "DNS:" + d), "IP:127.0.0.1"];
      console.log(c.dir + "\t" + sans.join(","));
    }' "$plan" | while IFS=$'\t' read -r dir sans; do
    mkdir -p "$dir"
    openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=baton" \
      -keyout "$dir/tls.key" -out "$dir/tls.csr" 2>/dev/null || return 1
    printf '%s\n' "subjectAltName=$sans" "extendedKeyUsage=serverAuth,clientAuth" \
      "keyUsage=critical,digitalSignature" >"$dir/ext"
    openssl x509 -req -in "$dir/tls.csr" -CA "$out/ca.crt" -CAkey "$out/ca.key" \
      -CAcreateserial -days 1 -extfile "$dir/ext" -out "$dir/tls.crt" 2>/dev/null || return 1
    cp "$out/ca.crt" "$dir/ca.crt"
    chmod 600 "$dir/tls.key"
    rm -f "$dir/tls.csr" "$dir/ext"
  done
}

# Fields of plan.json, one per line: `plan FILE EXPRESSION` (a JavaScript expression over p).
plan() { node -e 'const p = require(process.argv[1]); const v = eval(process.argv[2]);
  for (const x of [].concat(v)) console.log(typeof x === "string" ? x : JSON.stringify(x));' "$1" "$2"; }

# Runs one step of the plan (argv and env as JSON) with env -i and the step's env.
run_step() {
  local step="$1" log="$2" background="$3"
  local -a argv env_args
  mapfile -t argv < <(node -e 'for (const a of JSON.parse(process.argv[1]).argv) console.log(a)' "$step")
  mapfile -t env_args < <(node -e '
    for (const [k, v] of Object.entries(JSON.parse(process.argv[1]).env)) console.log(k + "=" + v)' "$step")
  if [[ "$background" == 1 ]]; then
    env -i PATH=/usr/bin:/bin HOME="$work" "${env_args[@]}" "${argv[@]}" >>"$log" 2>&1 &
    pids+=($!)
  else
    timeout 300 env -i PATH=/usr/bin:/bin HOME="$work" "${env_args[@]}" "${argv[@]}" >>"$log" 2>&1
  fi
}

passed=0 failed=0 skipped=0
for file in "${values[@]}"; do
  name="${file:+$(basename "$file" .yaml)}"
  name="${name:-defaults}"
  out="$work/$name"
  mkdir -p "$out"
  started=$SECONDS
  # The cluster's APIs as chart_test.sh assumes them: cert-manager unless the file says.
  api=(--api-versions cert-manager.io/v1)
  if [[ -n "$file" ]] && line="$(grep -m1 '^# api-versions:' "$file")"; then
    api=()
    for v in ${line#\# api-versions:}; do api+=(--api-versions "$v"); done
  fi
  if ! "$helm" template t "$chart" ${file:+-f "$file"} "${api[@]}" >"$out/rendered.yaml" \
    2>"$out/helm.log"; then
    echo "FAIL: $name: helm template: $(cat "$out/helm.log")"
    failed=$((failed + 1))
    continue
  fi
  if ! node "$here/chart_run.mjs" "$modules" "$out/rendered.yaml" "$out" "$build" "$root" \
    >"$out/plan.log" 2>&1; then
    echo "FAIL: $name: cannot map the rendered pods: $(cat "$out/plan.log")"
    failed=$((failed + 1))
    continue
  fi
  reason="$(plan "$out/plan.json" 'p.skip')"
  if [[ -n "$reason" ]]; then
    echo "skip: $name: $reason"
    skipped=$((skipped + 1))
    continue
  fi
  if ! make_certs "$out" "$out/plan.json"; then
    echo "FAIL: $name: cannot make the certificates with openssl"
    failed=$((failed + 1))
    continue
  fi
  problem=""
  roles="$(plan "$out/plan.json" 'p.roles.length')"
  for ((i = 0; i < roles; i++)); do
    [[ -z "$problem" ]] || break
    role="$(plan "$out/plan.json" "p.roles[$i].name")"
    job="$(plan "$out/plan.json" "p.roles[$i].job")"
    steps="$(plan "$out/plan.json" "p.roles[$i].steps.length")"
    # Weights the operator puts on a volume: this tree's default model stands in for them.
    config="$(plan "$out/plan.json" "p.roles[$i].steps.at(-1).argv.find((a) => a.startsWith('--config='))?.slice(9) ?? ''")"
    model="$(sed -n 's/^  model: //p' "$config" 2>/dev/null | head -1)"
    if [[ "$job" == false && -n "$model" && ! -e "$model/config.json" && "$model" == "$out"/* ]] &&
      [[ "$model" == "$out"/hostpath/* || "$model" == "$out"/pvc/* ]]; then
      mkdir -p "$model" && cp -r "$root/models/ced-brown-shared/." "$model/"
      # Values written for a longer model than the stand-in: the router would rightly refuse
      # them (--max-model-len above the model's positions), which says nothing of the chart.
      positions="$(node -e 'console.log(require(process.argv[1]).max_position_embeddings)' \
        "$model/config.json")"
      wanted="$(sed -n 's/^  max-model-len: //p' "$config" | head -1)"
      if ((${wanted:-0} > positions)); then
        problem="skip: max-model-len $wanted is for the operator's model; the stand-in has $positions positions"
      fi
    fi
    for ((s = 0; s < steps && ${#problem} == 0; s++)); do
      step="$(plan "$out/plan.json" "p.roles[$i].steps[$s]")"
      if [[ "$job" == false && $s -eq $((steps - 1)) ]]; then
        run_step "$step" "$out/$role.log" 1
      elif ! run_step "$step" "$out/$role.log" 0; then
        problem="$role: step $s failed: $(tail -5 "$out/$role.log")"
      fi
    done
  done
  for ((i = 0; i < roles; i++)); do
    [[ -z "$problem" ]] || break
    [[ "$(plan "$out/plan.json" "p.roles[$i].job")" == true ]] && continue
    role="$(plan "$out/plan.json" "p.roles[$i].name")"
    port="$(plan "$out/plan.json" "p.roles[$i].healthPort")"
    if ! health="$("$build/tools/batonctl" health --addr "127.0.0.1:$port" --wait-ms 90000)"; then
      problem="$role: health port $port answers '$health', not SERVING: $(tail -5 "$out/$role.log")"
    fi
  done
  if [[ -z "$problem" ]]; then
    test_step="$(plan "$out/plan.json" 'p.test')"
    if [[ "$test_step" == undefined ]]; then
      problem="the chart renders no helm test pod"
    elif ! run_step "$test_step" "$out/test.log" 0 || ! grep -q "finish" "$out/test.log"; then
      problem="the helm test pod's request was not served: $(tail -5 "$out/test.log")"
    fi
  fi
  stop_all
  if [[ "$problem" == skip:* ]]; then
    echo "skip: $name: ${problem#skip: }"
    skipped=$((skipped + 1))
  elif [[ -n "$problem" ]]; then
    echo "FAIL: $name: $problem"
    failed=$((failed + 1))
  else
    echo "ok: $name: $roles pods SERVING on their health ports and the helm test pod served" \
      "($((SECONDS - started)) s)"
    passed=$((passed + 1))
  fi
done
echo "chart run: $passed values files served, $skipped skipped, $failed failed"
((failed == 0))
