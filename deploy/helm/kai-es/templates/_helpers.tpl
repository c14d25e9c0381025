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

{{/* Scheduling shards (kai_es/ingest/shards.py; KAI's SchedulingShard): each item of
.Values.shards gets its own scheduler and binder Deployment on its own log, and the one
informer routes every object to its shard's log. The CLI checks the same rules when a process
starts; here a wrong list stops the render instead, naming the shard (values.schema.json checks
the patterns too, but `--skip-schema-validation` skips it). Renders nothing. */}}
{{- define "kai-es.checkShards" -}}
{{- $names := dict -}}
{{- $values := dict -}}
{{- $m := .Values.metrics -}}
{{- range $i, $s := .Values.shards -}}
{{- $name := toString (required (printf "shards[%d].name is required" $i) $s.name) -}}
{{- if not (regexMatch "^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$" $name) -}}
{{- fail (printf "shards[%d]: name %q is not a DNS label (at most 63 of a-z 0-9 -, starting and ending alphanumeric): it names Deployments, a Lease and the shard's log" $i $name) -}}
{{- end -}}
{{- if hasKey $names $name -}}
{{- fail (printf "shards: two shards are named %q (shards[%d] and shards[%d])" $name (index $names $name) $i) -}}
{{- end -}}
{{- $_ := set $names $name $i -}}
{{- if not (hasKey $s "partitionLabelValue") -}}
{{- fail (printf "shard %q: partitionLabelValue is required, the kai.scheduler/node-pool label value it owns (\"\" for the objects without the label)" $name) -}}
{{- end -}}
{{- $value := toString $s.partitionLabelValue -}}
{{- if not (regexMatch "^(([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9])?$" $value) -}}
{{- fail (printf "shard %q: partitionLabelValue %q is not a label value (at most 63 of A-Z a-z 0-9 - _ ., starting and ending alphanumeric)" $name $value) -}}
{{- end -}}
{{- if hasKey $values $value -}}
{{- fail (printf "shards %q and %q both own partitionLabelValue %q: each node pool belongs to one shard" (index $values $value) $name $value) -}}
{{- end -}}
{{- $_ := set $values $value $name -}}
{{- range $key := list "schedulerName" "grouping" -}}
{{- if hasKey ($s.config | default dict) $key -}}
{{- fail (printf "shard %q: config.%s is read by the one informer for every shard: set scheduler.config.%s instead" $name $key $key) -}}
{{- end -}}
{{- end -}}
{{- if or $m.service.enabled $m.serviceMonitor.enabled -}}
{{- $svc := printf "%s-scheduler-%s-metrics" (include "kai-es.fullname" $) $name -}}
{{- if gt (len $svc) 63 -}}
{{- fail (printf "shard %q: its metrics Service %s would be longer than 63 characters (a Service name's limit): use a shorter shard name" $name $svc) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The scheduler's configuration ConfigMap: <fullname>-scheduler with scheduler.config (what
the informer reads, and the scheduler's without shards), or with a shard (an item of
.Values.shards) <fullname>-scheduler-<shard> with the shard's config merged over
scheduler.config (maps key by key, anything else replaced). `kai-es scheduler --scenario FILE`
reads spec.scheduler of a kai-es Scenario document, so the config is wrapped in one. Unknown keys
and bad values stop the scheduler with an error naming the field.
Usage: include "kai-es.schedulerConfigMap" (dict "root" $ "shard" $shard-or-nil) */}}
{{- define "kai-es.schedulerConfigMap" -}}
{{- $root := .root -}}
{{- $config := $root.Values.scheduler.config -}}
{{- $suffix := "" -}}
{{- with .shard -}}
{{- $suffix = printf "-%s" .name -}}
{{- $config = mergeOverwrite (deepCopy ($config | default dict)) (deepCopy (.config | default dict)) -}}
{{- end -}}
apiVersion: v1
kind: ConfigMap
metadata:
  name: {{ include "kai-es.fullname" $root }}-scheduler{{ $suffix }}
  namespace: {{ $root.Release.Namespace }}
  labels:
    {{- include "kai-es.labels" $root | nindent 4 }}
    app.kubernetes.io/component: scheduler
    {{- with .shard }}
    kai-es.io/shard: {{ .name }}
    {{- end }}
data:
  scheduler.yaml: |
    apiVersion: kai-es.io/v1alpha1
    kind: Scenario
    metadata:
      name: {{ include "kai-es.fullname" $root }}{{ $suffix }}
    spec:
      scheduler:
        {{- with $config }}
        {{- toYaml . | nindent 8 }}
        {{- else }} {}
        {{- end }}
{{- end -}}
