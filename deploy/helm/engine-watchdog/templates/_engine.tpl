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
    spec:
      {{- with $e.runtimeClassName }}
      runtimeClassName: {{ . }}
      {{- end }}
      automountServiceAccountToken: false
      terminationGracePeriodSeconds: {{ $e.terminationGracePeriodSeconds }}
      {{- with $e.podSecurityContext }}
      securityContext: {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $e.nodeSelector }}
      nodeSelector: {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $e.tolerations }}
      tolerations: {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $e.affinity }}
      affinity: {{- toYaml . | nindent 8 }}
      {{- end }}
      containers:
        - {{- toYaml $e.container | nindent 10 }}
      {{- with $e.volumes }}
      volumes: {{- toYaml . | nindent 8 }}
      {{- end }}
{{- end -}}
