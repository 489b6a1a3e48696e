{{/* Workload mode with lws.enabled: the vLLM LeaderWorkerSet, before the sidecars are added.
Shape: kubernetes-sigs/lws config/crd/bases/leaderworkerset.x-k8s.io_leaderworkersets.yaml (the
suite validates it against that schema); a Service selects the leader (role: leader), which
alone serves the API, as in kubernetes-sigs/lws docs/examples/vllm/GPU/lws.yaml. */}}
{{- define "engine-watchdog.engineLeaderWorkerSet" -}}
{{- $e := .Values.engine -}}
{{- $l := .Values.lws -}}
apiVersion: leaderworkerset.x-k8s.io/v1
kind: LeaderWorkerSet
metadata:
  name: {{ $e.name }}
  labels: {{- toYaml $e.labels | nindent 4 }}
spec:
  replicas: {{ $e.replicas }}
  leaderWorkerTemplate:
    size: {{ $l.size }}
    restartPolicy: {{ $l.restartPolicy }}
    leaderTemplate:
      metadata:
        labels: {{- toYaml (merge (dict "role" "leader") $e.labels) | nindent 10 }}
      spec: {{- include "engine-watchdog.podSpec" (dict "e" $e "container" $l.leader.container) | nindent 8 }}
    workerTemplate:
      metadata:
        labels: {{- toYaml (merge (dict "role" "worker") $e.labels) | nindent 10 }}
      spec: {{- include "engine-watchdog.podSpec" (dict "e" $e "container" $l.worker.container) | nindent 8 }}
{{- end -}}

{{/* The values a worker's pod is made with: the leader speaks for the group (readiness gate,
Events, alerts, the guard), and a worker's sidecar (`peer`) has no /livez for a liveness probe
to ask, so none of them, and no API token. */}}
{{- define "engine-watchdog.workerValues" -}}
{{- $v := deepCopy .Values -}}
{{- $_ := set $v.readinessGate "enabled" false -}}
{{- $_ := set $v.events "enabled" false -}}
{{- $_ := set $v.guard "enabled" false -}}
{{- $_ := set $v.alertmanager "url" "" -}}
{{- $_ := set $v.liveness "enabled" false -}}
{{- $_ := set $v.lws.peer "existingSecret" (include "engine-watchdog.peerSecretName" .) -}}
{{- toYaml $v -}}
{{- end -}}

{{/* Adds the sidecars to the LeaderWorkerSet (parsed with fromYaml), in place: the leader's
template through the same engine-watchdog.inject as a Deployment's pod, the worker's with the
worker values. Argument: (dict "root" $ "obj" <LeaderWorkerSet> "state" <dict>). */}}
{{- define "engine-watchdog.injectLeaderWorkerSet" -}}
{{- $root := .root -}}
{{- $t := .obj.spec.leaderWorkerTemplate -}}
{{- $leaderLabels := deepCopy $t.leaderTemplate.metadata.labels -}}
{{- $leader := dict "metadata" (dict "name" .obj.metadata.name) "spec" (dict "template" $t.leaderTemplate "selector" (dict "matchLabels" $leaderLabels)) -}}
{{- $_ := include "engine-watchdog.inject" (dict "root" $root "obj" $leader "state" .state "role" "leader") -}}
{{- $wv := include "engine-watchdog.workerValues" $root | fromYaml -}}
{{- $wroot := dict "Values" $wv "Release" $root.Release "Chart" $root.Chart -}}
{{- $worker := dict "metadata" (dict "name" .obj.metadata.name) "spec" (dict "template" $t.workerTemplate "selector" (dict "matchLabels" dict)) -}}
{{- $_ := include "engine-watchdog.inject" (dict "root" $wroot "obj" $worker "state" dict "role" "worker") -}}
{{- end -}}

{{/* lws.enabled: what the values must agree on. */}}
{{- define "engine-watchdog.validateLWS" -}}
{{- $l := .Values.lws -}}
{{- if not .Values.engine.enabled -}}
{{- fail "lws.enabled renders the chart's own LeaderWorkerSet: set engine.enabled=true with it (the post-renderer injects into Deployments and StatefulSets only)" -}}
{{- end -}}
{{- if lt (int $l.size) 2 -}}
{{- fail "lws.size must be >= 2 (a leader and at least one worker); one node: lws.enabled=false" -}}
{{- end -}}
{{- if .Values.persistence.enabled -}}
{{- fail "persistence.enabled with lws.enabled: every pod of every group would share one claim; use config.bundle-command to copy bundles out instead" -}}
{{- end -}}
{{- $taken := list 9400 -}}
{{- if .Values.guard.enabled -}}{{- $taken = append $taken (int .Values.guard.port) -}}{{- end -}}
{{- range (concat ($l.leader.container.ports | default list) ($l.worker.container.ports | default list)) -}}
{{- $taken = append $taken (int .containerPort) -}}
{{- end -}}
{{- if has (int $l.peer.port) $taken -}}
{{- fail (printf "lws.peer.port %d is taken in the pod (engine, guard or watchdog port): pick a free one" (int $l.peer.port)) -}}
{{- end -}}
{{- range $role := list "leader" "worker" -}}
{{- range (index $l $role).container.args -}}
{{- if and (hasPrefix "--nnodes=" .) (ne (trimPrefix "--nnodes=" .) (toString $l.size)) -}}
{{- fail (printf "lws.%s.container.args has %s but lws.size is %d: vLLM's --nnodes is the group's size" $role . (int $l.size)) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The peer Secret the chart makes when lws.peer.existingSecret is empty: random, and the one
already in the cluster on an upgrade (lookup; `helm template` has no cluster, so it renders a
fresh one each time: GitOps renderers want existingSecret). */}}
{{- define "engine-watchdog.peerSecretName" -}}
{{- .Values.lws.peer.existingSecret | default (printf "%s-peer" (include "engine-watchdog.fullname" .)) -}}
{{- end -}}
