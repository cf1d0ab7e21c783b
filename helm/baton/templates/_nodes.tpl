{{/*
A node pool: prefill and decode nodes differ only in their binary, port and values, so both
come from this template. A Deployment (nodes need no stable identity: each registers with the
routers under its pod name, --node-id=$(POD_NAME), and its pod IP, and the routers forget a
node that stops heartbeating), so rolling updates can surge: the new pod starts before the old
one drains. Its headless Service (metrics scraping) and a PodDisruptionBudget. While
<role>.autoscaling is on, the Deployment has no replicas field: the HorizontalPodAutoscaler or
ScaledObject (autoscaling.yaml) owns it, and helm upgrade leaves it alone. Call with
(dict "root" $ "role" "prefill" "binary" "baton-prefill").
*/}}
{{- define "baton.nodePool" -}}
{{- $root := .root -}}
{{- $role := .role -}}
{{- $values := index $root.Values $role -}}
{{- $port := index $root.Values.config $role "port" -}}
{{- $fullname := include "baton.fullname" $root -}}
apiVersion: apps/v1
kind: Deployment
metadata:
  name: {{ $fullname }}-{{ $role }}
  namespace: {{ $root.Release.Namespace }}
  labels:
    {{- include "baton.labels" (dict "root" $root "role" $role) | nindent 4 }}
spec:
  {{- if not $values.autoscaling.enabled }}
  replicas: {{ $values.replicas | int64 }}
  {{- end }}
  {{- include "baton.deploymentStrategy" (dict "root" $root "values" $values) | nindent 2 }}
  selector:
    matchLabels:
      {{- include "baton.selectorLabels" (dict "root" $root "role" $role) | nindent 6 }}
  template:
    {{- include "baton.podTemplate" (dict "root" $root "role" $role "values" $values "binary" .binary "args" (list "--advertise-host=$(POD_IP)" "--node-id=$(POD_NAME)") "ompThreads" $values.ompThreads "dataMount" false) | nindent 4 }}
---
apiVersion: v1
kind: Service
metadata:
  name: {{ $fullname }}-{{ $role }}
  namespace: {{ $root.Release.Namespace }}
  labels:
    {{- include "baton.labels" (dict "root" $root "role" $role) | nindent 4 }}
spec:
  clusterIP: None
  selector:
    {{- include "baton.selectorLabels" (dict "root" $root "role" $role) | nindent 4 }}
  ports:
    - name: grpc
      port: {{ $port | int64 }}
      targetPort: grpc
      protocol: TCP
      appProtocol: grpc
    - name: metrics
      port: {{ index $root.Values.config.common "metrics-port" | int64 }}
      targetPort: metrics
      protocol: TCP
{{- include "baton.pdb" (dict "root" $root "role" $role "pdb" $values.pdb "values" $values) }}
{{- end -}}


{{/* The issuer of the chart's certificates, as JSON {name, kind, group}: tls.certManager.issuerRef,
else the chart's own CA Issuer "<fullname>-ca" (certificates.yaml). */}}
{{- define "baton.certIssuer" -}}
{{- $ref := .Values.tls.certManager.issuerRef -}}
{{- if $ref.name -}}
{{- toJson (dict "name" $ref.name "kind" (default "Issuer" $ref.kind) "group" (default "cert-manager.io" $ref.group)) -}}
{{- else -}}
{{- toJson (dict "name" (printf "%s-ca" (include "baton.fullname" .)) "kind" "Issuer" "group" "cert-manager.io") -}}
{{- end -}}
{{- end -}}

{{/* "true" when a role's pods get a certificate of their own from cert-manager's csi-driver
(tls.certManager.csiDriver): prefill and decode pods, with TLS and cert-manager on and no
tls.existingSecrets entry for the role. Call with (dict "root" $ "role" "prefill"). */}}
{{- define "baton.tlsCsi" -}}
{{- $tls := .root.Values.tls -}}
{{- $pods := or (has .role (list "prefill" "decode")) (and (eq .role "kvstore") (gt (int64 .root.Values.kvstore.replicas) 1)) -}}
{{- if and $tls.enabled $tls.certManager.csiDriver $pods (not (index $tls.existingSecrets .role)) (include "baton.certManager" .root) -}}
true
{{- end -}}
{{- end -}}

{{/* The csi-driver volume of a node pod: a certificate issued for this pod alone, whose URI SAN
spiffe://baton/<role>/<pod name> is the node_id the pod registers (--node-id=$(POD_NAME)), with
the CA beside it (tls.crt, tls.key, ca.crt, like the Secret it replaces). The driver renews it in
place. Call with (dict "root" $ "role" "prefill"). */}}
{{- define "baton.tlsCsiVolume" -}}
{{- $root := .root -}}
{{- $cm := $root.Values.tls.certManager -}}
{{- $issuer := include "baton.certIssuer" $root | fromJson -}}
csi:
  driver: csi.cert-manager.io
  readOnly: true
  volumeAttributes:
    csi.cert-manager.io/issuer-name: {{ $issuer.name | quote }}
    csi.cert-manager.io/issuer-kind: {{ $issuer.kind | quote }}
    csi.cert-manager.io/issuer-group: {{ $issuer.group | quote }}
    csi.cert-manager.io/uri-sans: {{ printf "spiffe://baton/%s/${POD_NAME}" .role | quote }}
    csi.cert-manager.io/duration: {{ $cm.duration | quote }}
    csi.cert-manager.io/renew-before: {{ $cm.renewBefore | quote }}
    csi.cert-manager.io/key-usages: "digital signature,server auth,client auth"
    csi.cert-manager.io/key-encoding: PKCS8
    csi.cert-manager.io/fs-group: {{ $root.Values.podSecurityContext.fsGroup | int64 | quote }}
{{- end -}}

{{/* The store pods' arguments, as a JSON list: with one pod it registers as "kvstore" (its
certificate's instance, spiffe://baton/kvstore/kvstore); in a fleet each registers under its pod
name, which placement weighs, and which a restarted pod keeps. */}}
{{- define "baton.kvstoreArgs" -}}
{{- if gt (int64 .Values.kvstore.replicas) 1 -}}
{{- toJson (list "--advertise-host=$(POD_IP)" "--node-id=$(POD_NAME)") -}}
{{- else -}}
{{- toJson (list "--advertise-host=$(POD_IP)") -}}
{{- end -}}
{{- end -}}
