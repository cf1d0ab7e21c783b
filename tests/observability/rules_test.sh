#!/usr/bin/env bash
# Tests baton's Prometheus rules (helm/baton/files/prometheus/baton-rules.yaml) with promtool:
#   1. `promtool check rules`: the file parses, every expression is valid PromQL and every
#      annotation template parses;
#   2. `promtool test rules tests/observability/rules_test.yaml`: each alert fires on synthetic
#      series that should fire it and stays silent on healthy ones;
#   3. when HELM is given and exists (the Helm chart test fetches it into the build tree), the
#      chart's PrometheusRule as rendered with the default values and with
#      helm/baton/ci/monitoring-values.yaml: its rules pass `promtool check rules`, and with the
#      default SLOs they pass the unit tests of 2 as well (the chart only substitutes the SLOs).
#
# Usage: rules_test.sh [HELM]. Without promtool (Debian's prometheus package) the test is
# skipped with exit status 77.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
rules="$root/helm/baton/files/prometheus/baton-rules.yaml"
helm="${1:-}"

if ! command -v promtool >/dev/null 2>&1; then
  echo "SKIP: promtool is missing (apt-get install prometheus; scripts/setup.sh installs it)"
  exit 77
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
failed=0
check() {  # check NAME COMMAND...: runs COMMAND, reports NAME
  local name="$1"
  shift
  if "$@" >"$work/out.log" 2>&1; then
    echo "ok: $name"
  else
    echo "FAIL: $name"
    cat "$work/out.log"
    failed=$((failed + 1))
  fi
}

check "promtool check rules $(basename "$rules")" promtool check rules "$rules"
check "promtool test rules rules_test.yaml" promtool test rules "$here/rules_test.yaml"

# The number of rules promtool finds in a rules file.
rule_count() {
  promtool check rules "$1" 2>&1 | sed -n 's/.*SUCCESS: \([0-9]*\) rules found.*/\1/p'
}

# The PrometheusRule's spec (groups) of a rendered chart, as a plain rules file.
rendered_rules() {
  awk '/^kind: PrometheusRule$/ {inside = 1} inside && /^---/ {exit}
       inside && /^spec:$/ {spec = 1; next} spec {print substr($0, 3)}' "$1"
}

if [[ -n "$helm" && -x "$helm" ]]; then
  for values in default "$root/helm/baton/ci/monitoring-values.yaml"; do
    name="$(basename "$values" .yaml)"
    args=(--set monitoring.prometheusRule.enabled=true --set tls.certManager.enabled=true)
    [[ "$values" != default ]] && args=(-f "$values" "${args[@]}")
    if ! "$helm" template baton "$root/helm/baton" --namespace baton "${args[@]}" \
      >"$work/$name.yaml" 2>"$work/helm.log"; then
      echo "FAIL: helm template ($name)"
      cat "$work/helm.log"
      failed=$((failed + 1))
      continue
    fi
    mkdir -p "$work/$name"
    rendered_rules "$work/$name.yaml" >"$work/$name/baton-rules.yaml"
    check "the chart's rendered rules pass promtool check rules ($name)" \
      promtool check rules "$work/$name/baton-rules.yaml"
    if [[ "$(rule_count "$work/$name/baton-rules.yaml")" != "$(rule_count "$rules")" ]]; then
      echo "FAIL: the chart renders $(rule_count "$work/$name/baton-rules.yaml") rules, the file has $(rule_count "$rules") ($name)"
      failed=$((failed + 1))
    fi
    if [[ "$values" == default ]]; then
      # The unit tests name their rules file relative to themselves.
      mkdir -p "$work/tests/observability" "$work/helm/baton/files/prometheus"
      cp "$here/rules_test.yaml" "$work/tests/observability/"
      cp "$work/$name/baton-rules.yaml" "$work/helm/baton/files/prometheus/"
      check "the chart's rendered rules pass rules_test.yaml (default SLOs)" \
        promtool test rules "$work/tests/observability/rules_test.yaml"
    fi
  done
else
  echo "note: no helm at '${helm}' (the Helm chart test fetches it): the rendered PrometheusRule is not checked"
fi

((failed == 0))
