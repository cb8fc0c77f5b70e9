{{/*
Chart name, truncated to fit a DNS label.
*/}}
{{- define "iop.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Name prefix of every resource: the release name, or "<release>-<chart>" when the release
name does not contain the chart name. Truncated so that "<fullname>-operator" still fits.
*/}}
{{- define "iop.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 48 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 48 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 48 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "iop.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Labels on every resource.
*/}}
{{- define "iop.labels" -}}
helm.sh/chart: {{ include "iop.chart" . }}
app.kubernetes.io/name: {{ include "iop.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: iop
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "iop.selectorLabels" -}}
app.kubernetes.io/name: {{ include "iop.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* Edge: names and labels. */}}
{{- define "iop.edge.fullname" -}}
{{- printf "%s-edge" (include "iop.fullname" .) }}
{{- end }}

{{- define "iop.edge.grpcName" -}}
{{- printf "%s-edge-grpc" (include "iop.fullname" .) }}
{{- end }}

{{/* The Edge's admin Service (/admin/v1/*, /metrics): ClusterIP, for the operator and Prometheus. */}}
{{- define "iop.edge.adminName" -}}
{{- printf "%s-edge-admin" (include "iop.fullname" .) }}
{{- end }}

{{/*
The headless Service of the Edge's admin port: one DNS record per Edge pod (ready or not).
"<fullname>-edge-replicas" fits 63 characters with the 48-character fullname.
*/}}
{{- define "iop.edge.replicasName" -}}
{{- printf "%s-edge-replicas" (include "iop.fullname" .) }}
{{- end }}

{{/*
The Edge pods' label selector as `kubectl get pods -l` takes it (KEY=VALUE,...): the
operator's IOP_EDGE_POD_SELECTOR (the pods it renders as the config's replicas and reads).
*/}}
{{- define "iop.edge.podSelector" -}}
{{- $pairs := list }}
{{- range $k, $v := include "iop.edge.selectorLabels" . | fromYaml }}
{{- $pairs = append $pairs (printf "%s=%s" $k $v) }}
{{- end }}
{{- join "," $pairs }}
{{- end }}

{{- define "iop.edge.selectorLabels" -}}
{{ include "iop.selectorLabels" . }}
app.kubernetes.io/component: edge
{{- end }}

{{- define "iop.edge.labels" -}}
{{ include "iop.labels" . }}
app.kubernetes.io/component: edge
{{- end }}

{{- define "iop.edge.serviceAccountName" -}}
{{- if .Values.edge.serviceAccount.create }}
{{- default (include "iop.edge.fullname" .) .Values.edge.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.edge.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "iop.edge.image" -}}
{{- printf "%s:%s" .Values.edge.image.repository (default .Chart.AppVersion .Values.edge.image.tag) }}
{{- end }}

{{/* Operator: names and labels. */}}
{{- define "iop.operator.fullname" -}}
{{- printf "%s-operator" (include "iop.fullname" .) }}
{{- end }}

{{- /* The operator's ClusterRole and ClusterRoleBinding: one name per release namespace. */ -}}
{{- define "iop.operator.clusterRbacName" -}}
{{- printf "%s-%s" .Release.Namespace (include "iop.operator.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "iop.operator.metricsName" -}}
{{- printf "%s-operator-metrics" (include "iop.fullname" .) }}
{{- end }}

{{- define "iop.operator.selectorLabels" -}}
{{ include "iop.selectorLabels" . }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "iop.operator.labels" -}}
{{ include "iop.labels" . }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "iop.operator.serviceAccountName" -}}
{{- if .Values.operator.serviceAccount.create }}
{{- default (include "iop.operator.fullname" .) .Values.operator.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.operator.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "iop.operator.image" -}}
{{- printf "%s:%s" .Values.operator.image.repository (default .Chart.AppVersion .Values.operator.image.tag) }}
{{- end }}

{{/*
Names on the Edge server certificate: the in-cluster names of the gRPC and HTTP API Services
(not the admin Service: plain HTTP), the host of
edge.grpcService.publicUrl (iop.edge.publicHost) and edge.grpcService.serverNames
(values.schema.json and iop.validate check each is a DNS name or an IP address).
*/}}
{{- define "iop.edge.serverNames" -}}
{{- $grpc := include "iop.edge.grpcName" . }}
{{- $http := include "iop.edge.fullname" . }}
{{- $ns := .Release.Namespace }}
{{- $names := list $grpc (printf "%s.%s" $grpc $ns) (printf "%s.%s.svc" $grpc $ns) $http (printf "%s.%s" $http $ns) (printf "%s.%s.svc" $http $ns) }}
{{- with include "iop.edge.publicHost" . }}
{{- $names = append $names . }}
{{- end }}
{{- concat $names .Values.edge.grpcService.serverNames | uniq | join "," }}
{{- end }}

{{/*
The names the Edge's admin listener answers to besides its own address (the operator's
IOP_EDGE_ADMIN_HOSTS, the Edge's listen.admin_hosts): the admin Service and the headless
replicas Service in each form a resolver accepts, every replica's name below the headless
one, and edge.adminService.hosts.
*/}}
{{- define "iop.edge.adminHosts" -}}
{{- $ns := .Release.Namespace }}
{{- $names := list }}
{{- range $service := list (include "iop.edge.adminName" .) (include "iop.edge.replicasName" .) }}
{{- $names = concat $names (list $service (printf "%s.%s" $service $ns) (printf "%s.%s.svc" $service $ns) (printf "%s.%s.svc.%s" $service $ns $.Values.clusterDomain)) }}
{{- end }}
{{- $replicas := include "iop.edge.replicasName" . }}
{{- $names = concat $names (list (printf "*.%s.%s.svc" $replicas $ns) (printf "*.%s.%s.svc.%s" $replicas $ns .Values.clusterDomain)) }}
{{- concat $names .Values.edge.adminService.hosts | uniq | join "," }}
{{- end }}

{{/*
Whether the ServiceMonitor is rendered: the value AND the Prometheus Operator API.
*/}}
{{- define "iop.serviceMonitor.enabled" -}}
{{- if and .Values.metrics.serviceMonitor.enabled (.Capabilities.APIVersions.Has "monitoring.coreos.com/v1") }}true{{ end }}
{{- end }}

{{/*
Whether the PrometheusRule is rendered: the value AND the Prometheus Operator API.
*/}}
{{- define "iop.prometheusRule.enabled" -}}
{{- if and .Values.prometheusRule.enabled (.Capabilities.APIVersions.Has "monitoring.coreos.com/v1") }}true{{ end }}
{{- end }}

{{/*
The host of edge.grpcService.publicUrl (IPv6 without its brackets; empty when the URL is):
it goes on the Edge server certificate (IOP_EDGE_SERVER_NAMES), and the URL itself into the
NOTES' `iop-operator node-bundle --edge-url`, so the chart refuses what the operator (a
server name that is neither a DNS name nor an IP address), node-bundle or iop-node
(https://HOST[:PORT]) would. values.schema.json already refused another scheme and
whitespace.
*/}}
{{- define "iop.edge.publicHost" -}}
{{- $url := .Values.edge.grpcService.publicUrl }}
{{- if $url }}
{{- $value := printf "edge.grpcService.publicUrl (`%s`) must be https://HOST[:PORT]" $url }}
{{- $rest := trimPrefix "https://" $url }}
{{- $authority := regexReplaceAll `[/?#].*$` $rest "" }}
{{- $tail := trimPrefix $authority $rest }}
{{- if not (has $tail (list "" "/")) }}
{{- fail (printf "%s, without a path, query or fragment (got `%s`): the Macs dial the Edge's gRPC Service at its root" $value $tail) }}
{{- end }}
{{- if contains "@" $authority }}
{{- fail (printf "%s, without user info (`%s@`): the nodes would take it for part of the host name" $value (regexReplaceAll `@.*$` $authority "")) }}
{{- end }}
{{- $host := $authority }}
{{- $port := "" }}
{{- $ok := false }}
{{- if hasPrefix "[" $authority }}
{{- if regexMatch `^\[[^\]]*\](:.*)?$` $authority }}
{{- $host = regexReplaceAll `^\[([^\]]*)\].*$` $authority "${1}" }}
{{- $port = regexReplaceAll `^\[[^\]]*\]` $authority "" }}
{{- $ok = regexMatch (printf "^(%s)$" (include "iop.ipv6Pattern" .)) $host }}
{{- end }}
{{- else }}
{{- $host = regexReplaceAll `:.*$` $authority "" }}
{{- $port = trimPrefix $host $authority }}
{{- $ok = include "iop.isDnsNameOrIPv4" $host }}
{{- end }}
{{- if not $ok }}
{{- fail (printf "%s with HOST a DNS name (letters, digits, '-', no wildcard), an IPv4 address or an IPv6 address in brackets (got `%s`): the host goes on the Edge server certificate" $value $host) }}
{{- end }}
{{- if $port }}
{{- $number := trimPrefix ":" $port }}
{{- if not (and (regexMatch `^[0-9]{1,5}$` $number) (ge (atoi $number) 1) (le (atoi $number) 65535)) }}
{{- fail (printf "%s with PORT from 1 to 65535 (got `%s`)" $value $number) }}
{{- end }}
{{- end }}
{{- $host }}
{{- end }}
{{- end }}

{{/*
"true" when the argument is an IPv4 address or a DNS name as the operator takes it for the
Edge server certificate (IOP_EDGE_SERVER_NAMES; the certificate library's rule too):
labels of 1-63 letters, digits and '-', not starting or ending with '-', at most 253
characters, an optional final '.', the last label not a number (nor 0x and hex digits).
values.schema.json says the rest of edge.grpcService.serverNames (format hostname);
iop.validate the last label.
*/}}
{{- define "iop.isDnsNameOrIPv4" -}}
{{- $octet := `(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])` }}
{{- $label := `[A-Za-z0-9]([-A-Za-z0-9]{0,61}[A-Za-z0-9])?` }}
{{- if regexMatch (printf `^(%s\.){3}%s$` $octet $octet) . }}true
{{- else if and (le (len .) 253) (regexMatch (printf `^(%s\.)*%s\.?$` $label $label) .) (not (regexMatch `(^|\.)([0-9]+|0[xX][0-9A-Fa-f]*)\.?$` .)) }}true
{{- end }}
{{- end }}

{{/*
An IPv6 address (RFC 3986's IPv6address: eight groups, `::` for a run of zero groups, the
last two groups as an IPv4 address if wanted; no zone), as a regular expression.
*/}}
{{- define "iop.ipv6Pattern" -}}
{{- $octet := `(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])` }}
{{- $forms := `(H:){6}L|::(H:){5}L|(H)?::(H:){4}L|((H:){0,1}H)?::(H:){3}L|((H:){0,2}H)?::(H:){2}L|((H:){0,3}H)?::H:L|((H:){0,4}H)?::L|((H:){0,5}H)?::H|((H:){0,6}H)?::` }}
{{- $forms | replace "L" "(H:H|V4)" | replace "H" "[0-9A-Fa-f]{1,4}" | replace "V4" (printf `(%s\.){3}%s` $octet $octet) }}
{{- end }}

{{/*
What values.schema.json cannot say (one value against another, the parts of a URL): the
chart refuses to render values the operator or the Edge would refuse later (the operator
crash-looping, the Edge waiting in ContainerCreating), or that make the Kubernetes objects
useless. Each message names the value and says what is allowed. Included by
edge-deployment.yaml.
*/}}
{{- define "iop.validate" -}}
{{- $edge := .Values.edge }}
{{- $drainMs := add (int64 $edge.drainDelayMs) (int64 $edge.drainTimeoutMs) }}
{{- if le (mul (int64 $edge.terminationGracePeriodSeconds) 1000) $drainMs }}
{{- fail (printf "edge.terminationGracePeriodSeconds (%d s) must be greater than edge.drainDelayMs + edge.drainTimeoutMs (%d ms): the kubelet would kill a replica that is still draining its requests" (int64 $edge.terminationGracePeriodSeconds) $drainMs) }}
{{- end }}
{{- $base := int64 $edge.outlier.baseEjectionMs }}
{{- $max := int64 $edge.outlier.maxEjectionMs }}
{{- if gt $base $max }}
{{- fail (printf "edge.outlier.baseEjectionMs (%d ms) must not be greater than edge.outlier.maxEjectionMs (%d ms): an ejection starts at the base and doubles up to the max (the operator refuses IOP_EDGE_OUTLIER_MAX_EJECTION_MS below the base)" $base $max) }}
{{- end }}
{{- $pdb := $edge.podDisruptionBudget }}
{{- $replicas := int64 $edge.replicaCount }}
{{- if and $pdb.enabled (gt $replicas 0) (not (kindIs "invalid" $pdb.minAvailable)) }}
{{- $min := $pdb.minAvailable }}
{{- $pods := 0 }}
{{- $shown := "" }}
{{- if kindIs "string" $min }}
{{- $percent := int64 (trimSuffix "%" $min) }}
{{- /* The disruption controller rounds a percentage up. */}}
{{- $pods = div (add (mul $percent $replicas) 99) 100 }}
{{- $shown = printf "%s, %d of %d pods" $min $pods $replicas }}
{{- else }}
{{- $pods = int64 $min }}
{{- $shown = printf "%d" $pods }}
{{- end }}
{{- if ge $pods $replicas }}
{{- fail (printf "edge.podDisruptionBudget.minAvailable (%s) must be less than edge.replicaCount (%d): the budget would never allow a voluntary eviction, so every node drain would block on the Edge pods (lower it, or set it to null and use maxUnavailable)" $shown $replicas) }}
{{- end }}
{{- end }}
{{- $_ := include "iop.edge.publicHost" . }}
{{- range $name := .Values.edge.grpcService.serverNames }}
{{- /* IPv6 addresses (with `:`): values.schema.json's format ipv6. */}}
{{- if not (or (contains ":" $name) (include "iop.isDnsNameOrIPv4" $name)) }}
{{- fail (printf "edge.grpcService.serverNames (`%s`) must be IP addresses or DNS names whose last label is not a number (it would read as an IPv4 address): the operator cannot put it on the Edge server certificate" $name) }}
{{- end }}
{{- end }}
{{- range $host := .Values.edge.adminService.hosts }}
{{- if gt (len (trimPrefix "*." $host)) 253 }}
{{- fail (printf "edge.adminService.hosts (`%s`) must be DNS names of at most 253 characters (after `*.`): the operator refuses a longer one (IOP_EDGE_ADMIN_HOSTS)" $host) }}
{{- end }}
{{- end }}
{{- range $host := splitList "," (include "iop.edge.adminHosts" .) }}
{{- if gt (len (trimPrefix "*." $host)) 253 }}
{{- fail (printf "clusterDomain (`%s`) is too long: the admin host name `%s` it makes has %d characters (at most 253 after `*.`; the operator refuses it in IOP_EDGE_ADMIN_HOSTS)" $.Values.clusterDomain $host (len (trimPrefix "*." $host))) }}
{{- end }}
{{- end }}
{{- end }}
