{{/* Workload mode: the vLLM Deployment from .Values.engine, before the sidecar is added. */}}
{{- define "engine-watchdog.engineDeployment" -}}
{{- $e := .Values.engine -}}
apiVersion: apps/v1
kind: Deployment
metadata:
  name: {{ $e.name }}
  labels: {{- toYaml $e.labels | nindent 4 }}
spec:
  replicas: {{ $e.replicas }}
  {{- with $e.strategy }}
  strategy: {{- toYaml . | nindent 4 }}
  {{- end }}
  selector:
    matchLabels: {{- toYaml $e.labels | nindent 6 }}
  template:
    metadata:
      labels: {{- toYaml $e.labels | nindent 8 }}
    spec: {{- include "engine-watchdog.podSpec" (dict "e" $e "container" $e.container) | nindent 6 }}
{{- end -}}

{{/* The engine pod's spec from .Values.engine, with ONE engine container: the Deployment's, or
a LeaderWorkerSet's leader or worker. Argument: (dict "e" .Values.engine "container" <container>). */}}
{{- define "engine-watchdog.podSpec" -}}
{{- $e := .e -}}
{{- with $e.runtimeClassName }}
runtimeClassName: {{ . }}
{{- end }}
automountServiceAccountToken: false
terminationGracePeriodSeconds: {{ $e.terminationGracePeriodSeconds }}
{{- with $e.podSecurityContext }}
securityContext: {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $e.nodeSelector }}
nodeSelector: {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $e.tolerations }}
tolerations: {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $e.affinity }}
affinity: {{- toYaml . | nindent 2 }}
{{- end }}
containers:
  - {{- toYaml .container | nindent 4 }}
{{- with $e.volumes }}
volumes: {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}
