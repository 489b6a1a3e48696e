{{/* Adds the sidecar to ONE workload (a Deployment or StatefulSet parsed with fromYaml), in
place. The same code serves the chart's own Deployment and, as a post-renderer, another
chart's workloads, so both get exactly the same pod.
Argument: (dict "root" $ "obj" <workload> "state" <dict that collects serviceAccounts and
guardSelectors for the RBAC and guard objects> ["role" "leader"|"worker": a LeaderWorkerSet's
template, engine-watchdog.injectLeaderWorkerSet]). */}}
{{- define "engine-watchdog.inject" -}}
{{- $root := .root -}}
{{- $v := $root.Values -}}
{{- $state := .state -}}
{{- $tpl := .obj.spec.template -}}
{{- $meta := $tpl.metadata | default dict -}}
{{- $_ := set $tpl "metadata" $meta -}}
{{- $labels := $meta.labels | default dict -}}
{{- $_ := set $labels "engine-watchdog" "enabled" -}}{{/* the PodMonitor in deploy/prometheus selects this */}}
{{- $_ := set $meta "labels" $labels -}}
{{- $ann := $meta.annotations | default dict -}}
{{- $_ := set $ann "kubectl.kubernetes.io/default-container" $v.inject.containerName -}}
{{- /* A settings change rolls the pod, as kustomize's hashed ConfigMap name does. */ -}}
{{- $_ := set $ann "engine-watchdog/config-checksum" (include "engine-watchdog.configData" $root | sha256sum) -}}
{{- $_ := set $meta "annotations" $ann -}}
{{- $pod := $tpl.spec -}}
{{- /* One PID namespace: the watchdog sees the engine's processes, py-spy attaches, and PIDs
agree between containers (the CUDA dump pipe names carry them). */ -}}
{{- $_ := set $pod "shareProcessNamespace" true -}}
{{- $engine := dict -}}
{{- range $pod.containers -}}
{{- if eq .name $v.inject.containerName -}}{{- $engine = . -}}{{- end -}}
{{- end -}}
{{- $_ := set $engine "env" (concat ($engine.env | default list) (include "engine-watchdog.engineEnv" $root | fromYamlArray)) -}}
{{- $dumps := dict "name" "engine-watchdog-dumps" "mountPath" "/var/run/engine-watchdog/dumps" -}}
{{- $_ := set $engine "volumeMounts" (append ($engine.volumeMounts | default list) $dumps) -}}
{{- if $v.liveness.enabled -}}
{{- $_ := set $engine "livenessProbe" (include "engine-watchdog.livenessProbe" $root | fromYaml) -}}
{{- end -}}
{{- $keyRef := dict -}}
{{- if ne .role "worker" -}}{{/* a headless worker has no API: no key for either container */}}
{{- $keyRef = include "engine-watchdog.apiKeyRef" (dict "root" $root "engine" $engine) | fromYaml -}}
{{- end -}}
{{- $runAs := include "engine-watchdog.sameUser" (dict "root" $root "pod" $pod "engine" $engine) | fromYaml -}}
{{- $sidecar := include "engine-watchdog.container" (dict "root" $root "apiKeyEnv" $keyRef "runAs" $runAs "role" (.role | default "")) | fromYaml -}}
{{- $_ := set $pod "containers" (append $pod.containers $sidecar) -}}
{{- $_ := set $pod "volumes" (concat ($pod.volumes | default list) (include "engine-watchdog.volumes" (dict "root" $root "role" (.role | default "")) | fromYamlArray)) -}}
{{- if $v.readinessGate.enabled -}}
{{- /* Ready only while the watchdog's condition is True (it sets it: docs/kubernetes.md). */ -}}
{{- $gate := dict "conditionType" "engine-watchdog.io/progressing" -}}
{{- $_ := set $pod "readinessGates" (append ($pod.readinessGates | default list) $gate | uniq) -}}
{{- end -}}
{{- if or $v.events.enabled $v.readinessGate.enabled $v.podLog.enabled -}}
{{- if not $pod.serviceAccountName -}}
{{- $_ := set $pod "serviceAccountName" (include "engine-watchdog.serviceAccountName" $root) -}}
{{- $_ := set $pod "automountServiceAccountToken" false -}}{{/* the engine gets no token */}}
{{- end -}}
{{- $_ := set $state "serviceAccounts" (append ($state.serviceAccounts | default list) $pod.serviceAccountName | uniq) -}}
{{- end -}}
{{- $_ := set $state "guardSelectors" (append ($state.guardSelectors | default list) (dict "name" .obj.metadata.name "selector" .obj.spec.selector.matchLabels)) -}}
{{- end -}}

{{/* The sidecar's API key source, as a valueFrom (YAML), or nothing. With apiKey.existingSecret
the engine gets VLLM_API_KEY from it too (unless it has one); otherwise the sidecar reads what
the engine's VLLM_API_KEY reads. */}}
{{- define "engine-watchdog.apiKeyRef" -}}
{{- $v := .root.Values -}}
{{- $engine := .engine -}}
{{- $current := dict -}}
{{- range $engine.env -}}
{{- if eq .name "VLLM_API_KEY" -}}{{- $current = . -}}{{- end -}}
{{- end -}}
{{- if $v.apiKey.existingSecret -}}
{{- $ref := dict "secretKeyRef" (dict "name" $v.apiKey.existingSecret "key" $v.apiKey.key) -}}
{{- if not $current -}}
{{- $_ := set $engine "env" (append $engine.env (dict "name" "VLLM_API_KEY" "valueFrom" $ref)) -}}
{{- end -}}
{{- toYaml $ref -}}
{{- else if $current.valueFrom -}}
{{- toYaml $current.valueFrom -}}
{{- end -}}
{{- end -}}

{{/* The sidecar runs as the engine's UID. An engine container with its own runAsUser: the
sidecar copies it. Neither it nor the pod sets one: the pod gets engineUser, explicitly, so the
two images' different default users (vLLM root, the watchdog 1000) cannot apply. */}}
{{- define "engine-watchdog.sameUser" -}}
{{- $v := .root.Values -}}
{{- $engineCtx := .engine.securityContext | default dict -}}
{{- $podCtx := .pod.securityContext | default dict -}}
{{- if hasKey $engineCtx "runAsUser" -}}
{{- pick $engineCtx "runAsUser" "runAsGroup" | toYaml -}}
{{- else if not (hasKey $podCtx "runAsUser") -}}
{{- $_ := set $podCtx "runAsUser" $v.engineUser.runAsUser -}}
{{- if not (hasKey $podCtx "runAsGroup") -}}
{{- $_ := set $podCtx "runAsGroup" $v.engineUser.runAsGroup -}}
{{- end -}}
{{- $_ := set .pod "securityContext" $podCtx -}}
{{- end -}}
{{- end -}}

{{/* Whether a parsed object is a workload to inject into: "true" or "". */}}
{{- define "engine-watchdog.injectable" -}}
{{- $v := .root.Values -}}
{{- $obj := .obj -}}
{{- if and (has ($obj.kind | default "") (list "Deployment" "StatefulSet")) (dig "spec" "template" "spec" "containers" list $obj) -}}
{{- $names := list -}}
{{- range $obj.spec.template.spec.containers -}}{{- $names = append $names .name -}}{{- end -}}
{{- $labels := dig "metadata" "labels" dict $obj -}}
{{- $match := true -}}
{{- range $k, $want := $v.inject.matchLabels -}}
{{- if ne (toString (get $labels $k)) (toString $want) -}}{{- $match = false -}}{{- end -}}
{{- end -}}
{{- if and $match (has $v.inject.containerName $names) (not (has "engine-watchdog" $names)) -}}true{{- end -}}
{{- end -}}
{{- end -}}
