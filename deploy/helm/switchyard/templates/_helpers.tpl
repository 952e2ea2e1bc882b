{{/* The release's resource name, at most 63 characters. */}}
{{- define "switchyard.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* Labels that select the server pods (Deployment, Services, InferencePool). */}}
{{- define "switchyard.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "switchyard.labels" -}}
{{ include "switchyard.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* The Secret holding the admin token and API keys. */}}
{{- define "switchyard.secretName" -}}
{{- if .Values.secrets.existingSecret -}}
{{- .Values.secrets.existingSecret -}}
{{- else -}}
{{- include "switchyard.fullname" . -}}
{{- end -}}
{{- end -}}

{{/* The grace period: preStop wait, then the server's drain, then a margin
     for the process to exit after its drain deadline. */}}
{{- define "switchyard.gracePeriod" -}}
{{- add .Values.server.preStopSleepSeconds .Values.server.drainSeconds 5 -}}
{{- end -}}
