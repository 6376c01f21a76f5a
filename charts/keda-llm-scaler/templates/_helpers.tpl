{{/* Chart name, truncated to 63 characters (DNS label). */}}
{{- define "keda-llm-scaler.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name: release-chart unless the release already contains the chart name. */}}
{{- define "keda-llm-scaler.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "keda-llm-scaler.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Selector labels: immutable on a Deployment, so only name and instance. */}}
{{- define "keda-llm-scaler.selectorLabels" -}}
app.kubernetes.io/name: {{ include "keda-llm-scaler.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "keda-llm-scaler.labels" -}}
helm.sh/chart: {{ include "keda-llm-scaler.chart" . }}
{{ include "keda-llm-scaler.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/component: external-scaler
app.kubernetes.io/part-of: keda
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- with .Values.additionalLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "keda-llm-scaler.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "keda-llm-scaler.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "keda-llm-scaler.image" -}}
{{- printf "%s/%s:%s" .Values.image.registry .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* Namespaces the namespaced RBAC covers: rbac.namespaces, else the release's; shadow: the workloads' too. */}}
{{- define "keda-llm-scaler.rbacNamespaces" -}}
{{- if .Values.shadow.enabled }}{{ join "," (concat .Values.rbac.namespaces (include "keda-llm-scaler.shadowNamespaces" . | splitList ",") | uniq) }}
{{- else if .Values.rbac.namespaces }}{{ join "," (uniq .Values.rbac.namespaces) }}
{{- else }}{{ .Release.Namespace }}{{ end }}
{{- end }}

{{/* Shadow's workloads, each with its namespace (the release's when it names none). */}}
{{- define "keda-llm-scaler.shadowWorkloads" -}}
{{- include "keda-llm-scaler.checkShadow" . }}
{{- $out := list }}
{{- range .Values.shadow.workloads }}
{{- $out = append $out (merge (dict) . (dict "namespace" $.Release.Namespace)) }}
{{- end }}
{{- toYaml (dict "workloads" $out) }}
{{- end }}

{{- define "keda-llm-scaler.shadowNamespaces" -}}
{{- include "keda-llm-scaler.checkShadow" . }}
{{- $ns := list }}
{{- range .Values.shadow.workloads }}
{{- $ns = append $ns (default $.Release.Namespace .namespace) }}
{{- end }}
{{- join "," $ns }}
{{- end }}

{{/* Shadow acts on nothing: what would write to the cluster, or scrape twice, is refused at render. */}}
{{- define "keda-llm-scaler.checkShadow" -}}
{{- if .Values.shadow.enabled }}
{{- if not .Values.shadow.workloads }}
{{- fail "shadow.workloads: list the workloads shadow watches (docs/shadow.md)" }}
{{- end }}
{{- if .Values.victimRanking.namespaces }}
{{- fail "shadow.enabled with victimRanking.namespaces: victim ranking writes pod-deletion-cost on the workloads' pods, and shadow acts on nothing" }}
{{- end }}
{{- if gt (int .Values.replicaCount) 1 }}
{{- fail "shadow.enabled with replicaCount above 1: each shadow pod scrapes every replica; run one" }}
{{- end }}
{{- range .Values.shadow.workloads }}
{{- if not (kindIs "map" .) }}
{{- fail "shadow.workloads: each entry is a mapping (name, namespace, metadata, scaleTargetRef, ...)" }}
{{- end }}
{{- if not (kindIs "string" .name) }}
{{- fail (printf "shadow.workloads: name %v is not a string (the ScaledObject it would be)" .name) }}
{{- end }}
{{- if and .namespace (or (not (regexMatch "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$" (toString .namespace))) (gt (len (toString .namespace)) 63)) }}
{{- fail (printf "shadow.workloads: namespace %q of workload %v is not a namespace name (its Role is made there)" (toString .namespace) .name) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{/* Read-only rules discovery needs: EndpointSlices (`service`), the ScaledObject's scaleTargetRef,
     its workload and pods (zero-config), Services (to tell "no endpoints" from "no such Service"). */}}
{{- define "keda-llm-scaler.rbacRules" -}}
- apiGroups: ["discovery.k8s.io"]
  resources: ["endpointslices"]
  verbs: ["get", "list", "watch"]
- apiGroups: [""]
  resources: ["services"]
  verbs: ["get"]
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "watch"]
- apiGroups: ["apps"]
  resources: ["deployments", "statefulsets"]
  verbs: ["get"]
- apiGroups: ["keda.sh"]
  resources: ["scaledobjects"]
  verbs: ["get"]
{{- end }}
