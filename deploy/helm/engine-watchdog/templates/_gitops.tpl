{{/* GitOps mode: the sidecar as a strategic-merge patch on ONE workload of another chart,
found by gitops.workload.kind and .name. The patch is what engine-watchdog.inject makes of a
stub of that workload (its engine container and nothing else), so the pod is the same as in
the other modes. Argument: the root context. Returns the patch as YAML; fills .state. */}}
{{- define "engine-watchdog.gitopsPatch" -}}
{{- $root := .root -}}
{{- $v := $root.Values -}}
{{- $w := $v.gitops.workload -}}
{{- /* The engine's UID is not visible here: engineUser stands for it, set on the pod (the
other chart's pod securityContext keeps its other fields). Set engineUser to the engine's UID. */ -}}
{{- $engine := dict "name" $v.inject.containerName -}}
{{- $pod := dict "containers" (list $engine) -}}
{{- $spec := dict "selector" (dict "matchLabels" ($w.selector | default dict)) "template" (dict "spec" $pod) -}}
{{- $stub := dict "apiVersion" "apps/v1" "kind" $w.kind "metadata" (dict "name" $w.name) "spec" $spec -}}
{{- $_ := include "engine-watchdog.inject" (dict "root" $root "obj" $stub "state" .state) -}}
{{- $_ := unset $spec "selector" -}}{{/* immutable; the patch only touches the pod template */}}
{{- toYaml $stub -}}
{{- end -}}

{{- define "engine-watchdog.validateGitops" -}}
{{- $g := .Values.gitops -}}
{{- if $g.enabled -}}
{{- if or .Values.engine.enabled .Values.inject.manifests -}}
{{- fail "gitops.enabled patches another chart's workload: set engine.enabled=false and leave inject.manifests empty" -}}
{{- end -}}
{{- if not $g.workload.name -}}
{{- fail "gitops.enabled needs gitops.workload.name: the metadata.name of the engine Deployment or StatefulSet the other chart renders" -}}
{{- end -}}
{{- if not (has $g.workload.kind (list "Deployment" "StatefulSet")) -}}
{{- fail (printf "gitops.workload.kind must be Deployment or StatefulSet, not %q" (toString $g.workload.kind)) -}}
{{- end -}}
{{- if and .Values.guard.enabled (empty $g.workload.selector) -}}
{{- fail "gitops with guard.enabled needs gitops.workload.selector (the workload's spec.selector.matchLabels) for the guard Service" -}}
{{- end -}}
{{- end -}}
{{- end -}}
