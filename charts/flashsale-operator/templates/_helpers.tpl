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

{{/*
The alerting rules, as Prometheus rule groups: the PrometheusRule's spec and
what a plain Prometheus loads from a rule file. The operator's series carry
the scrape's `namespace` (the release's); a drill's or policy's own namespace
label is then `exported_namespace`, as Prometheus renames a clash.
*/}}
{{- define "flashsale-operator.alertGroups" -}}
{{- $sel := printf "namespace=%q" .Release.Namespace -}}
{{- $r := .Values.prometheusRule -}}
groups:
  - name: flashsale-operator
    rules:
      - alert: FlashSaleOperatorDown
        expr: absent(flashsale_operator_leader{ {{- $sel -}} })
        for: {{ $r.operatorDownFor }}
        labels:
          severity: critical
        annotations:
          summary: No flashsale-operator replica in {{ .Release.Namespace }} is scraped.
          description: Sales, degradation tiers and drills are not reconciled; a running drill's guard is not watched by anyone.
      - alert: FlashSaleOperatorNoLeader
        expr: max(flashsale_operator_leader{ {{- $sel -}} }) < 1
        for: 2m
        labels:
          severity: critical
        annotations:
          summary: flashsale-operator replicas run but none holds the leader lease.
          description: Nothing is reconciled; check the Lease in {{ .Release.Namespace }} and the replicas' logs.
      - alert: FlashSaleOperatorReconcileErrors
        expr: sum by (controller) (rate(flashsale_operator_reconcile_total{ {{- $sel -}} ,result="error"}[5m])) > 0
        for: 15m
        labels:
          severity: warning
        annotations:
          summary: 'The {{ "{{" }} $labels.controller {{ "}}" }} controller has failed reconciles for 15 minutes.'
          description: The Warning Events of the objects it reconciles, and flashsale_operator_reconcile_failures_total, give the reason.
      - alert: FlashSaleOperatorWatchFailing
        expr: sum by (controller) (increase(flashsale_operator_watch_errors_total{ {{- $sel -}} }[5m])) > 0
        for: 5m
        labels:
          severity: warning
        annotations:
          summary: 'A watch of the {{ "{{" }} $labels.controller {{ "}}" }} controller keeps failing.'
          description: Usually a right the operator lacks or an unreachable apiserver; the operator's log names the watch.
  - name: flashsale-drills
    rules:
      - alert: FlashSaleDrillAborted
        expr: increase(flashsale_drill_runs_total{ {{- $sel -}} ,outcome="Aborted"}[10m]) > 0
        labels:
          severity: warning
        annotations:
          summary: 'ChaosDrill {{ "{{" }} $labels.exported_namespace {{ "}}" }}/{{ "{{" }} $labels.drill {{ "}}" }} was aborted by its SLO guard.'
          description: The sale did not hold its SLO under the fault; the drill's status.history names the objective that breached.
      - alert: FlashSaleDrillGuardBlind
        expr: increase(flashsale_drill_guard_blind_total{ {{- $sel -}} }[10m]) > 0
        labels:
          severity: warning
        annotations:
          summary: 'ChaosDrill {{ "{{" }} $labels.exported_namespace {{ "}}" }}/{{ "{{" }} $labels.drill {{ "}}" }} was aborted because its guard could not read its signal.'
          description: Prometheus was unreachable or a guard query failed or returned nothing; no drill can run safely until it reads again.
      - alert: FlashSaleStandbyNotReady
        expr: max by (exported_namespace, drill) (flashsale_drill_standby_ready{ {{- $sel -}} } and on (instance) (flashsale_operator_leader{ {{- $sel -}} } == 1)) < 1
        for: {{ $r.standbyNotReadyFor }}
        labels:
          severity: warning
        annotations:
          summary: 'The standby region of ChaosDrill {{ "{{" }} $labels.exported_namespace {{ "}}" }}/{{ "{{" }} $labels.drill {{ "}}" }} has not been ready for {{ $r.standbyNotReadyFor }}.'
          description: A failover now would not hold; the drill's StandbyReady condition and status.failover name the check that fails, with its numbers.
  - name: flashsale-degradation
    rules:
      - alert: FlashSaleDegradationTierHeld
        expr: max by (exported_namespace, policy) (flashsale_degradation_tier{ {{- $sel -}} }) > 0
        for: {{ $r.tierHeldFor }}
        labels:
          severity: warning
        annotations:
          summary: 'DegradationPolicy {{ "{{" }} $labels.exported_namespace {{ "}}" }}/{{ "{{" }} $labels.policy {{ "}}" }} has held tier {{ "{{" }} $value {{ "}}" }} for {{ $r.tierHeldFor }}.'
          description: Buyers see a degraded sale; check the load signal and any manual override (kubectl get degradationpolicy -o wide).
{{- end -}}
