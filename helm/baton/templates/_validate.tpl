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

{{- /* Each pod serves gRPC, metrics and health on different ports (the router also its
internal port). */ -}}
{{- $metricsPort := index .Values.config.common "metrics-port" | int64 -}}
{{- $healthPort := index .Values.config.common "health-port" | int64 -}}
{{- if eq $healthPort $metricsPort -}}
{{- fail (printf "config.common.health-port: %d is also config.common.metrics-port; a pod cannot serve health probes and metrics on one port" $healthPort) -}}
{{- end -}}
{{- range $role := list "router" "prefill" "decode" "kvstore" -}}
{{- $port := index $.Values.config $role "port" | int64 -}}
{{- if eq $port $metricsPort -}}
{{- fail (printf "config.%s.port: %d is also config.common.metrics-port; a pod cannot serve gRPC and metrics on one port" $role $metricsPort) -}}
{{- end -}}
{{- if eq $port $healthPort -}}
{{- fail (printf "config.%s.port: %d is also config.common.health-port; the health port is plaintext and serves probes only" $role $healthPort) -}}
{{- end -}}
{{- end -}}
{{- $internalPort := index $router "internal-port" | int64 -}}
{{- if eq $internalPort ($router.port | int64) -}}
{{- fail (printf "config.router.internal-port: %d is also config.router.port; the node Registry (mutual TLS) and the client API listen on separate ports" $internalPort) -}}
{{- end -}}
{{- if or (eq $internalPort $metricsPort) (eq $internalPort $healthPort) -}}
{{- fail (printf "config.router.internal-port: %d is also config.common.metrics-port or health-port" $internalPort) -}}
{{- end -}}
{{- $httpPort := index $router "http-port" | int64 -}}
{{- if and (ge $httpPort 0) (eq .Values.model.generate "tiny") -}}
{{- fail "config.router.http-port: the tiny preset has no tokenizer (the HTTP API takes text); set it to -1, or generate small (which gets the image's tokenizer)" -}}
{{- end -}}
{{- if and (ge $httpPort 0) (or (eq $httpPort ($router.port | int64)) (eq $httpPort $internalPort) (eq $httpPort $metricsPort) (eq $httpPort $healthPort)) -}}
{{- fail (printf "config.router.http-port: %d is also config.router.port, internal-port, or config.common.metrics-port or health-port; the HTTP API needs a port of its own (-1: off)" $httpPort) -}}
{{- end -}}

{{- /* Mutual TLS needs a certificate for every role that runs. */ -}}
{{- if .Values.tls.enabled -}}
{{- range $role := include "baton.tlsRoles" $ | fromJsonArray -}}
{{- if not (include "baton.tlsSecret" (dict "root" $ "role" $role)) -}}
{{- fail (printf "tls.existingSecrets.%s: tls.enabled is true but the %s pods have no certificate: cert-manager.io/v1 is not installed (or tls.certManager.enabled is false) and tls.existingSecrets.%s is empty; install cert-manager, name a Secret with tls.crt, tls.key and ca.crt (URI SAN spiffe://baton/%s) in tls.existingSecrets.%s, or set tls.enabled=false (plaintext, trusted test clusters only)" $role $role $role $role $role) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- /* helm test talks to the router as a client: it needs what the client port demands. */ -}}
{{- if .Values.tests.enabled -}}
{{- if and .Values.router.apiKeys.secretName (not .Values.tests.apiKey.secretName) -}}
{{- fail "tests.apiKey.secretName: router.apiKeys.secretName turns API keys on, so the helm test pod needs one; name a Secret (and tests.apiKey.key) holding an API key of the router's file, or set tests.enabled=false" -}}
{{- end -}}
{{- if and .Values.router.clientTls.requireClientCert (not (include "baton.testClientCertSecret" .)) -}}
{{- fail "tests.clientCertSecretName: router.clientTls.requireClientCert is true, so the helm test pod needs a client certificate; name a Secret with tls.crt and tls.key signed by the clientTls Secret's ca.crt (or set tls.existingSecrets.client, or use cert-manager), or set tests.enabled=false" -}}
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
