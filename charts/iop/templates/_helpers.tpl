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
edge.grpcService.publicUrl and edge.grpcService.serverNames.
*/}}
{{- define "iop.edge.serverNames" -}}
{{- $grpc := include "iop.edge.grpcName" . }}
{{- $http := include "iop.edge.fullname" . }}
{{- $ns := .Release.Namespace }}
{{- $names := list $grpc (printf "%s.%s" $grpc $ns) (printf "%s.%s.svc" $grpc $ns) $http (printf "%s.%s" $http $ns) (printf "%s.%s.svc" $http $ns) }}
{{- with .Values.edge.grpcService.publicUrl }}
{{- $host := regexReplaceAll ":[0-9]+$" (urlParse .).host "" | trimPrefix "[" | trimSuffix "]" }}
{{- $names = append $names $host }}
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
