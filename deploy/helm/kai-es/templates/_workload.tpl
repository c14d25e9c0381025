{{/* One kai-es process as a Deployment of one replica. Its Kafka transactional_id (in its
--log URL) is the same for every pod of the role: whatever overlap an update or a partitioned
node leaves, the newest claim on the log fences the older instance, which stops with exit code 2
and never writes again. With "shard" (an item of .Values.shards) it is that shard's
<fullname>-<role>-<shard>, its pods labelled kai-es.io/shard, with the shard's <role>.replicas
and <role>.resources over the role's. Usage:
  include "kai-es.deployment" (dict "root" $ "role" "binder" "args" $args
    "serviceAccount" true "serviceAccountName" "" "configChecksum" "" "volumes" list
    "volumeMounts" list "shard" $shard) */}}
{{- define "kai-es.deployment" -}}
{{- $root := .root -}}
{{- $v := index $root.Values .role -}}
{{- $shard := .shard -}}
{{- $own := dict -}}
{{- with $shard }}{{ $own = index . $.role | default dict }}{{ end -}}
apiVersion: apps/v1
kind: Deployment
metadata:
  name: {{ include "kai-es.fullname" $root }}-{{ .role }}{{ with $shard }}-{{ .name }}{{ end }}
  namespace: {{ $root.Release.Namespace }}
  labels:
    {{- include "kai-es.labels" $root | nindent 4 }}
    app.kubernetes.io/component: {{ .role }}
    {{- with $shard }}
    kai-es.io/shard: {{ .name }}
    {{- end }}
spec:
  {{- $replicas := int (include "kai-es.replicas" (dict "root" $root "role" .role "shard" $shard)) }}
  {{- if and (gt $replicas 1) (not $root.Values.leaderElection.enabled) }}
  {{- $key := .role }}
  {{- with $shard }}{{ $key = printf "shard %q: %s" .name $key }}{{ end }}
  {{- fail (printf "%s.replicas is %d: more than one replica needs leaderElection.enabled (without it they would only fence each other)" $key $replicas) }}
  {{- end }}
  replicas: {{ $replicas }}
  revisionHistoryLimit: {{ $root.Values.revisionHistoryLimit }}
  strategy:
    {{- if $root.Values.updateStrategy }}
    {{- toYaml $root.Values.updateStrategy | nindent 4 }}
    {{- else if $root.Values.leaderElection.enabled }}
    # the new pod stands by (Ready) until the old one, stopped by SIGTERM, hands the Lease back
    type: RollingUpdate
    rollingUpdate: {maxSurge: 1, maxUnavailable: 0}
    {{- else }}
    # without a Lease a new pod fences the old one before it is Ready; the fenced old pod, not
    # yet deleted, would be restarted and fence the new one back: stop the old one first
    type: Recreate
    {{- end }}
  selector:
    matchLabels:
      {{- include "kai-es.selectorLabels" $root | nindent 6 }}
      app.kubernetes.io/component: {{ .role }}
      {{- with $shard }}
      kai-es.io/shard: {{ .name }}
      {{- end }}
  template:
    metadata:
      labels:
        {{- include "kai-es.selectorLabels" $root | nindent 8 }}
        app.kubernetes.io/component: {{ .role }}
        {{- with $shard }}
        kai-es.io/shard: {{ .name }}
        {{- end }}
        {{- with $root.Values.podLabels }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      {{- if or $root.Values.podAnnotations .configChecksum }}
      annotations:
        {{- with .configChecksum }}
        checksum/config: {{ . }}
        {{- end }}
        {{- with $root.Values.podAnnotations }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      {{- end }}
    spec:
      {{- if .serviceAccount }}
      serviceAccountName: {{ .serviceAccountName | default (include "kai-es.serviceAccountName" $root) }}
      {{- else }}
      # the scheduler reads and writes only the event log: no Kubernetes credentials
      automountServiceAccountToken: false
      {{- end }}
      {{- with $root.Values.imagePullSecrets }}
      imagePullSecrets:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $root.Values.priorityClassName }}
      priorityClassName: {{ . }}
      {{- end }}
      {{- with $root.Values.podSecurityContext }}
      securityContext:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      terminationGracePeriodSeconds: {{ $root.Values.terminationGracePeriodSeconds }}
      containers:
        - name: {{ .role }}
          image: {{ include "kai-es.image" $root | quote }}
          imagePullPolicy: {{ $root.Values.image.pullPolicy }}
          command: ["kai-es"]
          args:
            {{- toYaml .args | nindent 12 }}
            {{- if $root.Values.http.enabled }}
            - --http-bind-address
            - {{ printf ":%d" (int $root.Values.http.port) | quote }}
            {{- end }}
          {{- if $root.Values.http.enabled }}
          ports:
            - name: http
              containerPort: {{ int $root.Values.http.port }}
              protocol: TCP
          {{- with $root.Values.http.livenessProbe }}
          livenessProbe:
            httpGet: {path: /healthz, port: http}
            {{- toYaml . | nindent 12 }}
          {{- end }}
          {{- with $root.Values.http.readinessProbe }}
          readinessProbe:
            httpGet: {path: /readyz, port: http}
            {{- toYaml . | nindent 12 }}
          {{- end }}
          {{- end }}
          env:
            - name: POD_NAMESPACE
              valueFrom: {fieldRef: {fieldPath: metadata.namespace}}
            # Python writes no bytecode into the (read-only) image and flushes each log line
            - name: PYTHONDONTWRITEBYTECODE
              value: "1"
            - name: PYTHONUNBUFFERED
              value: "1"
            {{- with $root.Values.eventLog.saslSecret }}
            - name: KAI_ES_KAFKA_SASL_USERNAME
              valueFrom: {secretKeyRef: {name: {{ . }}, key: username}}
            - name: KAI_ES_KAFKA_SASL_PASSWORD
              valueFrom: {secretKeyRef: {name: {{ . }}, key: password}}
            {{- end }}
            {{- with $root.Values.extraEnv }}
            {{- toYaml . | nindent 12 }}
            {{- end }}
          {{- with ($own.resources | default $v.resources) }}
          resources:
            {{- toYaml . | nindent 12 }}
          {{- end }}
          {{- with $root.Values.securityContext }}
          securityContext:
            {{- toYaml . | nindent 12 }}
          {{- end }}
          volumeMounts:
            - name: tmp
              mountPath: /tmp
            {{- with $root.Values.eventLog.file.path }}
            - name: event-log
              mountPath: {{ dir . }}
            {{- end }}
            {{- if $root.Values.eventLog.tlsSecret }}
            - name: kafka-tls
              mountPath: /etc/kai-es/kafka-tls
              readOnly: true
            {{- end }}
            {{- with .volumeMounts }}
            {{- toYaml . | nindent 12 }}
            {{- end }}
      volumes:
        - name: tmp
          emptyDir:
            sizeLimit: 64Mi
        {{- if $root.Values.eventLog.file.path }}
        - name: event-log
          {{- toYaml $root.Values.eventLog.file.volume | nindent 10 }}
        {{- end }}
        {{- with $root.Values.eventLog.tlsSecret }}
        - name: kafka-tls
          secret:
            secretName: {{ . }}
        {{- end }}
        {{- with .volumes }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      {{- with ($v.nodeSelector | default $root.Values.nodeSelector) }}
      nodeSelector:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with ($v.tolerations | default $root.Values.tolerations) }}
      tolerations:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with ($v.affinity | default $root.Values.affinity) }}
      affinity:
        {{- toYaml . | nindent 8 }}
      {{- end }}
{{- end -}}


{{/* The replicas of a role's Deployment (of a shard's, with "shard": its <role>.replicas when
set). Usage: include "kai-es.replicas" (dict "root" $ "role" "binder" "shard" $shard) | int */}}
{{- define "kai-es.replicas" -}}
{{- $v := index .root.Values .role -}}
{{- $own := dict -}}
{{- with .shard }}{{ $own = index . $.role | default dict }}{{ end -}}
{{- $own.replicas | default $v.replicas | default 1 | int -}}
{{- end -}}
