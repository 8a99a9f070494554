{{/* Recommended labels for the CRD objects. */}}
{{- define "minedraft-crds.labels" -}}
app.kubernetes.io/name: minedraft
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/component: crds
app.kubernetes.io/part-of: minedraft
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}
