{{/* Chart name, truncated to a DNS label. */}}
{{- define "gpujob.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name: <release>-gpujob unless the release name already contains it. */}}
{{- define "gpujob.fullname" -}}
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

{{- define "gpujob.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels on every object. */}}
{{- define "gpujob.labels" -}}
helm.sh/chart: {{ include "gpujob.chart" . }}
{{ include "gpujob.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: gpujob
{{- end }}

{{/* Labels that select the operator's pods. */}}
{{- define "gpujob.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gpujob.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "gpujob.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "gpujob.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "gpujob.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/* true when the operator watches only rbac.namespaces. */}}
{{- define "gpujob.namespaced" -}}
{{- if eq .Values.rbac.mode "namespaced" }}true{{ end }}
{{- end }}

{{/*
Rules on the namespaced resources the operator touches, shared by the ClusterRole
(cluster mode) and each Role (namespaced mode). Least privilege: no reading of Secrets, no
ConfigMaps, no pods/exec; only the verbs kopf and the reconciler use.
*/}}
{{- define "gpujob.namespacedRules" -}}
# GPUTrainingJobs: kopf lists/watches them and patches annotations and finalizers; the
# reconciler deletes finished jobs (ttlSecondsAfterFinished).
- apiGroups: ["gpujob.dev"]
  resources: ["gputrainingjobs"]
  verbs: ["get", "list", "watch", "patch", "delete"]
# Status is written only through the status subresource.
- apiGroups: ["gpujob.dev"]
  resources: ["gputrainingjobs/status"]
  verbs: ["get", "patch"]
# The gang: one pod per node, created and deleted by the reconciler, indexed by kopf.
# Its server-side dry runs (dryRun=All, before any pod is created) need the same create.
- apiGroups: [""]
  resources: ["pods"]
  # patch: an in-place gang restart moves a pod to the next attempt (its attempt label, its
  # restart count and the supervisor's release annotation).
  verbs: ["get", "list", "watch", "create", "delete", "patch"]
# A stalled job's hang evidence (every rank's stacks), one ConfigMap per attempt: written,
# never read (no get/list: the operator sees no other ConfigMap's data).
- apiGroups: [""]
  resources: ["configmaps"]
  verbs: ["create", "patch"]
# The headless Service that gives the pods their DNS names.
- apiGroups: [""]
  resources: ["services"]
  verbs: ["get", "list", "watch", "create"]
# Events on jobs (ours and kopf's).
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create", "patch"]
- apiGroups: ["events.k8s.io"]
  resources: ["events"]
  verbs: ["create", "patch"]
{{- if .Values.jobEndpoints.networkPolicy.enabled }}
# Each job's NetworkPolicy <job>-endpoints-<uid8> (owned by the job, gone with it): created only.
- apiGroups: ["networking.k8s.io"]
  resources: ["networkpolicies"]
  verbs: ["create"]
{{- end }}
{{- if .Values.jobEndpoints.token.enabled }}
# Each job's endpoint token Secret: created, never read (the operator derives the token).
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["create"]
{{- end }}
{{- if .Values.gang.native.enabled }}
# Native gang scheduling: the job's Workload and one PodGroup per gang attempt.
- apiGroups: ["scheduling.k8s.io"]
  resources: ["workloads", "podgroups"]
  verbs: ["get", "create", "delete"]
{{- end }}
{{- if .Values.gang.kueue.enabled }}
# Kueue: the job's Workload; its status is patched to hand quota back after an eviction
# and to mark it Finished.
- apiGroups: ["kueue.x-k8s.io"]
  resources: ["workloads"]
  verbs: ["get", "list", "watch", "create", "delete"]
- apiGroups: ["kueue.x-k8s.io"]
  resources: ["workloads/status"]
  verbs: ["patch"]
{{- end }}
{{- end }}

{{- define "gpujob.kueueClusterRules" -}}
# Kueue: the admitted flavors' node labels and tolerations, and priority class values.
- apiGroups: ["kueue.x-k8s.io"]
  resources: ["resourceflavors", "workloadpriorityclasses"]
  verbs: ["get"]
{{- end }}

{{/*
"true" when the operator forecasts start times: forecast.enabled and the cluster-wide read it
needs granted (forecast.clusterRead: auto grants it in cluster mode only).
*/}}
{{- define "gpujob.forecastOn" -}}
{{- $read := toString .Values.forecast.clusterRead }}
{{- if and .Values.forecast.enabled (or (eq $read "true") (and (eq $read "auto") (not (include "gpujob.namespaced" .)))) }}true{{ end }}
{{- end }}

{{- define "gpujob.forecastRules" -}}
# Start-time forecast: every GPU node and every bound pod holding GPUs, in any namespace.
- apiGroups: [""]
  resources: ["nodes", "pods"]
  verbs: ["list"]
{{- if .Values.gang.kueue.enabled }}
# ... and, under Kueue, the queues' quotas and every admitted or pending Workload.
- apiGroups: ["kueue.x-k8s.io"]
  resources: ["clusterqueues", "localqueues", "workloads"]
  verbs: ["list"]
{{- end }}
{{- end }}

{{- define "gpujob.peeringRules" -}}
- apiGroups: ["kopf.dev"]
  resources: ["{{ if include "gpujob.namespaced" . }}kopfpeerings{{ else }}clusterkopfpeerings{{ end }}"]
  verbs: ["get", "list", "watch", "patch"]
{{- end }}

{{/*
The webhook's TLS Secret: the user's (webhook.existingSecret, e.g. cert-manager's) or the one
the chart generates.
*/}}
{{- define "gpujob.webhookSecret" -}}
{{- .Values.webhook.existingSecret | default (printf "%s-webhook-tls" (include "gpujob.fullname" .)) -}}
{{- end }}

{{/*
GPUJOB_JOB_NETWORK_POLICY: the operator's own pods (its namespace and selector labels) first,
then jobEndpoints.networkPolicy.metricsFrom.
*/}}
{{- define "gpujob.jobNetworkPolicy" -}}
{{- $np := .Values.jobEndpoints.networkPolicy }}
{{- $ns := dict "matchLabels" (dict "kubernetes.io/metadata.name" .Release.Namespace) }}
{{- $pods := dict "matchLabels" (include "gpujob.selectorLabels" . | fromYaml) }}
{{- $operator := dict "namespaceSelector" $ns "podSelector" $pods }}
{{- dict "metricsFrom" (prepend $np.metricsFrom $operator) "otherPortsOpen" $np.otherPortsOpen | toJson }}
{{- end }}

{{/* The Secret holding the key of the jobs' endpoint tokens. */}}
{{- define "gpujob.endpointTokenSecret" -}}
{{- .Values.jobEndpoints.token.existingSecret | default (printf "%s-endpoint-token-key" (include "gpujob.fullname" .)) -}}
{{- end }}
