#!/usr/bin/env bash
# A rollout with one refused pod (issue 49, item 1): how much of the traffic stays served while
# a Deployment's RollingUpdate (maxSurge 1, maxUnavailable 0) replaces the only prefill pod by
# one the router refuses (its model's config differs: another max_position_embeddings), on
# loopback with the real binaries.
#
# The rollout controller is emulated as Kubernetes runs it: it adds the new pod, waits until the
# pod is Ready, then removes the old one, and gives up at the progress deadline (the rollout
# stalls). Two readiness signals are compared in the same run:
#   health    what the chart's probe asks: grpc.health.v1 on --health-port, which a prefill or
#             decode node answers SERVING only while a router accepts it (this build);
#   listening the node's gRPC port accepts connections (what readiness meant before: SERVING as
#             soon as the server started).
# A client sends requests one after another throughout; each run prints the requests served
# out of those sent, whether the old pod was removed, and the new pod's readiness.
#
#   bench/run_rollout_bench.sh [DEADLINE_SECONDS]     (default 20)
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${BATON_BUILD_DIR:-$root/build}"
deadline_s="${1:-20}"
out="$(mktemp -d)"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  wait 2>/dev/null
  rm -rf "$out"
}
trap cleanup EXIT
"$build/tools/batonctl" make-model --preset tiny --seed 0 --out "$out/old" >/dev/null
cp -r "$out/old" "$out/new"
sed -i 's/"max_position_embeddings": [0-9]*/"max_position_embeddings": 4096/' "$out/new/config.json"

wait_file() { for _ in $(seq 300); do [[ -s "$1" ]] && return 0; sleep 0.1; done; return 1; }
start() {  # start NAME BINARY ARGS...: the node's ready file is $out/NAME.ready
  local name="$1" binary="$2"
  shift 2
  "$build/$binary" --insecure-internal --port 0 --metrics-port -1 --ready-file "$out/$name.ready" \
    "$@" >"$out/$name.log" 2>&1 &
  pids+=($!)
  eval "pid_$name=$!"
  wait_file "$out/$name.ready"
}

run() {
  local readiness="$1" tag="$2"
  rm -f "$out"/*.ready
  start "router$tag" router/baton-router --model "$out/old" --internal-port 0 \
    --internal-ready-file "$out/internal$tag"
  wait_file "$out/internal$tag"
  local internal router
  internal="$(cat "$out/internal$tag")"
  router="$(cat "$out/router$tag.ready")"
  start "decode$tag" decode_node/baton-decode --model "$out/old" --router "$internal"
  start "oldprefill$tag" prefill_node/baton-prefill --model "$out/old" --router "$internal"
  "$build/tools/batonctl" health --addr "$router" --wait-ms 30000 >/dev/null
  # The client: one request after another until told to stop.
  local stop="$out/stop$tag"
  rm -f "$stop"
  (
    sent=0 served=0
    while [[ ! -e "$stop" ]]; do
      sent=$((sent + 1))
      if timeout 5 "$build/tools/batonctl" generate --addr "$router" --tokens 5,6,7,8,9,10,11,12 \
        --max-tokens 2 >/dev/null 2>&1; then
        served=$((served + 1))
      fi
    done
    echo "$served $sent" >"$out/client$tag"
  ) &
  local client=$!
  sleep 1
  # The rollout: the new pod, then the old one removed once the new one is Ready.
  local health_port=$((20000 + RANDOM % 10000))
  local started=$SECONDS
  start "newprefill$tag" prefill_node/baton-prefill --model "$out/new" --router "$internal" \
    --health-port "$health_port"
  local new_addr ready=no removed=no
  new_addr="$(cat "$out/newprefill$tag.ready")"
  while ((SECONDS - started < deadline_s)); do
    if [[ "$readiness" == health ]]; then
      [[ "$("$build/tools/batonctl" health --addr "127.0.0.1:$health_port" 2>/dev/null)" == SERVING ]] &&
        ready=yes
    else
      (exec 3<>"/dev/tcp/${new_addr%:*}/${new_addr##*:}") 2>/dev/null && ready=yes
    fi
    if [[ "$ready" == yes ]]; then
      eval "kill \$pid_oldprefill$tag"
      removed=yes
      break
    fi
    sleep 0.5
  done
  # The rest of the window: what the clients see after the rollout's decision.
  while ((SECONDS - started < deadline_s)); do sleep 0.5; done
  touch "$stop"
  wait "$client"
  read -r served sent <"$out/client$tag"
  local refused
  refused="$(grep -c 'registration refused' "$out/newprefill$tag.log")"
  echo "readiness=$readiness: $served of $sent requests served ($(awk -v a="$served" -v b="$sent" \
    'BEGIN { printf "%.1f", 100 * a / b }')%) over ${deadline_s} s; new pod Ready: $ready;" \
    "old pod removed: $removed; the router refused the new pod $refused times"
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  wait "${pids[@]}" 2>/dev/null
  pids=()
}

run health a
run listening b
