{{/*
Names, labels and the pod parts every role shares. Object names are "<fullname>-<role>";
fullname is cut to 42 characters so that the longest derived name (a StatefulSet pod's
controller-revision-hash label, "<fullname>-kvstore-<10 characters>") stays within 63.
*/}}

{{- define "baton.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 42 | trimSuffix "-" -}}
{{- end -}}

{{- define "baton.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 42 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 42 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 42 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "baton.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The image of every container that runs baton's binaries: repository@digest when
image.digest is set (the tag is then ignored, so every pod runs the same bytes whatever the tag
points to later), else repository:tag (the chart's appVersion when the tag is empty). */}}
{{- define "baton.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{/* The ServiceAccount the pods run as: serviceAccountName (the chart's first value for it)
wins; else serviceAccount.name, or <fullname> when the chart creates the account, or the
namespace's "default" when it does not. */}}
{{- define "baton.serviceAccountName" -}}
{{- if .Values.serviceAccountName -}}
{{- .Values.serviceAccountName -}}
{{- else if .Values.serviceAccount.create -}}
{{- default (include "baton.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* "true" when the chart creates the pods' ServiceAccount (serviceAccount.create, and no
serviceAccountName naming another); empty otherwise. */}}
{{- define "baton.createServiceAccount" -}}
{{- if and .Values.serviceAccount.create (not .Values.serviceAccountName) -}}true{{- end -}}
{{- end -}}

{{/* The ServiceAccount of the model Job (model.source.job). The Job is a pre-install hook: it
runs before the release's own objects exist, so when the chart creates the account the Job gets
a hook account of its own, <fullname>-fetch-model (serviceaccount.yaml), created before it and
deleted with it; an account the chart does not create exists already and is used as it is. */}}
{{- define "baton.jobServiceAccountName" -}}
{{- if include "baton.createServiceAccount" . -}}
{{- printf "%s-fetch-model" (include "baton.fullname" .) -}}
{{- else -}}
{{- include "baton.serviceAccountName" . -}}
{{- end -}}
{{- end -}}

{{/* Labels of every object; call with (dict "root" $ "role" "router"). */}}
{{- define "baton.labels" -}}
helm.sh/chart: {{ include "baton.chart" .root }}
{{ include "baton.selectorLabels" . }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
app.kubernetes.io/part-of: baton
{{- end -}}

{{/* Selector labels of one role; call with (dict "root" $ "role" "router"). */}}
{{- define "baton.selectorLabels" -}}
app.kubernetes.io/name: {{ include "baton.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .role }}
{{- end -}}

{{/* The address nodes register with: the router's internal Service, which also lists routers
that are not ready yet (a router is ready only once nodes have registered with it). Fully
qualified with a trailing dot, so the resolver tries the name as it is and not first under each
of the pod's search domains (ndots:5). */}}
{{- define "baton.routerAddress" -}}
{{- printf "%s-router-internal.%s.svc.%s.:%d" (include "baton.fullname" .) .Release.Namespace .Values.clusterDomain (int64 (index .Values.config.router "internal-port")) -}}
{{- end -}}


{{/* Where the model comes from: "generate" (model.generate, an init container makes it),
"builtin" (model.builtin, in the image), "source" (model.source downloads it into model.volume)
or "volume" (model.volume holds it). */}}
{{- define "baton.modelKind" -}}
{{- if .Values.model.generate -}}generate
{{- else if .Values.model.builtin -}}builtin
{{- else if .Values.model.source.uri -}}source
{{- else -}}volume
{{- end -}}
{{- end -}}

{{/* "true" when the hook Job fills the shared claim (model.source.job) and the pods only mount
it read-only; empty otherwise. */}}
{{- define "baton.modelJob" -}}
{{- if and (eq (include "baton.modelKind" .) "source") .Values.model.source.job.enabled -}}true{{- end -}}
{{- end -}}

{{/* The model directory every binary reads (common.model). A downloaded model (model.source)
lives in a directory named by its content, /models/<digest>/baton (baton.modelDigest): an upgrade
to other weights fetches a new directory beside the old one instead of replacing it, so that a
`helm rollback` points the pods back at the old weights, still on the volume; the directory's own
name stays "baton", the served name's default. */}}
{{- define "baton.modelDir" -}}
{{- $kind := include "baton.modelKind" . -}}
{{- if eq $kind "builtin" -}}
{{- printf "/usr/local/share/baton/models/%s" .Values.model.builtin -}}
{{- else if eq $kind "source" -}}
{{- printf "/models/%s/baton" (include "baton.modelDigest" .) -}}
{{- else -}}
/models/baton
{{- end -}}
{{- end -}}

{{/* The digest that names a downloaded model: SHA-256 of its model.source.files as lines
"NAME=SHA256\n" in name order. Two releases with the same files share the directory; any other
file or digest gives another one. */}}
{{- define "baton.modelDigest" -}}
{{- $lines := "" -}}
{{- range $name, $sha256 := .Values.model.source.files -}}
{{- $lines = printf "%s%s=%s\n" $lines $name (lower $sha256) -}}
{{- end -}}
{{- sha256sum $lines -}}
{{- end -}}

{{/* The config keys that tie a role to the release's weights: `model-file: [NAME=SHA256, ...]`
for the files the role fetched (baton.sourceFiles), which the binary checks against the fetch
marker at start (a rollback onto other weights refuses to start, naming the file), and for a
store that fetched only config.json, `weights-sha256`, its fingerprint's other half. Nothing
without model.source. Call with (dict "root" $ "role" "router"); renders at indentation 0. */}}
{{- define "baton.config.modelFiles" -}}
{{- if eq (include "baton.modelKind" .root) "source" -}}
{{- $files := include "baton.sourceFiles" . | fromJson -}}
model-file:
{{- range $name, $sha256 := $files }}
  - {{ printf "%s=%s" $name (lower $sha256) | quote }}
{{- end }}
{{- $weights := index .root.Values.model.source.files "model.safetensors" | default "" | toString -}}
{{- if and (eq .role "kvstore") (not (hasKey $files "model.safetensors")) $weights }}
weights-sha256: {{ $weights | lower | quote }}
{{- end }}
{{- end -}}
{{- end -}}

{{/* The served model name to render, or empty to leave it to the binaries (the model
directory's name, "baton"): model.servedName, else "baton" for a builtin model, whose directory
has the model's own name, so that clients ask for "baton" whatever the model. */}}
{{- define "baton.servedModelName" -}}
{{- if .Values.model.servedName -}}
{{- .Values.model.servedName -}}
{{- else if eq (include "baton.modelKind" .) "builtin" -}}
baton
{{- end -}}
{{- end -}}

{{/* The model.source files a role downloads (a JSON object, name -> sha256): every file,
except that on a per-pod emptyDir the router takes only what it reads (config.json,
generation_config.json and the tokenizer's files) and the store only config.json (its
fingerprint takes the weights' digest from the values, weights-sha256, not from the file). On a
shared volume every role fetches the whole set, since batonctl fetch-model replaces a directory
whose file set differs. Call with (dict "root" $ "role" "router"). */}}
{{- define "baton.sourceFiles" -}}
{{- $files := .root.Values.model.source.files -}}
{{- if and (has .role (list "router" "kvstore")) (eq .root.Values.model.volume.type "emptyDir") -}}
{{- $pattern := ternary "^(config\\.json|generation_config\\.json|special_tokens_map\\.json|tokenizer.*)$" "^config\\.json$" (eq .role "router") -}}
{{- $files = dict -}}
{{- range $name, $sha256 := .root.Values.model.source.files -}}
{{- if regexMatch $pattern $name -}}
{{- $_ := set $files $name $sha256 -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- toJson $files -}}
{{- end -}}

{{/* "true" when the chart renders cert-manager objects: tls.certManager.enabled true, or auto
with the cert-manager.io/v1 API installed (helm install asks the cluster; helm template needs
--api-versions cert-manager.io/v1); empty otherwise. */}}
{{- define "baton.certManager" -}}
{{- $enabled := .Values.tls.certManager.enabled -}}
{{- if or (eq (toString $enabled) "true") (and (eq (toString $enabled) "auto") (.Capabilities.APIVersions.Has "cert-manager.io/v1")) -}}
true
{{- end -}}
{{- end -}}

{{/* The Secret holding a role's certificate, key and CA (tls.crt, tls.key, ca.crt):
tls.existingSecrets.<role>, else the one cert-manager writes for the chart's Certificate
"<fullname>-<role>-tls", else empty. Call with (dict "root" $ "role" "router"). */}}
{{- define "baton.tlsSecret" -}}
{{- $existing := index .root.Values.tls.existingSecrets .role -}}
{{- if $existing -}}
{{- $existing -}}
{{- else if include "baton.certManager" .root -}}
{{- printf "%s-%s-tls" (include "baton.fullname" .root) .role -}}
{{- end -}}
{{- end -}}

{{/* The roles that serve or call internal surfaces and so need a certificate. */}}
{{- define "baton.tlsRoles" -}}
{{- $roles := list "router" "prefill" "decode" -}}
{{- if .Values.kvstore.enabled }}{{ $roles = append $roles "kvstore" }}{{ end -}}
{{- toJson $roles -}}
{{- end -}}

{{/* The Secret of the `helm test` pod's client certificate (router.clientTls.requireClientCert):
tests.clientCertSecretName, else the client role's Secret. */}}
{{- define "baton.testClientCertSecret" -}}
{{- default (include "baton.tlsSecret" (dict "root" . "role" "client")) .Values.tests.clientCertSecretName -}}
{{- end -}}

{{/* The ring capacity C the router checks default-keep against: the generated preset's, the
builtin model's (config.json of models/ced-brown-shared, -replay and -plain: W = 64, max_backtrack 5, so C = 70) or
model.ringCapacity. */}}
{{- define "baton.ringCapacity" -}}
{{- $kind := include "baton.modelKind" . -}}
{{- if eq .Values.model.generate "tiny" -}}22
{{- else if has .Values.model.generate (list "small" "small-shared") -}}134
{{- else if eq $kind "builtin" -}}70
{{- else -}}{{ int64 .Values.model.ringCapacity }}
{{- end -}}
{{- end -}}

{{/* A Kubernetes quantity ("10Gi", "500M", "1073741824") in bytes, as an integer string. */}}
{{- define "baton.quantityBytes" -}}
{{- $q := toString . -}}
{{- $number := regexFind "^[0-9]+(\\.[0-9]+)?" $q -}}
{{- $suffix := trimPrefix $number $q -}}
{{- $scale := dict "" 1.0 "k" 1e3 "M" 1e6 "G" 1e9 "T" 1e12 "P" 1e15 "E" 1e18 "Ki" 1024.0 "Mi" 1048576.0 "Gi" 1073741824.0 "Ti" 1099511627776.0 "Pi" 1125899906842624.0 "Ei" 1152921504606846976.0 -}}
{{- mulf (float64 $number) (get $scale $suffix) | int64 -}}
{{- end -}}

{{/* A Kubernetes quantity ("500m", "2", "1.5Gi") in thousandths, as an integer string, so two
spellings of one amount compare equal. */}}
{{- define "baton.quantityMilli" -}}
{{- $q := toString . -}}
{{- $number := regexFind "^[0-9]+(\\.[0-9]+)?" $q -}}
{{- $suffix := trimPrefix $number $q -}}
{{- $scale := dict "m" 0.001 "" 1.0 "k" 1e3 "M" 1e6 "G" 1e9 "T" 1e12 "Ki" 1024.0 "Mi" 1048576.0 "Gi" 1073741824.0 "Ti" 1099511627776.0 -}}
{{- mulf (float64 $number) (get $scale $suffix | default 0.0) 1000.0 | int64 -}}
{{- end -}}

{{/* Pod anti-affinity preset; call with (dict "root" $ "role" "prefill" "mode" "soft"). */}}
{{- define "baton.antiAffinity" -}}
{{- $term := dict "topologyKey" .root.Values.antiAffinityTopologyKey "labelSelector" (dict "matchLabels" (fromYaml (include "baton.selectorLabels" .))) -}}
{{- if eq .mode "hard" -}}
{{- toYaml (dict "podAntiAffinity" (dict "requiredDuringSchedulingIgnoredDuringExecution" (list $term))) -}}
{{- else if eq .mode "soft" -}}
{{- toYaml (dict "podAntiAffinity" (dict "preferredDuringSchedulingIgnoredDuringExecution" (list (dict "weight" 100 "podAffinityTerm" $term)))) -}}
{{- end -}}
{{- end -}}

{{/* Scheduling fields of a pod spec; call with (dict "root" $ "role" "prefill" "values"
.Values.prefill "antiAffinity" "soft"). A role with gpus > 0 also gets gpu.nodeSelector (under
its own nodeSelector, whose keys win), gpu.tolerations and, unless it names its own,
gpu.runtimeClassName. A topology spread constraint without a labelSelector gets the role's
selector labels. */}}
{{- define "baton.scheduling" -}}
{{- $values := .values -}}
{{- $gpu := .root.Values.gpu -}}
{{- $gpus := dig "gpus" 0 $values | int64 -}}
{{- $nodeSelector := $values.nodeSelector -}}
{{- $tolerations := $values.tolerations -}}
{{- $runtimeClass := $values.runtimeClassName -}}
{{- if gt $gpus 0 -}}
{{- $nodeSelector = merge (deepCopy $values.nodeSelector) $gpu.nodeSelector -}}
{{- $tolerations = concat $values.tolerations $gpu.tolerations -}}
{{- $runtimeClass = $values.runtimeClassName | default $gpu.runtimeClassName -}}
{{- end -}}
{{- if $values.priorityClassName }}
priorityClassName: {{ $values.priorityClassName | quote }}
{{- end }}
{{- if $runtimeClass }}
runtimeClassName: {{ $runtimeClass | quote }}
{{- end }}
{{- with $nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $values.topologySpreadConstraints }}
topologySpreadConstraints:
  {{- range . }}
  {{- $constraint := deepCopy . }}
  {{- if not (hasKey $constraint "labelSelector") }}
  {{- $_ := set $constraint "labelSelector" (dict "matchLabels" (fromYaml (include "baton.selectorLabels" (dict "root" $.root "role" $.role)))) }}
  {{- end }}
  - {{ toYaml $constraint | nindent 4 | trim }}
  {{- end }}
{{- end }}
{{- if $values.affinity }}
affinity:
  {{- toYaml $values.affinity | nindent 2 }}
{{- else if and .antiAffinity (ne .antiAffinity "none") }}
affinity:
  {{- include "baton.antiAffinity" (dict "root" .root "role" .role "mode" .antiAffinity) | nindent 2 }}
{{- end }}
{{- end -}}

{{/* Pod-level fields every role shares. */}}
{{- define "baton.podCommon" -}}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
serviceAccountName: {{ include "baton.serviceAccountName" . | quote }}
automountServiceAccountToken: false
enableServiceLinks: false
securityContext:
  {{- toYaml .Values.podSecurityContext | nindent 2 }}
{{- end -}}

{{/* Annotations that roll a role's pods when the part of the config file it reads (common and
its own section) changes; call with (dict "root" $ "role" "decode" "values" .Values.decode). */}}
{{- define "baton.podAnnotations" -}}
checksum/config: {{ include "baton.configChecksum" . }}
{{- /* The pod's emptyDirs hold only what it rebuilds at start (scratch files, a generated or
downloaded model): the cluster-autoscaler may evict it to remove a node. */}}
{{- $kind := include "baton.modelKind" .root }}
{{- $modelScratch := or (eq $kind "generate") (and (ne $kind "builtin") (eq .root.Values.model.volume.type "emptyDir")) }}
cluster-autoscaler.kubernetes.io/safe-to-evict-local-volumes: {{ ternary "tmp,model" "tmp" $modelScratch | quote }}
{{- with .values.podAnnotations }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* The init container that fills the "model" volume: a generated model (model.generate) into
an emptyDir, or the verified download of model.source into model.volume (the role's files,
baton.sourceFiles). With a source the volume is mounted on /models and the model is its
directory "baton": batonctl fetch-model replaces that directory as a whole (it cannot be a
mount point) and locks baton.lock beside it, in the volume, so pods sharing a claim download
once; a directory already complete with the same digests is left as it is. A builtin model, a
mounted volume and a claim the hook Job fills (model.source.job) need none. Call with
(dict "root" $ "role" "router"). */}}
{{- define "baton.modelInit" -}}
{{- $root := .root -}}
{{- $kind := include "baton.modelKind" $root -}}
{{- if and (eq $kind "source") (not (include "baton.modelJob" $root)) }}
initContainers:
  {{- include "baton.fetchModelContainer" (dict "root" $root "files" (include "baton.sourceFiles" . | fromJson)) | nindent 2 }}
    volumeMounts:
      - name: model
        mountPath: /models
        {{- with $root.Values.model.volume.subPath }}
        subPath: {{ . }}
        {{- end }}
      - name: tmp
        mountPath: /tmp
{{- else if eq $kind "generate" }}
initContainers:
  - name: make-model
    image: {{ include "baton.image" $root }}
    imagePullPolicy: {{ $root.Values.image.pullPolicy }}
    command:
      - /usr/local/bin/batonctl
      - make-model
      - --preset={{ $root.Values.model.generate }}
      - --out=/models/baton
      {{- if has $root.Values.model.generate (list "small" "small-shared") }}
      # The image's tokenizer (scripts/build_tokenizer.sh: 4,096 pieces, small's vocabulary),
      # for the HTTP API.
      - --tokenizer=/usr/local/share/baton/tokenizer
      {{- end }}
    resources:
      {{- toYaml $root.Values.model.generateResources | nindent 6 }}
    securityContext:
      {{- toYaml $root.Values.securityContext | nindent 6 }}
    volumeMounts:
      - name: model
        mountPath: /models/baton
      - name: tmp
        mountPath: /tmp
{{- end }}
{{- end -}}

{{/* The fetch-model container (batonctl fetch-model of model.source into /models/<digest>/baton), less
its volumeMounts; call with (dict "root" $ "files" (dict NAME SHA256 ...)). Shared by the pods'
init container and the hook Job. */}}
{{- define "baton.fetchModelContainer" -}}
{{- $source := .root.Values.model.source -}}
- name: fetch-model
  image: {{ include "baton.image" .root }}
  imagePullPolicy: {{ .root.Values.image.pullPolicy }}
  command:
    - /usr/local/bin/batonctl
    - fetch-model
    - {{ printf "--source=%s" $source.uri | quote }}
    - {{ printf "--dest=%s" (include "baton.modelDir" .root) | quote }}
    {{- range $name, $sha256 := .files }}
    - {{ printf "--file=%s=%s" $name $sha256 | quote }}
    {{- end }}
    {{- if $source.endpoint }}
    - {{ printf "--endpoint=%s" $source.endpoint | quote }}
    {{- end }}
    - --retries={{ $source.retries | int64 }}
  {{- with .root.Values.extraEnv }}
  env:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $source.credentialsSecret }}
  envFrom:
    - secretRef:
        name: {{ . }}
  {{- end }}
  resources:
    {{- toYaml $source.resources | nindent 4 }}
  securityContext:
    {{- toYaml .root.Values.securityContext | nindent 4 }}
{{- end -}}

{{/* Volumes every role shares: the model, the config file, /tmp and (tls.enabled) the role's
certificate Secret; the router adds its client TLS and API key Secrets. Call with
(dict "root" $ "role" "router"). Secrets are mounted as whole volumes, never with subPath, so
that renewed files reach the pod. defaultMode 0440 (288): readable by the pod's fsGroup. */}}
{{- define "baton.volumes" -}}
{{- $root := .root -}}
{{- with $root -}}
{{- if include "baton.tlsCsi" (dict "root" . "role" $.role) }}
- name: tls
  {{- include "baton.tlsCsiVolume" (dict "root" . "role" $.role) | nindent 2 }}
{{- else if .Values.tls.enabled }}
- name: tls
  secret:
    secretName: {{ include "baton.tlsSecret" (dict "root" . "role" $.role) }}
    defaultMode: 288
{{- end }}
{{- if eq $.role "router" }}
{{- if .Values.router.clientTls.secretName }}
- name: client-tls
  secret:
    secretName: {{ .Values.router.clientTls.secretName }}
    defaultMode: 288
{{- end }}
{{- if .Values.router.apiKeys.secretName }}
- name: api-keys
  secret:
    secretName: {{ .Values.router.apiKeys.secretName }}
    defaultMode: 288
    items:
      - key: {{ .Values.router.apiKeys.key | quote }}
        path: {{ .Values.router.apiKeys.key | quote }}
{{- end }}
{{- end }}
- name: config
  configMap:
    name: {{ include "baton.fullname" . }}-config
- name: tmp
  emptyDir:
    sizeLimit: {{ .Values.tmpSizeLimit }}
{{- $kind := include "baton.modelKind" . }}
{{- if ne $kind "builtin" }}
- name: model
{{- if eq $kind "generate" }}
  emptyDir:
    sizeLimit: {{ .Values.model.generateSizeLimit }}
{{- else if eq .Values.model.volume.type "emptyDir" }}
  emptyDir:
    sizeLimit: {{ include "baton.modelEmptyDirLimit" (dict "root" . "role" $.role) }}
{{- else if eq .Values.model.volume.type "pvc" }}
  persistentVolumeClaim:
    claimName: {{ .Values.model.volume.claimName }}
    {{- if or (ne $kind "source") (include "baton.modelJob" .) }}
    readOnly: true
    {{- end }}
{{- else }}
  hostPath:
    path: {{ .Values.model.volume.path }}
    type: Directory
{{- end }}
{{- end }}
{{- if and (eq $.role "kvstore") .Values.kvstore.persistence.existingClaim }}
- name: data
  persistentVolumeClaim:
    claimName: {{ .Values.kvstore.persistence.existingClaim }}
{{- end }}
{{- with (index .Values $.role).extraVolumes }}
{{ tpl (toYaml .) $root }}
{{- end }}
{{- end }}
{{- end -}}

{{/* The size limit of a role's model emptyDir (model.volume.type emptyDir with model.source):
the router keeps only config.json and the tokenizer. Call with (dict "root" $ "role" "router"). */}}
{{- define "baton.modelEmptyDirLimit" -}}
{{- if eq .role "router" -}}{{ .root.Values.model.volume.routerSizeLimit }}{{- else -}}{{ .root.Values.model.volume.sizeLimit }}{{- end -}}
{{- end -}}

{{/* The ephemeral storage a role's pod writes: its /tmp emptyDir and, when the model lives in
an emptyDir (model.generate, or model.source into type emptyDir), the model's, in Mi (rounded
up). Call with (dict "root" $ "role" "router"). */}}
{{- define "baton.ephemeralMi" -}}
{{- $root := .root -}}
{{- $kind := include "baton.modelKind" $root -}}
{{- $bytes := include "baton.quantityBytes" $root.Values.tmpSizeLimit | int64 -}}
{{- if eq $kind "generate" -}}
{{- $bytes = add $bytes (include "baton.quantityBytes" $root.Values.model.generateSizeLimit | int64) -}}
{{- else if and (ne $kind "builtin") (eq $root.Values.model.volume.type "emptyDir") -}}
{{- $bytes = add $bytes (include "baton.quantityBytes" (include "baton.modelEmptyDirLimit" .) | int64) -}}
{{- end -}}
{{- div (add $bytes 1048575) 1048576 -}}
{{- end -}}

{{/* Mounts of the volumes above; call with (dict "root" $ "role" "router"). */}}
{{- define "baton.volumeMounts" -}}
{{- $root := .root -}}
{{- with $root -}}
{{- if .Values.tls.enabled }}
- name: tls
  mountPath: /etc/baton-tls
  readOnly: true
{{- end }}
{{- if eq $.role "router" }}
{{- if .Values.router.clientTls.secretName }}
- name: client-tls
  mountPath: /etc/baton-client-tls
  readOnly: true
{{- end }}
{{- if .Values.router.apiKeys.secretName }}
- name: api-keys
  mountPath: /etc/baton-api-keys
  readOnly: true
{{- end }}
{{- end }}
- name: config
  mountPath: /etc/baton
  readOnly: true
- name: tmp
  mountPath: /tmp
{{- /* With model.source the volume holds the model as its directory "baton" (see
baton.modelInit); otherwise the volume (or its subPath) is the model directory. A builtin
model is in the image. */}}
{{- $kind := include "baton.modelKind" . }}
{{- if ne $kind "builtin" }}
- name: model
  mountPath: {{ if eq $kind "source" }}/models{{ else }}/models/baton{{ end }}
  readOnly: true
  {{- if and (ne $kind "generate") .Values.model.volume.subPath }}
  subPath: {{ .Values.model.volume.subPath }}
  {{- end }}
{{- end }}
{{- with (index .Values $.role).extraVolumeMounts }}
{{ toYaml . }}
{{- end }}
{{- end }}
{{- end -}}

{{/* UCX_TLS: ucx.tls, else the profile's (tcp: sm,self; rdma: the verbs transports first). */}}
{{- define "baton.ucxTls" -}}
{{- .Values.ucx.tls | default (ternary "rc,ud,sm,self" "sm,self" (eq .Values.ucx.profile "rdma")) -}}
{{- end -}}

{{/* Environment every baton container gets; call with (dict "root" $ "ompThreads" n). */}}
{{- define "baton.env" -}}
- name: POD_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
- name: POD_IP
  valueFrom:
    fieldRef:
      fieldPath: status.podIP
- name: UCX_TLS
  value: {{ include "baton.ucxTls" .root | quote }}
{{- if .root.Values.ucx.netDevices }}
- name: UCX_NET_DEVICES
  value: {{ .root.Values.ucx.netDevices | quote }}
{{- end }}
{{- if .ompThreads }}
- name: OMP_NUM_THREADS
  value: {{ .ompThreads | int64 | quote }}
{{- end }}
{{- with .root.Values.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Container ports and gRPC health probes; call with (dict "root" $ "role" "router" "port" n
"values" .Values.router). The router also serves the node Registry on "internal". Probes go to
the plaintext health port (the kubelet cannot present a client certificate; gRPC probes take a
port number, not a name); readiness asks for the overall service "", liveness and start-up for
"liveness". Their fields are probes.* with the role's <role>.probes over them. */}}
{{- define "baton.portsAndProbes" -}}
{{- $probes := mergeOverwrite (deepCopy .root.Values.probes) (deepCopy (.values.probes | default dict)) -}}
{{- $health := index .root.Values.config.common "health-port" | int64 -}}
ports:
  - name: grpc
    containerPort: {{ .port | int64 }}
    protocol: TCP
  {{- if eq .role "router" }}
  - name: internal
    containerPort: {{ index .root.Values.config.router "internal-port" | int64 }}
    protocol: TCP
  {{- if ge (index .root.Values.config.router "http-port" | int64) 0 }}
  - name: http
    containerPort: {{ index .root.Values.config.router "http-port" | int64 }}
    protocol: TCP
  {{- end }}
  {{- end }}
  - name: metrics
    containerPort: {{ index .root.Values.config.common "metrics-port" | int64 }}
    protocol: TCP
  - name: health
    containerPort: {{ $health }}
    protocol: TCP
startupProbe:
  grpc:
    port: {{ $health }}
    service: liveness
  {{- include "baton.probeFields" $probes.startup | nindent 2 }}
readinessProbe:
  grpc:
    port: {{ $health }}
  {{- include "baton.probeFields" $probes.readiness | nindent 2 }}
  successThreshold: {{ $probes.readiness.successThreshold | int64 }}
livenessProbe:
  grpc:
    port: {{ $health }}
    service: liveness
  {{- include "baton.probeFields" $probes.liveness | nindent 2 }}
{{- end -}}

{{/* The timing fields every probe has. */}}
{{- define "baton.probeFields" -}}
initialDelaySeconds: {{ .initialDelaySeconds | int64 }}
periodSeconds: {{ .periodSeconds | int64 }}
timeoutSeconds: {{ .timeoutSeconds | int64 }}
failureThreshold: {{ .failureThreshold | int64 }}
{{- end -}}

{{/* The fewest pods a role runs: autoscaling.minReplicas while autoscaling, else replicas. Call
with the role's values. */}}
{{- define "baton.minPods" -}}
{{- if and .autoscaling .autoscaling.enabled -}}
{{- .autoscaling.minReplicas | int64 -}}
{{- else -}}
{{- .replicas | int64 -}}
{{- end -}}
{{- end -}}

{{/* A PodDisruptionBudget, only for a role that runs more than one pod (with one, a budget
either blocks every node drain or protects nothing); call with (dict "root" $ "role" "router"
"pdb" .Values.router.pdb "values" .Values.router). */}}
{{- define "baton.pdb" -}}
{{- if and .pdb.enabled (gt (include "baton.minPods" .values | int64) 1) }}
---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata:
  name: {{ include "baton.fullname" .root }}-{{ .role }}
  namespace: {{ .root.Release.Namespace }}
  labels:
    {{- include "baton.labels" . | nindent 4 }}
spec:
  {{- if ne (toString .pdb.minAvailable) "" }}
  minAvailable: {{ include "baton.intOrPercent" .pdb.minAvailable }}
  {{- else }}
  maxUnavailable: {{ include "baton.intOrPercent" .pdb.maxUnavailable }}
  {{- end }}
  {{- if semverCompare ">=1.26-0" .root.Capabilities.KubeVersion.Version }}
  # A pod that is not Ready protects nothing: evicting it never blocks a node drain (with the
  # default, routers NotReady for want of nodes would hang every drain of their nodes).
  unhealthyPodEvictionPolicy: AlwaysAllow
  {{- end }}
  selector:
    matchLabels:
      {{- include "baton.selectorLabels" . | nindent 6 }}
{{- end }}
{{- end -}}

{{/* A Deployment's progressDeadlineSeconds and strategy: the role's rollingUpdate under
upgrade.strategy surge, maxSurge 0 and maxUnavailable 1 under in-place (for pools with no room
for a surge pod). Call with (dict "root" $ "values" .Values.router). */}}
{{- define "baton.deploymentStrategy" -}}
{{- $update := .values.rollingUpdate -}}
{{- if eq .root.Values.upgrade.strategy "in-place" -}}
{{- $update = dict "maxSurge" 0 "maxUnavailable" 1 -}}
{{- end -}}
progressDeadlineSeconds: {{ .root.Values.progressDeadlineSeconds | int64 }}
strategy:
  type: RollingUpdate
  rollingUpdate:
    maxSurge: {{ include "baton.intOrPercent" $update.maxSurge }}
    maxUnavailable: {{ include "baton.intOrPercent" $update.maxUnavailable }}
{{- end -}}

{{/* A number as a quoted Kubernetes quantity: "4", or "700m" for 0.7. */}}
{{- define "baton.quantity" -}}
{{- $milli := round (mulf (float64 .) 1000.0) 0 | int64 -}}
{{- if eq (mod $milli 1000) 0 -}}{{ div $milli 1000 | toString | quote }}{{- else -}}{{ printf "%dm" $milli | quote }}{{- end -}}
{{- end -}}

{{/* An integer or a percentage string, as Kubernetes' IntOrString wants it. */}}
{{- define "baton.intOrPercent" -}}
{{- if kindIs "string" . -}}{{ quote . }}{{- else -}}{{ int64 . }}{{- end -}}
{{- end -}}

{{/*
The pod template of every role. Call with (dict "root" $ "role" "decode" "values"
.Values.decode "binary" "baton-decode" "args" (list ...) "ompThreads" n "dataMount" bool);
"args" come after --config and before the role's extraArgs, and "dataMount" mounts the
StatefulSet's "data" claim on /var/lib/baton. The router, prefill and decode pods drain: a
preStop sleep (<role>.preStopSleepSeconds) lets Services drop the pod before SIGTERM, then the
binary finishes its work for config.<role>.drain-timeout, so the grace period is both plus a
10 s margin for the shutdown itself.
*/}}
{{- define "baton.podTemplate" -}}
{{- $root := .root -}}
{{- $values := .values -}}
{{- $drains := has .role (list "router" "prefill" "decode") -}}
{{- $resources := deepCopy $values.resources -}}
{{- $requests := $resources.requests | default dict -}}
{{- $limits := $resources.limits | default dict -}}
{{- $gpus := dig "gpus" 0 $values | int64 -}}
{{- if gt $gpus 0 -}}
{{- $limits = merge (dict $root.Values.gpu.resourceName $gpus) $limits -}}
{{- end -}}
{{- /* ephemeral-storage: what the pod's emptyDirs may hold (the scheduler places the pod on a
node with room for it), and a limit 1Gi above for logs; <role>.resources wins. */ -}}
{{- $ephemeral := include "baton.ephemeralMi" . | int64 -}}
{{- $requests = merge $requests (dict "ephemeral-storage" (printf "%dMi" $ephemeral)) -}}
{{- $limits = merge $limits (dict "ephemeral-storage" (printf "%dMi" (add $ephemeral 1024))) -}}
{{- $rdma := and (eq $root.Values.ucx.profile "rdma") (has .role (list "prefill" "decode")) -}}
{{- if $rdma -}}
{{- $devices := $root.Values.ucx.rdma.resourceCount | int64 -}}
{{- $requests = merge $requests (dict $root.Values.ucx.rdma.resourceName $devices) -}}
{{- $limits = merge $limits (dict $root.Values.ucx.rdma.resourceName $devices) -}}
{{- end -}}
{{- $_ := set $resources "requests" $requests -}}
{{- $_ := set $resources "limits" $limits -}}
{{- $securityContext := deepCopy $root.Values.securityContext -}}
{{- if $rdma -}}
{{- /* UCX registers (pins) the memory it moves, which RLIMIT_MEMLOCK bounds unless CAP_IPC_LOCK
is effective. An added capability reaches the effective set only for uid 0: for the image's uid
10001 it stays inert, so ucx.rdma.runAsRoot runs the container as uid 0 with every capability
dropped but IPC_LOCK (the binaries check at start and refuse, naming the limit and the
capability, when neither covers the pool or staging cache). Otherwise the runtime's memlock
limit must cover them (docs/deploy.md, RDMA networks). */ -}}
{{- $capabilities := $securityContext.capabilities | default dict -}}
{{- $_ := set $capabilities "add" (append ($capabilities.add | default list) "IPC_LOCK" | uniq) -}}
{{- $_ := set $securityContext "capabilities" $capabilities -}}
{{- if $root.Values.ucx.rdma.runAsRoot -}}
{{- $_ := set $capabilities "drop" (list "ALL") -}}
{{- $_ := set $capabilities "add" (list "IPC_LOCK") -}}
{{- $_ := set $securityContext "runAsUser" 0 -}}
{{- $_ := set $securityContext "runAsNonRoot" false -}}
{{- $_ := set $securityContext "allowPrivilegeEscalation" false -}}
{{- end -}}
{{- end -}}
metadata:
  labels:
    {{- include "baton.labels" (dict "root" $root "role" .role) | nindent 4 }}
    {{- with $values.podLabels }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  annotations:
    {{- include "baton.podAnnotations" (dict "root" $root "role" .role "values" $values) | nindent 4 }}
    {{- if and $rdma $root.Values.ucx.rdma.networks }}
    k8s.v1.cni.cncf.io/networks: {{ $root.Values.ucx.rdma.networks | quote }}
    {{- end }}
spec:
  {{- include "baton.podCommon" $root | trim | nindent 2 }}
  {{- with include "baton.scheduling" (dict "root" $root "role" .role "values" $values "antiAffinity" (dig "podAntiAffinity" "none" $values)) | trim }}
  {{- . | nindent 2 }}
  {{- end }}
  {{- if $drains }}
  terminationGracePeriodSeconds: {{ add ($values.preStopSleepSeconds | int64) (include "baton.drainSeconds" .) 10 }}
  {{- else }}
  terminationGracePeriodSeconds: {{ $values.terminationGracePeriodSeconds | int64 }}
  {{- end }}
  {{- with include "baton.modelInit" (dict "root" $root "role" .role) | trim }}
  {{- . | nindent 2 }}
  {{- end }}
  containers:
    - name: {{ .role }}
      image: {{ include "baton.image" $root }}
      imagePullPolicy: {{ $root.Values.image.pullPolicy }}
      command:
        - /usr/local/bin/{{ .binary }}
      args:
        - --config=/etc/baton/baton.yaml
        {{- range .args }}
        - {{ . }}
        {{- end }}
        {{- with $values.extraArgs }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      env:
        {{- include "baton.env" (dict "root" $root "ompThreads" .ompThreads) | nindent 8 }}
      {{- include "baton.portsAndProbes" (dict "root" $root "role" .role "port" (index $root.Values.config .role "port") "values" $values) | nindent 6 }}
      {{- if and $drains (gt ($values.preStopSleepSeconds | int64) 0) }}
      lifecycle:
        preStop:
          exec:
            command:
              - /bin/sleep
              - {{ $values.preStopSleepSeconds | int64 | quote }}
      {{- end }}
      resources:
        {{- toYaml $resources | nindent 8 }}
      securityContext:
        {{- toYaml $securityContext | nindent 8 }}
      volumeMounts:
        {{- include "baton.volumeMounts" (dict "root" $root "role" .role) | trim | nindent 8 }}
        {{- if .dataMount }}
        - name: data
          mountPath: /var/lib/baton
        {{- end }}
    {{- with $values.extraContainers }}
    {{- tpl (toYaml .) $root | nindent 4 }}
    {{- end }}
  volumes:
    {{- include "baton.volumes" (dict "root" $root "role" .role) | trim | nindent 4 }}
{{- end -}}
