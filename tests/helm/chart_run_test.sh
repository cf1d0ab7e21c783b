#!/usr/bin/env bash
# The chart's configuration, run (ctest helm_chart_run): for the default values and each
# helm/baton/ci/*.yaml, renders the chart, and starts every pod's containers as processes on
# this machine with exactly the baton.yaml and command lines the chart gives them (chart_run.mjs
# maps volumes and the image's paths to local ones and rewrites addresses and ports to free ones
# on 127.0.0.1; nothing else changes). Then each role's health port must answer SERVING over
# grpc.health.v1 (`batonctl health`, as the kubelet's gRPC probe asks), and the chart's own
# `helm test` pod (batonctl generate through the router) must be served.
#
# Where the release needs what this machine lacks (a CUDA device, RDMA) it is reported as
# skipped, naming why; a volume the operator fills with weights (hostPath, a shared claim) gets
# this tree's models/ced-brown-shared, as the operator would, and weights the release downloads
# (model.source) come from model_server.mjs, which serves that model over HTTPS here, the chart
# rendered with its files' real digests.
#
#   chart_run_test.sh BUILD_DIR [VALUES.yaml...]     (default: "" for the chart's defaults, then
#                                                     every helm/baton/ci/*.yaml)
#
# CHART_RUN_IMAGE=IMAGE runs each pod's containers as containers of IMAGE instead (Debian's
# Docker; tests/image/image_test.sh builds the image): the chart's arguments and env, the pod's
# volumes bind-mounted at their paths (read-only where the chart says), user 10001, a read-only
# root filesystem, every capability dropped, no new privileges, and the host's network (the
# ports and addresses rewritten as for processes). Each role's time from its container's start
# to SERVING is printed.
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
image="${CHART_RUN_IMAGE:-}"
docker=/usr/bin/docker
if [[ -n "$image" ]] && ! "$docker" image inspect "$image" >/dev/null 2>&1; then
  echo "SKIP: CHART_RUN_IMAGE=$image: no such image in a running Docker engine"
  exit "$skip_code"
fi
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
containers=()
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
  # A container outlives a killed `docker run`: removed here, whatever its state.
  if ((${#containers[@]} > 0)); then "$docker" rm -f "${containers[@]}" >/dev/null 2>&1; fi
  containers=()
}
# CHART_RUN_KEEP=1 keeps the work folder (each release's render, plan, logs) for a look.
trap 'stop_all; if [[ -n "${CHART_RUN_KEEP:-}" ]]; then echo "kept $work"; else rm -rf "$work"; fi' EXIT

# A CA and, for each Secret the pods mount, a key and certificate with the names the plan gives
# (URI SANs, DNS names, and 127.0.0.1 for the clients here), under DIR/{ca.crt,tls.crt,tls.key}.
make_certs() {
  local out="$1" c dir sans
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 1 \
    -subj "/CN=chart-run CA" -addext basicConstraints=critical,CA:TRUE \
    -addext keyUsage=critical,keyCertSign,cRLSign -keyout "$out/ca.key" -out "$out/ca.crt" \
    2>/dev/null || return 1
  for c in "${!plan_cert_dirs[@]}"; do
    dir="${plan_cert_dirs[$c]}" sans="${plan_cert_sans[$c]}"
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

# Where a path of a step's pod lies on this machine (its volumes' mounts mapped).
local_path() {
  node -e '
    const [step, p] = [JSON.parse(process.argv[1]), process.argv[2]];
    let out = p;
    for (const [mount, local] of step.mounts) {
      if (p === mount.slice(0, -1)) { out = local.slice(0, -1); break; }
      if (p.startsWith(mount)) { out = local + p.slice(mount.length); break; }
    }
    console.log(out);' "$1" "$2"
}

# Runs one step of the plan (its variables' prefix in plan.sh, e.g. plan_step_0_1) with env -i
# and the step's env; with CHART_RUN_IMAGE, as a container of the image, the way the chart's pod
# runs it.
run_step() {
  local prefix="$1" log="$2" background="$3"
  local -n argv="${prefix}_argv" env_args="${prefix}_env" mounts="${prefix}_volumes"
  if [[ -n "$image" ]]; then
    local name="chart-run-$$-${#containers[@]}-$RANDOM"
    local -a run=(run --rm --name "$name" --network host --user 10001:10001 --read-only
      --cap-drop ALL --security-opt no-new-privileges --workdir /tmp)
    run+=("${mounts[@]}")
    # The pod's writable /tmp: an emptyDir the chart mounts there, else a tmpfs.
    local tmp_mounted=0 m
    for m in "${mounts[@]}"; do [[ "$m" == *:/tmp || "$m" == *:/tmp:ro ]] && tmp_mounted=1; done
    ((tmp_mounted)) || run+=(--tmpfs /tmp)
    for e in "${env_args[@]}"; do run+=(--env "$e"); done
    run+=(--entrypoint "${argv[0]}" "$image" "${argv[@]:1}")
    containers+=("$name")
    if [[ "$background" == 1 ]]; then
      "$docker" "${run[@]}" >>"$log" 2>&1 &
      pids+=($!)
    else
      timeout 300 "$docker" "${run[@]}" >>"$log" 2>&1
    fi
    return
  fi
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
  # Weights the release downloads (model.source): the stand-in model's files, served here by
  # model_server.mjs, with their real digests in place of the values file's.
  standin=()
  if [[ -n "$file" ]]; then
    node -e '
      const YAML = require(process.argv[1] + "/yaml");
      const crypto = require("crypto"), fs = require("fs"), path = require("path");
      const files = YAML.parse(fs.readFileSync(process.argv[2], "utf8"))?.model?.source?.files;
      if (!files) process.exit(0);
      const digest = (n) => crypto.createHash("sha256")
        .update(fs.readFileSync(path.join(process.argv[3], n))).digest("hex");
      const standin = Object.fromEntries(Object.keys(files).map((n) => [n, digest(n)]));
      fs.writeFileSync(process.argv[4], YAML.stringify({ model: { source: { files: standin } } }));
    ' "$modules" "$file" "$root/models/ced-brown-shared" "$out/standin.yaml" || {
      echo "FAIL: $name: cannot read model.source.files"
      failed=$((failed + 1))
      continue
    }
    [[ -s "$out/standin.yaml" ]] && standin=(-f "$out/standin.yaml")
  fi
  if ! "$helm" template t "$chart" ${file:+-f "$file"} "${standin[@]}" "${api[@]}" \
    >"$out/rendered.yaml" 2>"$out/helm.log"; then
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
  # shellcheck source=/dev/null
  source "$out/plan.sh"
  if [[ -n "$plan_skip" ]]; then
    echo "skip: $name: $plan_skip"
    skipped=$((skipped + 1))
    continue
  fi
  if ! make_certs "$out"; then
    echo "FAIL: $name: cannot make the certificates with openssl"
    failed=$((failed + 1))
    continue
  fi
  if [[ -n "$plan_model_server_port" ]]; then
    : >"$out/model-server.log"
    node "$here/model_server.mjs" "$plan_model_server_port" "$plan_model_server_dir" \
      "$root/models/ced-brown-shared" >"$out/model-server.log" 2>&1 &
    pids+=($!)
    for _ in $(seq 100); do grep -q serving "$out/model-server.log" && break; sleep 0.1; done
  fi
  # The containers run as the image's user, 10001: the pods' volumes are theirs, as the
  # kubelet's fsGroup makes them.
  [[ -z "$image" ]] || chown -R 10001:10001 "$out"
  problem="" generated=""
  declare -A role_started=()
  roles=$plan_roles
  for ((i = 0; i < roles; i++)); do
    [[ -z "$problem" ]] || break
    role="${plan_role_name[$i]}"
    job="${plan_role_job[$i]}"
    steps="${plan_role_steps[$i]}"
    last="plan_step_${i}_$((steps - 1))"
    # Weights the operator puts on a volume: this tree's default model stands in for them.
    config_var="${last}_config"
    config="${!config_var}"
    model="$(sed -n 's/^  model: //p' "$config" 2>/dev/null | head -1)"
    # In a container, the model's path is the pod's: where it lies here.
    if [[ -n "$image" && -n "$model" ]]; then
      json_var="${last}_json"
      model="$(local_path "${!json_var}" "$model")"
    fi
    if [[ "$job" == false && -n "$model" && ! -e "$model/config.json" && "$model" == "$out"/* ]] &&
      [[ "$model" == "$out"/hostpath/* || "$model" == "$out"/pvc/* ]]; then
      mkdir -p "$model" && cp -r "$root/models/ced-brown-shared/." "$model/"
      [[ -z "$image" ]] || chown -R 10001:10001 "$model"
      # Values written for a longer model than the trained stand-in (512 positions): the small
      # preset, generated with the default tokenizer (131,072 positions, W = 128) stands in.
      positions() {
        node -e 'console.log(require(process.argv[1]).max_position_embeddings)' "$model/config.json"
      }
      wanted="$(sed -n 's/^  max-model-len: //p' "$config" | head -1)"
      if ((${wanted:-0} > $(positions))); then
        rm -rf "$model"
        "$build/tools/batonctl" make-model --preset small --tokenizer "$build/tokenizer" \
          --out "$model" >/dev/null 2>&1 || problem="cannot make the small preset in $model"
        [[ -z "$image" ]] || chown -R 10001:10001 "$model"
      fi
      if [[ -z "$problem" ]] && ((${wanted:-0} > $(positions))); then
        problem="skip: max-model-len $wanted is for the operator's model; the stand-in has $(positions) positions"
      fi
    fi
    for ((s = 0; s < steps && ${#problem} == 0; s++)); do
      step="plan_step_${i}_$s"
      if [[ "$job" == false && $s -eq $((steps - 1)) ]]; then
        role_started[$role]="$(date +%s.%N)"
        run_step "$step" "$out/$role.log" 1
      elif ! run_step "$step" "$out/$role.log" 0; then
        problem="$role: step $s failed: $(tail -5 "$out/$role.log")"
      fi
    done
  done
  # Every pod's health port, asked at once: each answer's time, from its pod's start, is the
  # pod's time to SERVING.
  health_pids=() serving=""
  for ((i = 0; i < roles; i++)); do
    [[ -z "$problem" ]] || break
    [[ "${plan_role_job[$i]}" == true ]] && continue
    role="${plan_role_name[$i]}"
    port="${plan_role_healthPort[$i]}"
    ( answer="$("$build/tools/batonctl" health --addr "127.0.0.1:$port" --wait-ms 90000)"
      echo "$? $(date +%s.%N) $port $answer" >"$out/$role.health" ) &
    health_pids+=($!)
  done
  for pid in "${health_pids[@]}"; do wait "$pid"; done
  for ((i = 0; i < roles; i++)); do
    [[ -z "$problem" ]] || break
    [[ "${plan_role_job[$i]}" == true ]] && continue
    role="${plan_role_name[$i]}"
    read -r rc at port health <"$out/$role.health"
    if [[ "$rc" != 0 ]]; then
      problem="$role: health port $port answers '$health', not SERVING: $(tail -5 "$out/$role.log")"
    else
      serving+="${serving:+, }$role $(awk -v a="$at" -v b="${role_started[$role]}" \
        'BEGIN { printf "%.1f", a - b }') s"
    fi
  done
  if [[ -z "$problem" ]]; then
    if [[ "$plan_has_test" != 1 ]]; then
      problem="the chart renders no helm test pod"
    elif ! run_step plan_test "$out/test.log" 0 || ! grep -q "finish" "$out/test.log"; then
      problem="the helm test pod's request was not served: $(tail -5 "$out/test.log")"
    fi
  fi
  # Text through the router's OpenAI API, where it serves one to clients without their own
  # certificate: the URL its log announces, the chart's CA, the key the router was given.
  url=""
  if [[ -z "$problem" ]]; then
    router_log=/dev/null router_config=/dev/null
    for ((i = 0; i < roles; i++)); do
      [[ "${plan_role_component[$i]}" == router ]] || continue
      router_log="$out/${plan_role_name[$i]}.log"
      config_var="plan_step_${i}_$((plan_role_steps[i] - 1))_config"
      router_config="${!config_var}"
    done
    url="$(grep -oE 'https?://[0-9.]+:[0-9]+/v1' "$router_log" | head -1 || true)"
    if [[ -z "$url" ]] && grep -q '^  http-port:' "$router_config"; then
      problem="the router has an http-port but announced no OpenAI API: $(tail -5 "$router_log")"
    fi
  fi
  if [[ -n "$url" ]] && ! grep -q '^  client-tls-ca:' "$router_config"; then
    auth=()
    grep -q '^  api-keys:' "$router_config" && auth=(-H "Authorization: Bearer $plan_api_key")
    model="$(curl -sS --cacert "$out/ca.crt" "${auth[@]}" "$url/models" |
      node -e 'let t = ""; process.stdin.on("data", (d) => t += d).on("end", () =>
        console.log(JSON.parse(t).data[0].id))' 2>/dev/null)"
    text="$(curl -sS --cacert "$out/ca.crt" "${auth[@]}" -H 'Content-Type: application/json' \
      -d "{\"model\": \"$model\", \"prompt\": \"The jury said\", \"max_tokens\": 8, \"temperature\": 0}" \
      "$url/completions" | node -e 'let t = ""; process.stdin.on("data", (d) => t += d).on("end", () =>
        console.log(JSON.stringify(JSON.parse(t).choices[0].text)))' 2>/dev/null)"
    if [[ -z "$text" || "$text" == '""' ]]; then
      problem="the router's OpenAI API at $url generated no text for model '$model'"
    else
      generated="; generated $text"
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
      "($((SECONDS - started)) s${image:+, as containers of $image}; to SERVING: $serving$generated)"
    passed=$((passed + 1))
  fi
done
echo "chart run: $passed values files served, $skipped skipped, $failed failed"
((failed == 0))
