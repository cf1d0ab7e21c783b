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
