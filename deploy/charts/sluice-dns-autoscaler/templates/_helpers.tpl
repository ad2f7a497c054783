{{/* Names and labels. Names are fixed, not derived from the release. */}}
{{- define "dnsas.name" -}}sluice-dns-autoscaler{{- end }}

{{- define "dnsas.serviceAccountName" -}}
{{- default "sluice-dns-autoscaler" .Values.serviceAccount.name }}
{{- end }}

{{- define "dnsas.selectorLabels" -}}
app.kubernetes.io/name: sluice-dns-autoscaler
app.kubernetes.io/component: dns-autoscaler
{{- end }}

{{- define "dnsas.labels" -}}
{{ include "dnsas.selectorLabels" . }}
app.kubernetes.io/part-of: sluice
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end }}

{{- define "dnsas.image" -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ default .Chart.AppVersion .Values.image.tag }}
{{- end }}
{{- end }}

{{/*
The scale subresource of each target: kind -> "apiGroup resource". Fails on
a target the autoscaler would refuse, naming it.
*/}}
{{- define "dnsas.scaleResource" -}}
{{- $kind := . -}}
{{- if eq $kind "deployment" -}}apps deployments
{{- else if eq $kind "replicaset" -}}apps replicasets
{{- else if eq $kind "statefulset" -}}apps statefulsets
{{- else if eq $kind "replicationcontroller" -}}core replicationcontrollers
{{- end -}}
{{- end }}

{{/* Checks a JSON schema cannot express; each failure names the value. */}}
{{- define "dnsas.validate" -}}
{{- if not .Values.target.workloads -}}
{{- fail "target.workloads: empty: give at least one KIND/NAME" -}}
{{- end -}}
{{- range $w := .Values.target.workloads -}}
{{- $parts := splitList "/" $w -}}
{{- if or (ne (len $parts) 2) (not (include "dnsas.scaleResource" (first $parts))) (not (last $parts)) -}}
{{- fail (printf "target.workloads: %q: want deployment/NAME, replicaset/NAME, statefulset/NAME or replicationcontroller/NAME" $w) -}}
{{- end -}}
{{- end -}}
{{- if not (get .Values.params .Values.params.mode) -}}
{{- fail (printf "params.%s: empty: params.mode=%s needs it" .Values.params.mode .Values.params.mode) -}}
{{- end -}}
{{- if and (gt (int .Values.replicas) 1) (not .Values.leaderElection.enabled) -}}
{{- fail (printf "replicas=%d: more than one autoscaler needs leaderElection.enabled" (int .Values.replicas)) -}}
{{- end -}}
{{- end }}

{{/* --default-params: {"MODE": params.MODE}. */}}
{{- define "dnsas.defaultParams" -}}
{{- dict .Values.params.mode (get .Values.params .Values.params.mode) | toJson -}}
{{- end }}
