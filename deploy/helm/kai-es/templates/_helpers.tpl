{{/* Chart name, overridable. */}}
{{- define "kai-es.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Release-scoped name of cluster objects: the release name when it already contains the
chart's name (`helm install kai-es ...` gives `kai-es`), else <release>-<chart>. */}}
{{- define "kai-es.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "kai-es.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kai-es.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "kai-es.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "kai-es.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: kai-es
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "kai-es.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "kai-es.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name: the existing ServiceAccount kai-es's informer and binder run as (serviceAccount.create is false)" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The scheduler's identity: it needs Kubernetes only for its Lease (leader election). */}}
{{- define "kai-es.schedulerServiceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (printf "%s-scheduler" (include "kai-es.fullname" .)) .Values.serviceAccount.schedulerName -}}
{{- else -}}
{{- required "serviceAccount.schedulerName: the existing ServiceAccount kai-es's scheduler runs as (serviceAccount.create is false)" .Values.serviceAccount.schedulerName -}}
{{- end -}}
{{- end -}}

{{/* The flags of one role's leader election: its own Lease <fullname>-<role> in the release
namespace. Usage: include "kai-es.leaderArgs" (dict "root" $ "role" "binder") | fromYamlArray */}}
{{- define "kai-es.leaderArgs" -}}
{{- $le := .root.Values.leaderElection -}}
{{- if $le.enabled -}}
{{- list "--leader-elect"
      "--leader-elect-lease" (printf "%s/%s-%s" .root.Release.Namespace (include "kai-es.fullname" .root) .role)
      "--leader-elect-lease-duration" $le.leaseDuration
      "--leader-elect-renew-deadline" $le.renewDeadline
      "--leader-elect-retry-period" $le.retryPeriod | toYaml -}}
{{- else -}}
[]
{{- end -}}
{{- end -}}

{{/* The kai-es CLI's namespace of GPU reservation pods is fixed (KAI's); it is read from the
Role in files/rbac/reservation-role.yaml, the one place it is written down for deployment. */}}
{{- define "kai-es.reservationNamespace" -}}
{{- (.Files.Get "files/rbac/reservation-role.yaml" | fromYaml).metadata.namespace -}}
{{- end -}}

{{/* The event log URL of one role: eventLog.url plus that role's Kafka transactional_id.
The id names the writer role and must be stable across restarts: a new instance with the same
id fences the old one (kai_es/adapters/kafka_log.py, "Fencing"). It defaults to
kai-es-<role>.<topic>, so two installs pointed at one topic by mistake fence each other instead
of interleaving their writes. Usage: include "kai-es.logUrl" (dict "root" $ "role" "binder") */}}
{{- define "kai-es.logUrl" -}}
{{- with .root.Values.eventLog.file.path -}}
{{- if not (hasPrefix "/" .) -}}
{{- fail (printf "eventLog.file.path %q: an absolute path in the pods (its directory is the volume's mount point)" .) -}}
{{- end -}}
{{- if not $.root.Values.eventLog.file.volume -}}
{{- fail "eventLog.file.path needs eventLog.file.volume: a volume every pod of the three roles mounts (three pods cannot share an emptyDir)" -}}
{{- end -}}
{{- . -}}
{{- else -}}
{{- $url := required "eventLog.url is required: kafka://host:port[,host:port...]/topic" .root.Values.eventLog.url -}}
{{- if not (hasPrefix "kafka://" $url) -}}
{{- fail (printf "eventLog.url %q: expected kafka://host:port/topic (for the embedded file log, set eventLog.file.path and eventLog.file.volume)" $url) -}}
{{- end -}}
{{- if contains "transactional_id=" $url -}}
{{- fail "eventLog.url must not carry ?transactional_id=: each role gets its own (see eventLog.transactionalIdPrefix)" -}}
{{- end -}}
{{- $parsed := urlParse $url -}}
{{- $topic := trimPrefix "/" $parsed.path | default "kai-es.events" -}}
{{- $prefix := .root.Values.eventLog.transactionalIdPrefix | default "kai-es" -}}
{{- $query := list (printf "transactional_id=%s-%s.%s" $prefix .role $topic) -}}
{{- if not .root.Values.eventLog.createTopics -}}
{{- $query = append $query "create=false" -}}
{{- end -}}
{{- printf "%s%s%s" $url (ternary "&" "?" (contains "?" $url)) (join "&" $query) -}}
{{- end -}}
{{- end -}}

{{/* image reference */}}
{{- define "kai-es.image" -}}
{{- $tag := .Values.image.tag | default .Chart.AppVersion -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository $tag -}}
{{- end -}}
{{- end -}}
