{{/*
The sections of baton.yaml, one template each, so that configmap.yaml writes the file and every
role's pods carry a checksum of only the sections their binary reads (common plus its own):
a change to config.decode rolls the decode pods and nothing else. Each renders at indentation 0.
*/}}

{{- define "baton.config.common" -}}
{{- $c := .Values.config -}}
common:
  model: {{ include "baton.modelDir" . }}
  host: "::"
  metrics-host: "::"
  metrics-port: {{ index $c.common "metrics-port" | int64 }}
  health-port: {{ index $c.common "health-port" | int64 }}
  {{- if .Values.tls.enabled }}
  tls-ca: /etc/baton-tls/ca.crt
  tls-cert: /etc/baton-tls/tls.crt
  tls-key: /etc/baton-tls/tls.key
  {{- else }}
  # tls.enabled is false: plaintext internal surfaces, for trusted test clusters only.
  insecure-internal: true
  {{- end }}
  log-format: {{ index $c.common "log-format" }}
  log-level: {{ index $c.common "log-level" }}
  router: {{ include "baton.routerAddress" . }}
{{- end -}}

{{- define "baton.config.router" -}}
{{- $c := .Values.config -}}
router:
  port: {{ $c.router.port | int64 }}
  internal-port: {{ index $c.router "internal-port" | int64 }}
  {{- if ge (index $c.router "http-port" | int64) 0 }}
  http-port: {{ index $c.router "http-port" | int64 }}
  {{- end }}
  {{- with .Values.router.clientTls }}
  {{- if .secretName }}
  client-tls-cert: /etc/baton-client-tls/tls.crt
  client-tls-key: /etc/baton-client-tls/tls.key
  {{- if .requireClientCert }}
  client-tls-ca: /etc/baton-client-tls/ca.crt
  {{- end }}
  {{- end }}
  {{- end }}
  {{- if .Values.router.apiKeys.secretName }}
  api-keys: /etc/baton-api-keys/{{ .Values.router.apiKeys.key }}
  {{- end }}
  default-mode: {{ index $c.router "default-mode" }}
  default-keep: {{ index $c.router "default-keep" | int64 }}
  max-tokens-limit: {{ index $c.router "max-tokens-limit" | int64 }}
  max-model-len: {{ index $c.router "max-model-len" | int64 }}
  transport: {{ $c.router.transport }}
  reservation-timeout-ms: {{ index $c.router "reservation-timeout-ms" | int64 }}
  hit-cap: {{ index $c.router "hit-cap" }}
  prefill-policy: {{ index $c.router "prefill-policy" }}
  split: {{ $c.router.split }}
  lookup-timeout-ms: {{ index $c.router "lookup-timeout-ms" | int64 }}
  trace-sample-ratio: {{ index $c.router "trace-sample-ratio" }}
  fidelity-sample-rate: {{ index $c.router "fidelity-sample-rate" }}
  fidelity-tokens: {{ index $c.router "fidelity-tokens" | int64 }}
  max-queued: {{ index $c.router "max-queued" | int64 }}
  prefill-slots: {{ index $c.router "prefill-slots" | int64 }}
  stream-idle-timeout: {{ index $c.router "stream-idle-timeout" | toString | quote }}
  prefill-timeout-ms: {{ index $c.router "prefill-timeout-ms" | int64 }}
  drain-timeout: {{ index $c.router "drain-timeout" | quote }}
  heartbeat-ms: {{ index $c.router "heartbeat-ms" | int64 }}
  node-expiry-ms: {{ index $c.router "node-expiry-ms" | int64 }}
  client-max-connection-age: {{ index $c.router "client-max-connection-age" | toString | quote }}
  client-max-connection-age-grace: {{ index $c.router "client-max-connection-age-grace" | toString | quote }}
  http-threads: {{ index $c.router "http-threads" | int64 }}
  http-max-requests-per-tenant: {{ index $c.router "http-max-requests-per-tenant" | int64 }}
  http-max-connections: {{ index $c.router "http-max-connections" | int64 }}
  http-max-connections-per-client: {{ index $c.router "http-max-connections-per-client" | int64 }}
  http-ipv4-prefix: {{ index $c.router "http-ipv4-prefix" | int64 }}
  {{- with index $c.router "http-trusted-proxies" }}
  http-trusted-proxies:
    {{- range . }}
    - {{ . | quote }}
    {{- end }}
  {{- end }}
  http-head-timeout-ms: {{ index $c.router "http-head-timeout-ms" | int64 }}
  metrics-tenant-names: {{ index $c.router "metrics-tenant-names" }}
  node-forget-after-ms: {{ index $c.router "node-forget-after-ms" | int64 }}
  max-node-ids: {{ index $c.router "max-node-ids" | int64 }}
  max-node-ids-per-identity: {{ index $c.router "max-node-ids-per-identity" | int64 }}
  # The prefix store never gates readiness: without it requests run cold (DESIGN section 6).
  require-kvstore: false
  kvstore-replication: {{ $c.kvstore.replication | int64 }}
  {{- with include "baton.servedModelName" . }}
  served-model-name: {{ . | quote }}
  {{- end }}
  {{- with include "baton.config.modelFiles" (dict "root" . "role" "router") }}
  {{- . | nindent 2 }}
  {{- end }}
{{- end -}}

{{- define "baton.config.prefill" -}}
{{- $c := .Values.config -}}
prefill:
  port: {{ $c.prefill.port | int64 }}
  {{- with include "baton.config.modelFiles" (dict "root" . "role" "prefill") }}
  {{- . | nindent 2 }}
  {{- end }}
  {{- include "baton.config.resolve" . | nindent 2 }}
  {{- with include "baton.servedModelName" . }}
  served-model-name: {{ . | quote }}
  {{- end }}
  {{- if gt (.Values.prefill.gpus | int64) 0 }}
  device: cuda
  {{- end }}
  token-budget: {{ index $c.prefill "token-budget" | int64 }}
  no-ucx: {{ index $c.prefill "no-ucx" }}
  ucx-allow-unprotected-tcp: {{ .Values.ucx.allowUnprotectedTcp }}
  commit-timeout-ms: {{ index $c.prefill "commit-timeout-ms" | int64 }}
  block-cache-bytes: {{ index $c.prefill "block-cache-bytes" | int64 }}
  split: {{ $c.router.split }}
  drain-timeout: {{ index $c.prefill "drain-timeout" | quote }}
  {{- /* No kvstore address: the routers send the live store pods with each request. */}}
{{- end -}}

{{- define "baton.config.decode" -}}
{{- $c := .Values.config -}}
decode:
  port: {{ $c.decode.port | int64 }}
  {{- with include "baton.config.modelFiles" (dict "root" . "role" "decode") }}
  {{- . | nindent 2 }}
  {{- end }}
  {{- include "baton.config.resolve" . | nindent 2 }}
  {{- with include "baton.servedModelName" . }}
  served-model-name: {{ . | quote }}
  {{- end }}
  {{- if gt (.Values.decode.gpus | int64) 0 }}
  device: cuda
  {{- end }}
  slots: {{ $c.decode.slots | int64 }}
  pages: {{ $c.decode.pages | int64 }}
  max-batch: {{ index $c.decode "max-batch" | int64 }}
  replay-rows-per-step: {{ index $c.decode "replay-rows-per-step" | int64 }}
  replay-step-budget: {{ index $c.decode "replay-step-budget" | float64 }}
  speculative: {{ index $c.decode "speculative" | quote }}
  speculative-tokens: {{ index $c.decode "speculative-tokens" | int64 }}
  speculative-policy: {{ index $c.decode "speculative-policy" | quote }}
  max-waiting: {{ index $c.decode "max-waiting" | int64 }}
  fidelity-queue: {{ index $c.decode "fidelity-queue" | int64 }}
  no-ucx: {{ index $c.decode "no-ucx" }}
  ucx-peer-errors: {{ index $c.decode "ucx-peer-errors" }}
  ucx-allow-unprotected-tcp: {{ .Values.ucx.allowUnprotectedTcp }}
  stream-idle-timeout: {{ index $c.decode "stream-idle-timeout" | toString | quote }}
  drain-timeout: {{ index $c.decode "drain-timeout" | quote }}
{{- end -}}

{{- define "baton.config.kvstore" -}}
{{- $c := .Values.config -}}
kvstore:
  port: {{ $c.kvstore.port | int64 }}
  {{- with include "baton.config.modelFiles" (dict "root" . "role" "kvstore") }}
  {{- . | nindent 2 }}
  {{- end }}
  {{- include "baton.config.resolve" . | nindent 2 }}
  data-dir: /var/lib/baton/kvstore
  budget-bytes: {{ index $c.kvstore "budget-bytes" | int64 }}
  sync-writes: {{ index $c.kvstore "sync-writes" }}
  compression: {{ $c.kvstore.compression }}
{{- end -}}

{{/* config.common.router-resolve-ms, in the sections of the binaries that register with the
router (prefill, decode, kvstore): only they resolve its name, so a change rolls only them and
the router's section does not carry a key it ignores. */}}
{{- define "baton.config.resolve" -}}
router-resolve-ms: {{ index .Values.config.common "router-resolve-ms" | int64 }}
{{- end -}}

{{/* The checksum annotation's value for one role: common plus the role's section. Call with
(dict "root" $ "role" "decode"). */}}
{{- define "baton.configChecksum" -}}
{{- printf "%s\n%s" (include "baton.config.common" .root) (include (printf "baton.config.%s" .role) .root) | sha256sum -}}
{{- end -}}

{{/* The drain timeout of a role in whole seconds (config.<role>.drain-timeout is "<N>s"). */}}
{{- define "baton.drainSeconds" -}}
{{- index .root.Values.config .role "drain-timeout" | trimSuffix "s" | int64 -}}
{{- end -}}
