{{/*
A node pool: prefill and decode nodes differ only in their binary, port and values, so both
come from this template. StatefulSet (stable pod names, which become the nodes' --node-id),
its headless Service (DNS and metrics scraping) and a PodDisruptionBudget. Call with
(dict "root" $ "role" "prefill" "binary" "baton-prefill").
*/}}
{{- define "baton.nodePool" -}}
{{- $root := .root -}}
{{- $role := .role -}}
{{- $values := index $root.Values $role -}}
{{- $port := index $root.Values.config $role "port" -}}
{{- $fullname := include "baton.fullname" $root -}}
apiVersion: apps/v1
kind: StatefulSet
metadata:
  name: {{ $fullname }}-{{ $role }}
  namespace: {{ $root.Release.Namespace }}
  labels:
    {{- include "baton.labels" (dict "root" $root "role" $role) | nindent 4 }}
spec:
  replicas: {{ $values.replicas | int64 }}
  serviceName: {{ $fullname }}-{{ $role }}
  # Nodes are interchangeable; none waits for another to start or stop.
  podManagementPolicy: Parallel
  updateStrategy:
    type: RollingUpdate
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
{{- include "baton.pdb" (dict "root" $root "role" $role "pdb" $values.pdb) }}
{{- end -}}
