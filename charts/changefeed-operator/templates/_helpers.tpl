{{/* The release's full name (truncated to 63 characters). */}}
{{- define "changefeed-operator.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* Labels of every object. */}}
{{- define "changefeed-operator.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: changefeed-operator
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* Labels selecting the operator pods. */}}
{{- define "changefeed-operator.selectorLabels" -}}
app.kubernetes.io/name: changefeed-operator
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{/* The operator image: repository@digest, or repository:tag (default: appVersion). */}}
{{- define "changefeed-operator.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{/* The service account's name. */}}
{{- define "changefeed-operator.serviceAccountName" -}}
{{- default (include "changefeed-operator.fullname" .) .Values.serviceAccount.name -}}
{{- end -}}

{{/* The in-cluster emulator's host name. */}}
{{- define "changefeed-operator.emulatorHost" -}}
{{- printf "%s-emulator.%s.svc" (include "changefeed-operator.fullname" .) .Release.Namespace -}}
{{- end -}}

{{/* The rules the operator needs in a namespace it watches: only the verbs the code uses. */}}
{{- define "changefeed-operator.rules" -}}
- apiGroups: ["changefeed.io"]
  resources: ["changefeedprocessors"]
  # list/watch: the controller; get: Events of fast failover; patch: the lease-cleanup finalizer.
  verbs: ["get", "list", "watch", "patch"]
- apiGroups: ["changefeed.io"]
  resources: ["changefeedprocessors/status"]
  # Status is written with server-side apply.
  verbs: ["patch"]
- apiGroups: ["changefeed.io"]
  resources: ["changefeedprocessors/finalizers"]
  # Owner references with blockOwnerDeletion on the workers' Deployment and Service.
  verbs: ["update"]
- apiGroups: ["apps"]
  resources: ["deployments"]
  # Server-side apply (create/patch), reading replicas and status, the owns-watch.
  verbs: ["get", "list", "watch", "create", "patch"]
- apiGroups: [""]
  resources: ["services"]
  # get: an object of the resource's name is applied only when the resource owns it.
  verbs: ["get", "list", "watch", "create", "patch"]
- apiGroups: ["policy"]
  resources: ["poddisruptionbudgets"]
  # One worker at a time may be evicted (server-side apply); get: the ownership check.
  verbs: ["get", "create", "patch"]
- apiGroups: [""]
  resources: ["secrets"]
  {{- if .Values.secrets.watch }}
  # get: the Secrets resources name; list/watch: a metadata-only watch (no Secret data is cached).
  verbs: ["get", "list", "watch"]
  {{- else }}
  # get alone: only the Secrets resources name, read at each reconciliation (secrets.watch false).
  verbs: ["get"]
  {{- end }}
- apiGroups: ["networking.k8s.io"]
  resources: ["networkpolicies"]
  # The workers' NetworkPolicy (spec.worker.networkPolicy): server-side apply, and delete when a
  # resource turns it off; get: only one the resource owns is applied or deleted.
  verbs: ["get", "create", "patch", "delete"]
- apiGroups: [""]
  resources: ["pods"]
  # Fast failover: a gone worker pod's leases are freed at once.
  verbs: ["list", "watch"]
- apiGroups: [""]
  resources: ["configmaps"]
  # get: the export a `changefeed.io/restore-from` annotation names.
  verbs: ["get"]
- apiGroups: ["autoscaling"]
  resources: ["horizontalpodautoscalers"]
  # The built-in autoscaler steps back when an HPA (or KEDA) targets a resource's /scale.
  verbs: ["list"]
- apiGroups: ["events.k8s.io"]
  resources: ["events"]
  verbs: ["create", "patch"]
{{- end -}}

{{/* The allow-list of accounts (allowedAccounts, plus the chart's emulator for every namespace when it is enabled), as YAML. */}}
{{- define "changefeed-operator.allowedAccounts" -}}
{{- $entries := list }}
{{- range .Values.allowedAccounts }}
{{- $entries = append $entries (dict "endpoint" .endpoint "namespaces" .namespaces) }}
{{- end }}
{{- if .Values.emulator.enabled }}
{{- $emulator := printf "http://%s:8081/" (include "changefeed-operator.emulatorHost" .) }}
{{- $entries = append $entries (dict "endpoint" $emulator "namespaces" (list "*")) }}
{{- end }}
{{- toYaml $entries }}
{{- end }}

{{/* An endpoint as the operator compares it: scheme://host:port/, lower case, the scheme's port when none is given. */}}
{{- define "changefeed-operator.normalisedEndpoint" -}}
{{- $url := urlParse (trim .) }}
{{- $scheme := lower $url.scheme }}
{{- $host := lower $url.host }}
{{- if not (regexMatch ":[0-9]+$" $host) }}
{{- $host = printf "%s:%s" $host (ternary "443" "80" (eq $scheme "https")) }}
{{- end }}
{{- printf "%s://%s/" $scheme $host }}
{{- end }}

{{/* The CEL expression that normalises the endpoint string given as the argument, the same way. */}}
{{- define "changefeed-operator.celNormalisedEndpoint" -}}
url({{ . }}).getScheme().lowerAscii() + '://' + (url({{ . }}).getHostname().contains(':') ? '[' + url({{ . }}).getHostname().lowerAscii() + ']' : url({{ . }}).getHostname().lowerAscii()) + ':' + (url({{ . }}).getPort() != '' ? url({{ . }}).getPort() : (url({{ . }}).getScheme().lowerAscii() == 'https' ? '443' : '80')) + '/'
{{- end }}
