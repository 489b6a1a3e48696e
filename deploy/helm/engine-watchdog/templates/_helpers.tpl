{{/* Names and labels. */}}
{{- define "engine-watchdog.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "engine-watchdog.labels" -}}
app.kubernetes.io/name: engine-watchdog
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "engine-watchdog.serviceAccountName" -}}
{{ include "engine-watchdog.fullname" . }}
{{- end -}}

{{/* The incident dir's claim: persistence's (given or the chart's own), the older
incidents.persistentVolumeClaim, or none (an emptyDir). */}}
{{- define "engine-watchdog.incidentsClaim" -}}
{{- $p := .Values.persistence -}}
{{- if $p.enabled -}}
{{- $p.existingClaim | default (printf "%s-incidents" (include "engine-watchdog.fullname" .)) -}}
{{- else -}}
{{- .Values.incidents.persistentVolumeClaim -}}
{{- end -}}
{{- end -}}

{{/* Fail early on values that would render a pod that does not do what was asked. */}}
{{- define "engine-watchdog.validate" -}}
{{- if not (has .Values.podSecurity (list "ptrace" "baseline")) -}}
{{- fail (printf "podSecurity must be ptrace or baseline, not %q" (toString .Values.podSecurity)) -}}
{{- end -}}
{{- if .Values.liveness.enabled -}}
{{- if lt (mul (int .Values.liveness.periodSeconds) (int .Values.liveness.failureThreshold)) 30 -}}
{{- fail "liveness: periodSeconds x failureThreshold must be >= 30 s, or a watchdog restart restarts a healthy engine" -}}
{{- end -}}
{{- end -}}
{{- if and .Values.persistence.enabled .Values.engine.enabled (gt (int .Values.engine.replicas) 1) -}}
{{- fail "persistence.enabled with engine.replicas > 1: the replicas would share one claim and one action history; use config.bundle-command to copy bundles out instead" -}}
{{- end -}}
{{- if and .Values.engine.enabled .Values.inject.manifests -}}
{{- fail "inject.manifests is for the post-renderer: set engine.enabled=false with it" -}}
{{- end -}}
{{- /* SIGTERM: the guard drains for guard.drainSeconds, then needs ~10 s to end the rest and exit. */ -}}
{{- if and .Values.guard.enabled .Values.engine.enabled -}}
{{- if lt (int .Values.engine.terminationGracePeriodSeconds) (add (int .Values.guard.drainSeconds) 10) -}}
{{- fail "engine.terminationGracePeriodSeconds must be >= guard.drainSeconds + 10, or the pod is killed mid-drain" -}}
{{- end -}}
{{- end -}}
{{- if .Values.lws.enabled -}}
{{- include "engine-watchdog.validateLWS" . -}}
{{- end -}}
{{- end -}}

{{/* The ConfigMap's data: every `watch` flag as ENGINE_WATCHDOG_<FLAG>. */}}
{{- define "engine-watchdog.configData" -}}
{{- $data := dict -}}
{{- range $flag, $value := .Values.config -}}
{{- $_ := set $data (printf "ENGINE_WATCHDOG_%s" ($flag | upper | replace "-" "_")) (toString $value) -}}
{{- end -}}
{{- if .Values.liveness.enabled -}}
{{- $actions := without (splitList "," $data.ENGINE_WATCHDOG_ACTION) "liveness" -}}
{{- $_ := set $data "ENGINE_WATCHDOG_ACTION" (append $actions "liveness" | join ",") -}}
{{- end -}}
{{- if .Values.events.enabled -}}
{{- $_ := set $data "ENGINE_WATCHDOG_K8S_EVENTS" "true" -}}
{{- end -}}
{{- if .Values.readinessGate.enabled -}}
{{- $_ := set $data "ENGINE_WATCHDOG_READINESS_GATE" "true" -}}
{{- end -}}
{{- if .Values.podLog.enabled -}}
{{- $_ := set $data "ENGINE_WATCHDOG_POD_LOG" (.Values.inject.containerName | default "vllm") -}}
{{- end -}}
{{- with .Values.alertmanager.url -}}
{{- $_ := set $data "ENGINE_WATCHDOG_ALERTMANAGER" . -}}
{{- end -}}
{{- if .Values.guard.enabled -}}
{{- $_ := set $data "ENGINE_WATCHDOG_GUARD_LISTEN" (printf "0.0.0.0:%d" (int .Values.guard.port)) -}}
{{- $_ := set $data "ENGINE_WATCHDOG_GUARD_DRAIN_SECONDS" (toString (int .Values.guard.drainSeconds)) -}}
{{- /* The guard answers every client at a stall: the answer rung runs first. */ -}}
{{- $actions := without (splitList "," $data.ENGINE_WATCHDOG_ACTION) "answer" -}}
{{- $_ := set $data "ENGINE_WATCHDOG_ACTION" (prepend $actions "answer" | join ",") -}}
{{- end -}}
{{- toYaml $data -}}
{{- end -}}

{{/* Engine env: CUDA user-triggered core dumps and the NCCL flight recorder, into the dumps
volume (CUDA's CUDA_COREDUMP_PIPE, see docs/kubernetes.md). */}}
{{- define "engine-watchdog.engineEnv" -}}
- name: CUDA_ENABLE_USER_TRIGGERED_COREDUMP
  value: "1"
- name: CUDA_COREDUMP_PIPE
  value: /var/run/engine-watchdog/dumps/cuda_pipe_%p
- name: CUDA_COREDUMP_FILE
  value: /var/run/engine-watchdog/dumps/cuda_core_%p.nvcudmp
- name: CUDA_COREDUMP_GENERATION_FLAGS
  value: skip_nonrelocated_elf_images,skip_global_memory,skip_shared_memory,skip_local_memory,skip_constbank_memory
- name: TORCH_NCCL_TRACE_BUFFER_SIZE
  value: "2000"
- name: TORCH_FR_BUFFER_SIZE
  value: "2000"
- name: TORCH_NCCL_DEBUG_INFO_PIPE_FILE
  value: /var/run/engine-watchdog/dumps/nccl_pipe_
- name: TORCH_NCCL_DEBUG_INFO_TEMP_FILE
  value: /var/run/engine-watchdog/dumps/nccl_trace_rank_
- name: TORCH_FR_DUMP_TEMP_FILE
  value: /var/run/engine-watchdog/dumps/nccl_trace_rank_
{{- end -}}

{{- define "engine-watchdog.livenessProbe" -}}
httpGet:
  path: /livez
  port: 9400 # the watchdog's port (a named port must be the probed container's own)
periodSeconds: {{ .Values.liveness.periodSeconds }}
timeoutSeconds: {{ .Values.liveness.timeoutSeconds }}
failureThreshold: {{ .Values.liveness.failureThreshold }}
{{- end -}}

{{/* The sidecar container. Argument: (dict "root" $ "apiKeyEnv" <valueFrom or nil>
"runAs" <runAsUser/runAsGroup or nil> "role" <"" | "leader" | "worker">). On a LeaderWorkerSet
(a role) every sidecar runs the peer endpoint on lws.peer.port and finds the group's others
from the env LWS sets (LWS_LEADER_ADDRESS, LWS_GROUP_SIZE, LWS_WORKER_INDEX; no --peers list).
The leader's is `watch`; a worker's is `peer` alone: its engine is --headless (no API to watch),
so it has no ConfigMap, no metrics port and no /livez, and answers the leader's orders. */}}
{{- define "engine-watchdog.container" -}}
{{- $root := .root -}}
{{- $v := $root.Values -}}
name: engine-watchdog
image: {{ printf "%s:%s" $v.image.repository $v.image.tag | quote }}
imagePullPolicy: {{ $v.image.pullPolicy }}
{{- if eq .role "worker" }}
args:
  - peer # this node's ranks for the leader's captures
  - {{ printf "--engine=%s" (index $v.config "engine" | default "vllm") }}
  - {{ printf "--peer-port=%d" (int $v.lws.peer.port) }}
  - --peer-secret-file=/var/run/engine-watchdog/peer/secret
{{- else }}
{{- if .role }}
args:
  - watch # the engine URL and every other setting come from the ConfigMap
  - {{ printf "--peer-port=%d" (int $v.lws.peer.port) }}
  - --peer-secret-file=/var/run/engine-watchdog/peer/secret
{{- else }}
args: ["watch"] # the engine URL and every setting come from the ConfigMap
{{- end }}
envFrom:
  - configMapRef:
      name: {{ include "engine-watchdog.fullname" $root }}
{{- end }}
env:
  # NVML without a GPU of its own (docs/kubernetes.md#gpu-access); no nvidia.com/gpu request.
  - name: NVIDIA_VISIBLE_DEVICES
    value: all
  - name: NVIDIA_DRIVER_CAPABILITIES
    value: utility
  {{- with .apiKeyEnv }}
  - name: ENGINE_WATCHDOG_API_KEY
    valueFrom: {{- toYaml . | nindent 6 }}
  {{- end }}
  {{- if or $v.events.enabled $v.readinessGate.enabled $v.podLog.enabled }}
  - name: POD_NAME
    valueFrom: {fieldRef: {fieldPath: metadata.name}}
  - name: POD_NAMESPACE
    valueFrom: {fieldRef: {fieldPath: metadata.namespace}}
  - name: POD_UID
    valueFrom: {fieldRef: {fieldPath: metadata.uid}}
  {{- end }}
ports:
  {{- if ne .role "worker" }}
  - name: watchdog
    containerPort: 9400
  {{- end }}
  {{- if $v.guard.enabled }}
  - name: guard
    containerPort: {{ $v.guard.port }}
  {{- end }}
  {{- if .role }}
  - name: peer # every node's peer endpoint: the leader's sidecar orders, the workers' answer
    containerPort: {{ $v.lws.peer.port }}
  {{- end }}
# No readiness or liveness probe: a readiness probe would take the ENGINE out of its Service
# whenever the watchdog hiccups; the watchdog exits non-zero when a loop dies.
securityContext:
  {{- with .runAs }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
  allowPrivilegeEscalation: false
  readOnlyRootFilesystem: true
  capabilities:
    drop: ["ALL"]
    {{- if eq $v.podSecurity "ptrace" }}
    add: ["SYS_PTRACE"]
    {{- end }}
resources: {{- toYaml $v.resources | nindent 2 }}
volumeMounts:
  - name: engine-watchdog-dumps
    mountPath: /var/run/engine-watchdog/dumps
  {{- if ne .role "worker" }}{{/* a worker's evidence goes into the leader's bundle */}}
  - name: engine-watchdog-incidents
    mountPath: {{ index $v.config "incident-dir" | default "/var/lib/engine-watchdog/incidents" }}
  {{- end }}
  - name: engine-watchdog-tmp
    mountPath: /tmp
  {{- if or $v.events.enabled $v.readinessGate.enabled $v.podLog.enabled }}
  - name: engine-watchdog-token
    mountPath: /var/run/secrets/kubernetes.io/serviceaccount
    readOnly: true
  {{- end }}
  {{- if .role }}
  - name: engine-watchdog-peer
    mountPath: /var/run/engine-watchdog/peer
    readOnly: true
  {{- end }}
{{- end -}}

{{/* The sidecar's volumes. Argument: (dict "root" $ "role" <"" | "leader" | "worker">). */}}
{{- define "engine-watchdog.volumes" -}}
{{- $role := .role -}}
{{- with .root -}}
- name: engine-watchdog-dumps
  emptyDir:
    sizeLimit: {{ .Values.dumps.sizeLimit }}
{{- if ne $role "worker" }}
- name: engine-watchdog-incidents
  {{- with include "engine-watchdog.incidentsClaim" . }}
  persistentVolumeClaim:
    claimName: {{ . }}
  {{- else }}
  emptyDir:
    sizeLimit: {{ .Values.incidents.sizeLimit }}
  {{- end }}
{{- end }}
- name: engine-watchdog-tmp
  emptyDir:
    sizeLimit: 1Gi
{{- if or .Values.events.enabled .Values.readinessGate.enabled .Values.podLog.enabled }}
- name: engine-watchdog-token
  projected:
    sources:
      - serviceAccountToken:
          path: token
          expirationSeconds: 3600
      - configMap:
          name: kube-root-ca.crt
          items:
            - key: ca.crt
              path: ca.crt
      - downwardAPI:
          items:
            - path: namespace
              fieldRef:
                fieldPath: metadata.namespace
{{- end }}
{{- if $role }}
- name: engine-watchdog-peer # the sidecar's alone: the engine does not mount it
  secret:
    secretName: {{ include "engine-watchdog.peerSecretName" . }}
    defaultMode: 0440 # the engine's UID reads it: root, or the pod's fsGroup
    items:
      - key: {{ .Values.lws.peer.key }}
        path: secret
{{- end }}
{{- end }}
{{- end -}}
