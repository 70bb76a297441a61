{{/* The release's full name, at most 63 characters. */}}
{{- define "flashsale-operator.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "flashsale-operator.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "flashsale-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* Spread over nodes, then zones, without ever leaving a replica pending. */}}
{{- define "flashsale-operator.defaultSpread" -}}
- maxSkew: 1
  topologyKey: kubernetes.io/hostname
  whenUnsatisfiable: ScheduleAnyway
- maxSkew: 1
  topologyKey: topology.kubernetes.io/zone
  whenUnsatisfiable: ScheduleAnyway
{{- end -}}

{{- define "flashsale-operator.serviceAccountName" -}}
{{- default (include "flashsale-operator.fullname" .) .Values.serviceAccount.name -}}
{{- end -}}

{{/*
What the operator does inside a namespace it runs, the same in the
ClusterRole (every namespace) and in the Role (one namespace):
docs/design/operator.md, "Permissions".
*/}}
{{- define "flashsale-operator.rules" -}}
# Its own kinds: read and watch, status, finalizers (DegradationPolicy's,
# and owner references that block deletion).
- apiGroups: ["flashsale.dev"]
  resources: ["flashsales", "degradationpolicies", "chaosdrills"]
  verbs: ["get", "list", "watch", "patch", "update"]
- apiGroups: ["flashsale.dev"]
  resources: ["flashsales/status", "degradationpolicies/status", "chaosdrills/status"]
  verbs: ["get", "patch", "update"]
- apiGroups: ["flashsale.dev"]
  resources: ["flashsales/finalizers", "degradationpolicies/finalizers", "chaosdrills/finalizers"]
  verbs: ["update"]
# A sale's children, applied server-side, watched so hand edits are reverted.
- apiGroups: [""]
  resources: ["configmaps", "services", "serviceaccounts"]
  verbs: ["get", "list", "watch", "create", "patch", "update", "delete"]
- apiGroups: ["apps"]
  resources: ["deployments"]
  verbs: ["get", "list", "watch", "create", "patch", "update", "delete"]
- apiGroups: ["policy"]
  resources: ["poddisruptionbudgets"]
  verbs: ["get", "list", "watch", "create", "patch", "update", "delete"]
- apiGroups: ["autoscaling"]
  resources: ["horizontalpodautoscalers"]
  verbs: ["get", "list", "watch", "create", "patch", "update", "delete"]
- apiGroups: ["networking.k8s.io"]
  resources: ["networkpolicies"]
  verbs: ["get", "list", "watch", "create", "patch", "update", "delete"]
- apiGroups: ["rbac.authorization.k8s.io"]
  resources: ["roles", "rolebindings"]
  verbs: ["get", "list", "watch", "create", "patch", "update", "delete"]
# The Secrets a sale names (existence and key) and its internal tokens.
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["get", "create"]
# Pods: the sale's readiness, the gateways' and order-writers' addresses,
# a drill's targets.
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "watch"]
- apiGroups: ["events.k8s.io"]
  resources: ["events"]
  verbs: ["create", "patch"]
# ChaosDrill runs; watched so a stop sees each object go the moment it goes.
- apiGroups: ["chaos-mesh.org"]
  resources: ["podchaos", "networkchaos", "stresschaos", "timechaos", "workflows", "statuschecks"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
# A drill's targets must be owned by the sale: Pod → ReplicaSet → Deployment.
- apiGroups: ["apps"]
  resources: ["replicasets"]
  verbs: ["get", "list"]
{{- end -}}
