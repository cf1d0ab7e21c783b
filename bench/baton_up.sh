# Sourced by the bench scripts: starts `baton up` (with MODEL_DIR when given, else the small
# preset) in a temporary folder and sets `addr` to its router's client address and `http` to its OpenAI API base URL
# (empty when the model has no tokenizer); stop_baton_up stops it (and it is stopped on exit
# in any case).
#   [BATON_UP_ARGS=...] start_baton_up BUILD_DIR [MODEL_DIR]
#   stop_baton_up
start_baton_up() {
  local build="$1" model="${2:-}"
  work="$(mktemp -d)"
  local args=(up --port 0 --http-port 0 --data-dir "$work/data")
  # No model: the small preset, which the bench figures are quoted on (a build that predates
  # --preset generates it by default).
  if [[ -n "$model" ]]; then
    args+=(--model "$model")
  # (The help is read whole first: `grep -q` would close the pipe at its first match, and
  # under pipefail the writer's SIGPIPE would read as no --preset at all.)
  elif [[ "$("$build/tools/baton" up --help)" == *--preset* ]]; then
    args+=(--preset small)
  fi
  # BATON_UP_ARGS: more `baton up` flags (e.g. --split replay-on-decode).
  # shellcheck disable=SC2206
  args+=(${BATON_UP_ARGS:-})
  "$build/tools/baton" "${args[@]}" >"$work/up.log" 2>&1 &
  up=$!
  trap stop_baton_up EXIT
  for _ in $(seq 600); do grep -q "router at" "$work/up.log" && break; sleep 0.2; done
  addr="$(cat "$work/data/run/router.addr")"
  http=""
  if [[ -f "$work/data/run/router-http.addr" ]]; then
    http="http://$(cat "$work/data/run/router-http.addr")/v1"
  fi
}
stop_baton_up() {
  if [[ -n "${up:-}" ]]; then
    kill -INT "$up" 2>/dev/null || true
    wait "$up" 2>/dev/null || true
    rm -rf "$work"
    up=""
  fi
}
