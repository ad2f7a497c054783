{{/* Names and labels. */}}
{{- define "sluice.name" -}}sluice{{- end }}

{{- define "sluice.serviceAccountName" -}}
{{- default "sluice" .Values.serviceAccount.name }}
{{- end }}

{{- define "sluice.selectorLabels" -}}
app.kubernetes.io/name: sluice
app.kubernetes.io/component: agent
{{- end }}

{{- define "sluice.labels" -}}
{{ include "sluice.selectorLabels" . }}
app.kubernetes.io/part-of: sluice
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end }}

{{/* The pre-delete hook's objects: not the agent's selector. */}}
{{- define "sluice.uninstallLabels" -}}
app.kubernetes.io/name: sluice
app.kubernetes.io/component: uninstall
app.kubernetes.io/part-of: sluice
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end }}

{{- define "sluice.image" -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ default .Chart.AppVersion .Values.image.tag }}
{{- end }}
{{- end }}

{{/* host:port, with brackets around an IPv6 host. */}}
{{- define "sluice.hostPort" -}}
{{- $host := index . 0 -}}
{{- if contains ":" $host -}}[{{ $host }}]:{{ index . 1 }}{{- else -}}{{ $host }}:{{ index . 1 }}{{- end }}
{{- end }}

{{/* "true" when /metrics listens beyond the node's loopback. */}}
{{- define "sluice.metricsExposed" -}}
{{- $a := .Values.metrics.bindAddress -}}
{{- if and .Values.metrics.enabled (not (hasPrefix "127." $a)) (ne $a "::1") -}}true{{- end -}}
{{- end }}

{{/* Where the agent sees the host's cgroup v2 hierarchy. */}}
{{- define "sluice.cgroupMountPath" -}}/host/sys/fs/cgroup{{- end }}
{{/* Directory of the agent's API socket, on the host and in the pod. */}}
{{- define "sluice.runDir" -}}/run/sluice{{- end }}

{{/*
Checks a JSON schema cannot express; each failure names the value.
*/}}
{{- define "sluice.validate" -}}
{{- $n := int .Values.maglev.tableSize -}}
{{- range $d := untilStep 2 363 1 -}}
{{- if and (le (mul $d $d) $n) (eq (mod $n $d) 0) -}}
{{- fail (printf "maglev.tableSize=%d: must be a prime from 251 to 131071 (it is divisible by %d)" $n $d) -}}
{{- end -}}
{{- end -}}
{{- $r := splitList "-" .Values.nodePortRange -}}
{{- $lo := int (first $r) -}}{{- $hi := int (last $r) -}}
{{- if or (lt $lo 1) (gt $hi 65535) (gt $lo $hi) -}}
{{- fail (printf "nodePortRange=%q: want MIN-MAX with ports 1 to 65535 and MIN <= MAX" .Values.nodePortRange) -}}
{{- end -}}
{{- if gt $hi 64511 -}}
{{- fail (printf "nodePortRange=%q: want MAX at most 64511: the ports above it are for SNAT (at least 1024)" .Values.nodePortRange) -}}
{{- end -}}
{{- with .Values.snatPortRange -}}
{{- $s := splitList "-" . -}}
{{- if or (lt (int (first $s)) 1024) (gt (int (last $s)) 65535) (gt (int (first $s)) (int (last $s))) -}}
{{- fail (printf "snatPortRange=%q: want MIN-MAX with MIN at least 1024, MAX at most 65535 and MIN <= MAX" .) -}}
{{- end -}}
{{- end -}}
{{- if and .Values.metrics.enabled (eq (int .Values.metrics.port) (int .Values.healthz.port)) -}}
{{- fail (printf "metrics.port=%d: the same port as healthz.port" (int .Values.metrics.port)) -}}
{{- end -}}
{{- if and (ne .Values.lbAcceleration "disabled") (not .Values.devices) -}}
{{- fail (printf "lbAcceleration=%s: needs devices (XDP attaches to them)" .Values.lbAcceleration) -}}
{{- end -}}
{{- if and .Values.bandwidthManager.bbr (not .Values.bandwidthManager.enabled) -}}
{{- fail "bandwidthManager.bbr=true: needs bandwidthManager.enabled" -}}
{{- end -}}
{{- if and .Values.k8sServicePort (not .Values.k8sServiceHost) -}}
{{- fail (printf "k8sServicePort=%v: set k8sServiceHost too" .Values.k8sServicePort) -}}
{{- end -}}
{{- end }}

{{/*
The agent's settings: ConfigMap key = agent flag name. The DaemonSet turns
each key into an environment variable (configMapKeyRef) and an argument
--KEY=$(VAR), so the ConfigMap is the one place the settings live.
*/}}
{{- define "sluice.config" -}}
allow-cgroup-root: {{ .Values.cgroup.allowRoot | quote }}
bpf-ct-gc-interval: {{ .Values.bpf.ctGCInterval | quote }}
bpf-ct-global-max: {{ .Values.bpf.ctMapMax | int64 | toString | quote }}
bpf-ct-timeout-regular-any: {{ .Values.bpf.ctTimeout.any | quote }}
bpf-ct-timeout-regular-tcp: {{ .Values.bpf.ctTimeout.tcp | quote }}
bpf-ct-timeout-regular-tcp-fin: {{ .Values.bpf.ctTimeout.tcpFin | quote }}
bpf-ct-timeout-regular-tcp-syn: {{ .Values.bpf.ctTimeout.tcpSyn | quote }}
bpf-lb-flow-cache-sets: {{ .Values.bpf.flowCacheSets | int64 | toString | quote }}
{{- if include "sluice.maglevSeedSet" . }}
bpf-lb-maglev-hash-seed: {{ .Values.maglev.hashSeed | int64 | toString | quote }}
{{- end }}
bpf-lb-maglev-table-size: {{ .Values.maglev.tableSize | int64 | toString | quote }}
bpf-lb-map-max: {{ .Values.bpf.lbMapMax | int64 | toString | quote }}
bpf-map-dynamic-size-ratio: {{ .Values.bpf.mapDynamicSizeRatio | toString | quote }}
bpf-nat-global-max: {{ .Values.bpf.natMapMax | int64 | toString | quote }}
bpf-root: {{ .Values.bpf.root | quote }}
cgroup-root: {{ include "sluice.cgroupMountPath" . | quote }}
cni-conf-dir: {{ .Values.cniConfDir | quote }}
devices: {{ join "," .Values.devices | quote }}
dsr-dispatch: {{ .Values.dsr.dispatch | quote }}
dsr-gue-port: {{ .Values.dsr.guePort | int64 | toString | quote }}
enable-bandwidth-manager: {{ .Values.bandwidthManager.enabled | quote }}
enable-bbr: {{ .Values.bandwidthManager.bbr | quote }}
hostport: {{ .Values.hostPort | toString | quote }}
healthz-bind-address: {{ include "sluice.hostPort" (list .Values.healthz.bindAddress .Values.healthz.port) | quote }}
k8s-sync-timeout: {{ .Values.k8sSyncTimeout | quote }}
lb-acceleration: {{ .Values.lbAcceleration | quote }}
lb-algorithm: {{ .Values.lbAlgorithm | quote }}
lb-mode: {{ .Values.lbMode | quote }}
local-delivery: {{ .Values.localDelivery | quote }}
log-level: {{ .Values.logLevel | quote }}
metrics-addr: {{ if .Values.metrics.enabled }}{{ include "sluice.hostPort" (list .Values.metrics.bindAddress .Values.metrics.port) | quote }}{{ else }}""{{ end }}
metrics-per-backend: {{ .Values.metrics.perBackend | quote }}
monitor-buffer-size: {{ .Values.monitor.bufferSize | int64 | toString | quote }}
monitor-drops: {{ .Values.monitor.drops | quote }}
monitor-history: {{ .Values.monitor.history | int64 | toString | quote }}
monitor-rate: {{ .Values.monitor.rate | int64 | toString | quote }}
netfilter-handoff: {{ .Values.netfilterHandoff | quote }}
node-port-range: {{ .Values.nodePortRange | quote }}
nodeport-addresses: {{ join "," .Values.nodePortAddresses | quote }}
snat-port-range: {{ .Values.snatPortRange | quote }}
socket-lb: {{ .Values.socketLB | quote }}
socket-lb-hostns-only: {{ .Values.socketLBHostnsOnly | quote }}
sync-period: {{ .Values.syncPeriod | quote }}
sync-period-min: {{ .Values.syncPeriodMin | quote }}
unload-on-exit: {{ .Values.unloadOnExit | quote }}
unload-on-uninstall: {{ .Values.unloadOnUninstall | quote }}
{{- end }}

{{/*
"true" when maglev.hashSeed is set (0 too); empty or null leaves
--bpf-lb-maglev-hash-seed out, and the agent derives the seed from the
kube-system Namespace's UID.
*/}}
{{- define "sluice.maglevSeedSet" -}}
{{- $seed := .Values.maglev.hashSeed -}}
{{- if and (not (kindIs "invalid" $seed)) (ne (toString $seed) "") -}}true{{- end -}}
{{- end }}

{{/* SLUICE_LB_MODE for lb-mode. */}}
{{- define "sluice.envName" -}}SLUICE_{{ . | upper | replace "-" "_" }}{{- end }}
