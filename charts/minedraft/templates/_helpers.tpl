{{/* Release-scoped name, at most 63 characters (DNS label). */}}
{{- define "minedraft.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else if contains "minedraft" .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-minedraft" .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end }}

{{- define "minedraft.operatorName" -}}
{{- printf "%s-operator" (include "minedraft.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end }}

{{- define "minedraft.serviceAccountName" -}}
{{- .Values.operator.serviceAccount.name | default (include "minedraft.operatorName" .) -}}
{{- end }}

{{/* Recommended labels; pass (dict "ctx" $ "component" "operator"). */}}
{{- define "minedraft.labels" -}}
{{ include "minedraft.selectorLabels" . }}
app.kubernetes.io/version: {{ .ctx.Chart.AppVersion | quote }}
app.kubernetes.io/part-of: minedraft
app.kubernetes.io/managed-by: {{ .ctx.Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .ctx.Chart.Name .ctx.Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "minedraft.selectorLabels" -}}
app.kubernetes.io/name: minedraft
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/* An image reference from {repository, tag, digest}: the digest wins, the tag defaults to appVersion. */}}
{{- define "minedraft.image" -}}
{{- $image := .image -}}
{{- if $image.digest -}}
{{- printf "%s@%s" $image.repository $image.digest -}}
{{- else -}}
{{- printf "%s:%s" $image.repository ($image.tag | default .ctx.Chart.AppVersion | toString) -}}
{{- end -}}
{{- end }}

{{- define "minedraft.deploymentName" -}}
{{- .Values.deployment.name | default (include "minedraft.fullname" .) -}}
{{- end }}

{{- define "minedraft.policyName" -}}
{{- .Values.policy.name | default (include "minedraft.fullname" .) -}}
{{- end }}
