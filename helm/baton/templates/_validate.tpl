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
{{- $kind := include "baton.modelKind" . -}}
{{- $from := "model.ringCapacity" -}}
{{- if eq $kind "generate" }}{{ $from = printf "preset %s" .Values.model.generate }}{{ end -}}
{{- if eq $kind "builtin" }}{{ $from = printf "builtin %s" .Values.model.builtin }}{{ end -}}
{{- fail (printf "config.router.default-keep: %d is below the ring capacity C = %d of the model (%s); with default-mode %s use 0 (meaning C) or a value >= %d" $keep $capacity $from $mode $capacity) -}}
{{- end -}}

{{- /* A UCX transfer needs UCX on the sending prefill node and the receiving decode node. */ -}}
{{- if and (eq $router.transport "ucx") (or (index .Values.config.prefill "no-ucx") (index .Values.config.decode "no-ucx")) -}}
{{- fail "config.router.transport: ucx needs UCX on both pools, but config.prefill.no-ucx or config.decode.no-ucx is true; set transport: grpc or enable UCX" -}}
{{- end -}}

{{- /* The nodes refuse a UCX_TLS that can serve RMA over TCP (transfer/ucx.h) unless told
the network is trusted; say so before a pod crash-loops. */ -}}
{{- $usesUcx := not (and (index .Values.config.prefill "no-ucx") (index .Values.config.decode "no-ucx")) -}}
{{- if and $usesUcx (not .Values.ucx.allowUnprotectedTcp) -}}
{{- $ucxTls := include "baton.ucxTls" . -}}
{{- range $name := splitList "," (lower $ucxTls) -}}
{{- if or (eq $name "tcp") (eq $name "all") (hasPrefix "^" $name) -}}
{{- fail (printf "ucx.tls: %q lets UCX serve RMA over TCP in software, where any peer that reaches a node's port reads and writes its memory; list transports whose reads are bounded (sm, mm, posix, sysv, knem, self, rc, dc, ud, ib), use config.router.transport grpc with config.prefill.no-ucx and config.decode.no-ucx, or set ucx.allowUnprotectedTcp for a trusted network" $ucxTls) -}}
{{- end -}}
{{- if eq (trim $name) "cma" -}}
{{- fail (printf "ucx.tls: %q names cma, which reads from whichever process and address the peer names, so a peer could make a node read its own memory; the nodes refuse it (sm and shm are taken as mm, without it): list sm, mm, posix, sysv, knem, self, rc, dc, ud or ib" $ucxTls) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- /* Under the tcp profile UCX has shared memory alone (TCP is refused), and each pod has its
own IPC namespace: no prefill pod's memory reaches a decode pod. */ -}}
{{- if and (eq $router.transport "ucx") (eq .Values.ucx.profile "tcp") (not .Values.ucx.allowUnprotectedTcp) -}}
{{- fail "config.router.transport: ucx with ucx.profile tcp cannot move a StateBlock between pods (UCX has only shared memory there, which no other pod shares, and TCP is refused); use transport grpc on a TCP pod network, or ucx.profile rdma on an RDMA one" -}}
{{- end -}}

{{- /* The rdma profile asks every prefill and decode pod for RDMA devices, which only UCX
transfers use. */ -}}
{{- if and (eq .Values.ucx.profile "rdma") (ne $router.transport "ucx") -}}
{{- fail "ucx.profile: rdma requests RDMA devices for every prefill and decode pod, but config.router.transport is grpc, so StateBlocks would not use them; set config.router.transport: ucx, or ucx.profile: tcp" -}}
{{- end -}}

{{- /* The router forgets a node after node-expiry-ms; a node may wait out glibc's 5 s resolver
timeout besides three heartbeats (router/router_main.cc refuses less). */ -}}
{{- $heartbeat := index $router "heartbeat-ms" | int64 -}}
{{- $expiry := index $router "node-expiry-ms" | int64 -}}
{{- $minExpiry := add (mul 3 $heartbeat) 5000 -}}
{{- if lt $expiry $minExpiry -}}
{{- fail (printf "config.router.node-expiry-ms: %d is below 3 x config.router.heartbeat-ms (%d) + 5000 = %d: three heartbeats plus glibc's 5 s resolver timeout, which a node may wait out; the router refuses it. Raise node-expiry-ms to %d or more, or lower heartbeat-ms" $expiry $heartbeat $minExpiry $minExpiry) -}}
{{- end -}}

{{- include "baton.validateEdge" . -}}
{{- include "baton.validateGpu" . -}}

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

{{- /* The store's budget must fit its volume, with room beside it for RocksDB's write-ahead
log and compaction output: at most 80% of it. */ -}}
{{- if .Values.kvstore.enabled -}}
{{- $budget := index .Values.config.kvstore "budget-bytes" | int64 -}}
{{- $size := include "baton.quantityBytes" .Values.kvstore.persistence.size | int64 -}}
{{- if gt $budget $size -}}
{{- fail (printf "config.kvstore.budget-bytes: %d exceeds kvstore.persistence.size %s (%d bytes); the store would fill its volume" $budget .Values.kvstore.persistence.size $size) -}}
{{- end -}}
{{- if gt (mul $budget 5) (mul $size 4) -}}
{{- fail (printf "config.kvstore.budget-bytes: %d is more than 80%% of kvstore.persistence.size %s (%d bytes); RocksDB needs room beside the data for its write-ahead log and compactions" $budget .Values.kvstore.persistence.size $size) -}}
{{- end -}}
{{- /* Each value has R owners among the store pods: R cannot exceed them. */ -}}
{{- $replicas := .Values.kvstore.replicas | int64 -}}
{{- if gt (.Values.config.kvstore.replication | int64) $replicas -}}
{{- fail (printf "config.kvstore.replication: %d owners per value need at least %d store pods; kvstore.replicas is %d" (.Values.config.kvstore.replication | int64) (.Values.config.kvstore.replication | int64) $replicas) -}}
{{- end -}}
{{- if and .Values.kvstore.persistence.existingClaim (gt $replicas 1) -}}
{{- fail (printf "kvstore.persistence.existingClaim: one claim is one pod's volume; kvstore.replicas is %d (use 1, or leave existingClaim empty for a claim per pod)" $replicas) -}}
{{- end -}}
{{- end -}}
{{- include "baton.validateModelSource" . -}}
{{- include "baton.validateRollout" . -}}
{{- end -}}

{{/* model.source: the download that fills model.volume (batonctl fetch-model). */}}
{{- define "baton.validateModelSource" -}}
{{- $model := .Values.model -}}
{{- $source := $model.source -}}
{{- if and $model.builtin (not $model.generate) -}}
{{- range $field := list "source.uri" "volume.claimName" "volume.path" -}}
{{- $value := index $model (first (splitList "." $field)) (last (splitList "." $field)) -}}
{{- if $value -}}
{{- fail (printf "model.builtin: %q serves the model shipped in the image, but model.%s is %q too; set model.builtin to \"\" to serve the weights of model.volume / model.source" $model.builtin $field $value) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if $source.job.enabled -}}
{{- if or $model.generate $model.builtin (not $source.uri) (ne $model.volume.type "pvc") -}}
{{- fail "model.source.job.enabled: the hook Job fills a shared claim: it needs model.volume.type pvc (a ReadWriteMany claim in model.volume.claimName), model.source.uri and files, and model.builtin and model.generate \"\"" -}}
{{- end -}}
{{- end -}}
{{- if $source.uri -}}
{{- if $model.generate -}}
{{- fail (printf "model.source.uri: model.generate is %q, which replaces the model volume with a generated model; set model.generate to \"\" to download %s" $model.generate $source.uri) -}}
{{- end -}}
{{- $scheme := regexFind "^[a-z0-9]+://" $source.uri | trimSuffix "://" -}}
{{- if not (has $scheme (list "https" "http" "s3" "hf")) -}}
{{- fail (printf "model.source.uri: %q has an unknown scheme; use https://host/dir, http://host/dir, s3://bucket/prefix or hf://org/repo[@revision]" $source.uri) -}}
{{- end -}}
{{- if and (eq $scheme "s3") (not (regexMatch "^s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/.*)?$" $source.uri)) -}}
{{- fail (printf "model.source.uri: %q is not s3://bucket/prefix (a bucket name is 3 to 63 of a-z, 0-9, '.' and '-')" $source.uri) -}}
{{- end -}}
{{- if and (eq $scheme "hf") (not (regexMatch "^hf://[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*(@[A-Za-z0-9._/-]+)?$" $source.uri)) -}}
{{- fail (printf "model.source.uri: %q is not hf://org/repo or hf://org/repo@revision" $source.uri) -}}
{{- end -}}
{{- if and (has $scheme (list "https" "http")) (not (regexMatch "^https?://[^/]+" $source.uri)) -}}
{{- fail (printf "model.source.uri: %q names no host" $source.uri) -}}
{{- end -}}
{{- if and $source.endpoint (has $scheme (list "https" "http")) -}}
{{- fail (printf "model.source.endpoint: only s3:// and hf:// sources take an endpoint; %s already names its server" $source.uri) -}}
{{- end -}}
{{- if not $source.files -}}
{{- fail "model.source.files: name every file to fetch with its sha256 (at least config.json and model.safetensors), e.g. {config.json: <64 hex digits>, model.safetensors: <64 hex digits>}; every download is verified" -}}
{{- end -}}
{{- range $name, $sha256 := $source.files -}}
{{- if not (regexMatch "^[0-9a-f]{64}$" (toString $sha256)) -}}
{{- fail (printf "model.source.files.%s: %q is not a sha256 (64 lowercase hex digits, as `sha256sum %s` prints it)" $name (toString $sha256) $name) -}}
{{- end -}}
{{- end -}}
{{- if not (hasKey $source.files "config.json") -}}
{{- fail "model.source.files: config.json is missing; every role reads it from the model directory" -}}
{{- end -}}
{{- if not (hasKey $source.files "model.safetensors") -}}
{{- fail "model.source.files: model.safetensors is missing; the nodes load it and the store's fingerprint is made from its digest" -}}
{{- end -}}
{{- else -}}
{{- if eq $model.volume.type "emptyDir" -}}
{{- if not (or $model.generate $model.builtin) -}}
{{- fail "model.volume.type: emptyDir starts empty; set model.source.uri (and model.source.files) to download the model into it, or mount weights with pvc or hostPath" -}}
{{- end -}}
{{- end -}}
{{- range $field := list "endpoint" "files" "credentialsSecret" -}}
{{- if index $source $field -}}
{{- fail (printf "model.source.%s: set without model.source.uri, so nothing would be downloaded; set the uri or remove it" $field) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Replicas, rolling updates, disruption budgets and autoscalers of the roles that drain. */}}
{{- define "baton.validateRollout" -}}
{{- range $role := list "router" "prefill" "decode" -}}
{{- $values := index $.Values $role -}}
{{- $update := $values.rollingUpdate -}}
{{- if and (eq (toString $update.maxSurge) "0") (eq (toString $update.maxUnavailable) "0") -}}
{{- fail (printf "%s.rollingUpdate: maxSurge and maxUnavailable are both 0, so a rolling update could neither add nor remove a pod" $role) -}}
{{- end -}}
{{- $a := $values.autoscaling -}}
{{- if $a.enabled -}}
{{- if gt ($a.minReplicas | int64) ($a.maxReplicas | int64) -}}
{{- fail (printf "%s.autoscaling.maxReplicas: %d is below minReplicas %d" $role ($a.maxReplicas | int64) ($a.minReplicas | int64)) -}}
{{- end -}}
{{- if and (eq $a.kind "keda") (not $a.keda.serverAddress) -}}
{{- fail (printf "%s.autoscaling.keda.serverAddress: kind keda queries Prometheus; give its URL, e.g. http://prometheus-operated.monitoring.svc:9090" $role) -}}
{{- end -}}
{{- $targets := dict "router" (list "targetRequestsRunning") "prefill" (list "targetQueueDepth" "targetRunning") "decode" (list "targetPoolUsage" "targetQueueDepth") -}}
{{- $any := false -}}
{{- range $t := index $targets $role -}}
{{- if gt (float64 (index $a $t)) 0.0 }}{{ $any = true }}{{ end -}}
{{- end -}}
{{- if not $any -}}
{{- fail (printf "%s.autoscaling: every target is 0, so the autoscaler would have no metric; set %s" $role (join " or " (index $targets $role))) -}}
{{- end -}}
{{- end -}}
{{- $pdb := $values.pdb -}}
{{- if $pdb.enabled -}}
{{- $min := toString $pdb.minAvailable -}}
{{- $max := toString $pdb.maxUnavailable -}}
{{- if and (eq $min "") (eq $max "") -}}
{{- fail (printf "%s.pdb: set minAvailable or maxUnavailable (or enabled: false)" $role) -}}
{{- end -}}
{{- if and (ne $min "") (ne $max "") -}}
{{- fail (printf "%s.pdb.maxUnavailable: minAvailable is set too; a PodDisruptionBudget takes one of the two (set the other to \"\")" $role) -}}
{{- end -}}
{{- $pods := include "baton.minPods" $values | int64 -}}
{{- if gt $pods 1 -}}
{{- if or (eq $min "0") (eq $min "0%") (eq $max "100%") (and (regexMatch "^[0-9]+$" $max) (ge ($max | int64) $pods)) -}}
{{- fail (printf "%s.pdb: minAvailable %q / maxUnavailable %q lets all %d pods go at once; the budget would protect nothing" $role $min $max $pods) -}}
{{- end -}}
{{- if or (eq $min "100%") (and (regexMatch "^[0-9]+$" $min) (ge ($min | int64) $pods)) -}}
{{- fail (printf "%s.pdb.minAvailable: %s of %d pods must stay up, so no pod could ever be evicted and node drains would hang; use at most %d" $role $min $pods (sub $pods 1)) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}


{{/* The client edge: a router reachable from outside the cluster authenticates its clients. */}}
{{- define "baton.validateEdge" -}}
{{- $router := .Values.router -}}
{{- $apiKeys := $router.apiKeys.secretName -}}
{{- $clientCerts := and $router.clientTls.secretName $router.clientTls.requireClientCert -}}
{{- if not $router.exposeWithoutAuth -}}
{{- if and (ne $router.service.type "ClusterIP") (not $apiKeys) (not $clientCerts) -}}
{{- fail (printf "router.service.type: %s exposes the client API outside the cluster with no client authentication, so anyone who reaches it may generate; set router.apiKeys.secretName (API keys), or router.clientTls.secretName with router.clientTls.requireClientCert (client certificates), or router.exposeWithoutAuth: true when something in front authenticates" $router.service.type) -}}
{{- end -}}
{{- if and (or $router.ingress.enabled $router.gateway.enabled) (not $apiKeys) -}}
{{- fail (printf "router.apiKeys.secretName: router.%s exposes the client API through a proxy that terminates TLS (client certificates do not reach the router), and there are no API keys; set router.apiKeys.secretName, or router.exposeWithoutAuth: true when the proxy authenticates" (ternary "ingress" "gateway" $router.ingress.enabled)) -}}
{{- end -}}
{{- end -}}
{{- if $router.service.loadBalancerSourceRanges -}}
{{- if ne $router.service.type "LoadBalancer" -}}
{{- fail (printf "router.service.loadBalancerSourceRanges: only a LoadBalancer Service takes them; router.service.type is %s" $router.service.type) -}}
{{- end -}}
{{- end -}}
{{- if and $router.service.externalTrafficPolicy (eq $router.service.type "ClusterIP") -}}
{{- fail "router.service.externalTrafficPolicy: only a NodePort or LoadBalancer Service takes it; router.service.type is ClusterIP" -}}
{{- end -}}
{{- $http := ge (index .Values.config.router "http-port" | int64) 0 -}}
{{- with $router.ingress -}}
{{- if .enabled -}}
{{- if not (or .grpcHost .httpHost) -}}
{{- fail "router.ingress.grpcHost: router.ingress.enabled needs a host: grpcHost (gRPC) and/or httpHost (the OpenAI HTTP API)" -}}
{{- end -}}
{{- if and .httpHost (not $http) -}}
{{- fail "router.ingress.httpHost: config.router.http-port is -1 (no HTTP API); turn it on or leave httpHost empty" -}}
{{- end -}}
{{- if and .grpcHost (eq .grpcHost .httpHost) -}}
{{- fail "router.ingress.httpHost: equals grpcHost; the gRPC and HTTP Ingresses route the same path \"/\" and need different hosts" -}}
{{- end -}}
{{- if and $.Values.router.apiKeys.secretName (not .tls) -}}
{{- fail "router.ingress.tls: the Ingresses would carry API keys (bearer tokens) in clear; list IngressTLS objects for their hosts" -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- with $router.gateway -}}
{{- if .enabled -}}
{{- if not .parentRefs -}}
{{- fail "router.gateway.parentRefs: router.gateway.enabled needs the Gateway the routes attach to, e.g. [{name: edge, namespace: gateway}]" -}}
{{- end -}}
{{- if not (or .grpc.enabled (and .http.enabled $http)) -}}
{{- fail "router.gateway.grpc.enabled: router.gateway.enabled renders no route: enable grpc, or http with config.router.http-port on" -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* GPU pools (experimental): one GPU per pod (the schema's bound), Guaranteed QoS, so the
kubelet neither throttles the host threads that feed the GPU nor evicts the pod first, and the
CUDA build of the image (image.flavor). */}}
{{- define "baton.validateGpu" -}}
{{- range $role := list "prefill" "decode" -}}
{{- $values := index $.Values $role -}}
{{- if gt ($values.gpus | int64) 0 -}}
{{- $requests := $values.resources.requests | default dict -}}
{{- $limits := $values.resources.limits | default dict -}}
{{- range $resource := list "cpu" "memory" -}}
{{- $request := index $requests $resource | default "" | toString -}}
{{- $limit := index $limits $resource | default "" | toString -}}
{{- if or (not $request) (not $limit) (ne (include "baton.quantityMilli" $request) (include "baton.quantityMilli" $limit)) -}}
{{- fail (printf "%s.resources.limits.%s: a GPU pod (%s.gpus 1) must be Guaranteed QoS: set resources.requests.%s and resources.limits.%s to the same value (now request %q, limit %q)" $role $resource $role $resource $resource $request $limit) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- /* The cpu build of the image (BATON_CUDA=OFF) has no CUDA backend: a pod that asks for
device cuda would hold its GPU and exit at start (the binary cannot load the backend). */ -}}
{{- if eq .Values.image.flavor "cpu" -}}
{{- range $role := list "prefill" "decode" -}}
{{- $values := index $.Values $role -}}
{{- if gt ($values.gpus | int64) 0 -}}
{{- fail (printf "image.flavor: %s.gpus 1 runs the model with device cuda, but image.flavor is cpu, the image built without CUDA (BATON_CUDA=OFF); name the CUDA image (docker build --build-arg BATON_CUDA=ON, e.g. image.tag 0.1.0-cuda) and set image.flavor: cuda, or set %s.gpus: 0" $role $role) -}}
{{- end -}}
{{- if has "--device=cuda" $values.extraArgs -}}
{{- fail (printf "image.flavor: %s.extraArgs asks for --device cuda, but image.flavor is cpu, the image built without CUDA (BATON_CUDA=OFF); use the CUDA image with image.flavor: cuda and %s.gpus: 1 (which sets device: cuda), or drop the flag" $role $role) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
