# Sourced by scripts/build_image.sh and tests/image/image_test.sh: Debian's Docker engine, started
# when none runs, the way this project runs it (no bridge, no iptables rules: builds and
# containers use the host's network), and stopped again by whoever started it.
#   ensure_dockerd LOG    uses a running engine, or starts dockerd logging to LOG; sets
#                         started_dockerd to its pid ("" when one was running); 1 if none answers
#   stop_dockerd          stops the dockerd ensure_dockerd started, if any
docker=/usr/bin/docker
started_dockerd=""
ensure_dockerd() {
  "$docker" info >/dev/null 2>&1 && return 0
  /usr/sbin/dockerd --bridge=none --iptables=false >"$1" 2>&1 &
  started_dockerd=$!
  for _ in $(seq 300); do "$docker" info >/dev/null 2>&1 && return 0; sleep 0.1; done
  return 1
}
stop_dockerd() {
  [[ -n "$started_dockerd" ]] || return 0
  kill -TERM "$started_dockerd" 2>/dev/null || true
  for _ in $(seq 200); do kill -0 "$started_dockerd" 2>/dev/null || break; sleep 0.1; done
  started_dockerd=""
}
