{{/*
Settings that values.schema.json cannot judge on its own, because they relate two fields or
depend on the model. Each failure names the fields involved. Rendered from configmap.yaml, so
that `helm lint`, `helm template` and `helm install` all stop on them.
*/}}
{{- define "baton.validate" -}}
{{- $router := .Values.config.router -}}
{{- $capacity := include "baton.ringCapacity" . | int64 -}}
{{- $keep := index $router "default-keep" | int64 -}}
{{- $mode := index $router "default-mode" -}}

{{- /* DESIGN section 3: truncation with K < C is rejected (the router refuses to start). */ -}}
{{- if and (ne $mode "off") (ne $keep 0) (lt $keep $capacity) -}}
{{- fail (printf "config.router.default-keep: %d is below the ring capacity C = %d of the model (%s); with default-mode %s use 0 (meaning C) or a value >= %d" $keep $capacity (ternary (printf "preset %s" .Values.model.generate) "model.ringCapacity" (ne .Values.model.generate "")) $mode $capacity) -}}
{{- end -}}

{{- /* A UCX transfer needs UCX on the sending prefill node and the receiving decode node. */ -}}
{{- if and (eq $router.transport "ucx") (or (index .Values.config.prefill "no-ucx") (index .Values.config.decode "no-ucx")) -}}
{{- fail "config.router.transport: ucx needs UCX on both pools, but config.prefill.no-ucx or config.decode.no-ucx is true; set transport: grpc or enable UCX" -}}
{{- end -}}

{{- /* Each pod serves gRPC and metrics on two different ports. */ -}}
{{- $metricsPort := index .Values.config.common "metrics-port" | int64 -}}
{{- range $role := list "router" "prefill" "decode" "kvstore" -}}
{{- if eq (index $.Values.config $role "port" | int64) $metricsPort -}}
{{- fail (printf "config.%s.port: %d is also config.common.metrics-port; a pod cannot serve gRPC and metrics on one port" $role $metricsPort) -}}
{{- end -}}
{{- end -}}

{{- /* The store's budget must fit its volume. */ -}}
{{- if .Values.kvstore.enabled -}}
{{- $budget := index .Values.config.kvstore "budget-bytes" | int64 -}}
{{- $size := include "baton.quantityBytes" .Values.kvstore.persistence.size | int64 -}}
{{- if gt $budget $size -}}
{{- fail (printf "config.kvstore.budget-bytes: %d exceeds kvstore.persistence.size %s (%d bytes); the store would fill its volume" $budget .Values.kvstore.persistence.size $size) -}}
{{- end -}}
{{- end -}}
{{- end -}}
