{{/*
Names. fullname is <release>-quotad, or the release name when it already
says quotad.
*/}}
{{- define "quotad.fullname" -}}
{{- if contains "quotad" .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-quotad" .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "quotad.labels" -}}
app.kubernetes.io/name: quotad
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "quotad.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{- define "quotad.socketPath" -}}
{{ .Values.socket.dir }}/quotad.sock
{{- end -}}

{{- define "quotad.rlsSocketPath" -}}
{{ .Values.socket.dir }}/{{ .Values.rls.socketName }}
{{- end -}}

{{/*
quotad.podLabels: labels for the pod template of a workload with the
sidecar; the PodMonitor selects them.
*/}}
{{- define "quotad.podLabels" -}}
quotad/sidecar: "true"
{{- if .Values.rls.enabled }}
quotad/rls: {{ include "quotad.fullname" . }}
{{- end }}
{{- end -}}

{{/*
quotad.podAnnotations: annotations for the pod template of a workload with
the sidecar: with rls.istio.enabled, Istio's injector mounts the socket's
volume into istio-proxy, which then reaches the rate limit service. Empty
otherwise.

  annotations:
    {{- include "quotad.podAnnotations" . | nindent 4 }}
*/}}
{{- define "quotad.podAnnotations" -}}
{{- if and .Values.rls.enabled .Values.rls.istio.enabled -}}
sidecar.istio.io/userVolumeMount: {{ dict "quotad-socket" (dict "mountPath" .Values.socket.dir) | toJson | quote }}
{{- end }}
{{- end -}}

{{/*
quotad.redisEnv: where Redis is, for the sidecar and the doctor alike.
*/}}
{{- define "quotad.redisEnv" -}}
- name: QUOTAD_REDIS_URL
  valueFrom:
    configMapKeyRef:
      name: {{ include "quotad.fullname" . }}-redis
      key: url
- name: QUOTAD_KEY_PREFIX
  valueFrom:
    configMapKeyRef:
      name: {{ include "quotad.fullname" . }}-redis
      key: key-prefix
{{- with .Values.redis.passwordSecret }}
{{- if .name }}
- name: QUOTAD_REDIS_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ .name }}
      key: {{ .key }}
{{- end }}
{{- end }}
{{- end -}}

{{/*
quotad.tracingEnv: the OTEL_* variables of tracing.*, and the pod's
resource attributes from the downward API; nothing while tracing.endpoint
is empty.
*/}}
{{- define "quotad.tracingEnv" -}}
{{- with .Values.tracing }}
{{- if .endpoint }}
- name: OTEL_EXPORTER_OTLP_ENDPOINT
  value: {{ .endpoint | quote }}
- name: OTEL_EXPORTER_OTLP_PROTOCOL
  value: {{ .protocol | quote }}
- name: OTEL_TRACES_SAMPLER
  value: {{ .sampler | quote }}
{{- if .samplerArg }}
- name: OTEL_TRACES_SAMPLER_ARG
  value: {{ .samplerArg | quote }}
{{- end }}
- name: OTEL_SERVICE_NAME
  value: {{ .serviceName | quote }}
- name: K8S_POD_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
- name: K8S_POD_UID
  valueFrom:
    fieldRef:
      fieldPath: metadata.uid
- name: K8S_NAMESPACE_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.namespace
- name: K8S_NODE_NAME
  valueFrom:
    fieldRef:
      fieldPath: spec.nodeName
- name: OTEL_RESOURCE_ATTRIBUTES
  value: k8s.pod.name=$(K8S_POD_NAME),k8s.pod.uid=$(K8S_POD_UID),k8s.namespace.name=$(K8S_NAMESPACE_NAME),k8s.node.name=$(K8S_NODE_NAME),k8s.container.name=quotad
{{- end }}
{{- end }}
{{- end -}}

{{- define "quotad.probe" -}}
httpGet:
  path: {{ .probe.path }}
  port: quotad-metrics
periodSeconds: {{ .probe.periodSeconds }}
timeoutSeconds: {{ .probe.timeoutSeconds }}
failureThreshold: {{ .probe.failureThreshold }}
{{- end -}}

{{- define "quotad.securityContext" -}}
runAsUser: 65532
runAsGroup: 65532
runAsNonRoot: true
readOnlyRootFilesystem: true
allowPrivilegeEscalation: false
capabilities:
  drop: ["ALL"]
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/*
quotad.sidecar: the native sidecar, one item of a pod's initContainers:

  initContainers:
    {{- include "quotad.sidecar" . | nindent 4 }}
*/}}
{{- define "quotad.sidecar" -}}
- name: quotad
  image: {{ include "quotad.image" . }}
  imagePullPolicy: {{ .Values.image.pullPolicy }}
  restartPolicy: Always
  args: ["serve"]
  env:
    - name: POD_IP
      valueFrom:
        fieldRef:
          fieldPath: status.podIP
    - name: QUOTAD_SOCKET
      value: {{ include "quotad.socketPath" . }}
    - name: QUOTAD_SOCKET_MODE
      value: {{ .Values.socket.mode | quote }}
    - name: QUOTAD_CONFIG
      value: /etc/quotad/policies.yaml
    {{- if .Values.rls.enabled }}
    - name: QUOTAD_RLS_SOCKET
      value: {{ include "quotad.rlsSocketPath" . }}
    - name: QUOTAD_RLS_CONFIG
      value: /etc/quotad-rls/ratelimit.yaml
    {{- end }}
    {{- include "quotad.redisEnv" . | nindent 4 }}
    - name: QUOTAD_HTTP_ADDR
      value: $(POD_IP):{{ .Values.httpPort }}
    - name: QUOTAD_MAX_CONNS
      value: {{ .Values.maxConns | quote }}
    - name: QUOTAD_SHUTDOWN_TIMEOUT
      value: {{ .Values.shutdownTimeout | quote }}
    - name: QUOTAD_LOG_DECISIONS
      value: {{ .Values.logDecisions | quote }}
    {{- include "quotad.tracingEnv" . | nindent 4 }}
    {{- with .Values.extraEnv }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  ports:
    - name: quotad-metrics
      containerPort: {{ .Values.httpPort }}
  volumeMounts:
    - name: quotad-socket
      mountPath: {{ .Values.socket.dir }}
    - name: quotad-policies
      mountPath: /etc/quotad
      readOnly: true
    {{- if .Values.rls.enabled }}
    - name: quotad-rls
      mountPath: /etc/quotad-rls
      readOnly: true
    {{- end }}
  startupProbe:
    {{- include "quotad.probe" (dict "probe" .Values.probes.startup) | nindent 4 }}
  livenessProbe:
    {{- include "quotad.probe" (dict "probe" .Values.probes.liveness) | nindent 4 }}
  readinessProbe:
    {{- include "quotad.probe" (dict "probe" .Values.probes.readiness) | nindent 4 }}
  resources:
    {{- toYaml .Values.resources | nindent 4 }}
  securityContext:
    {{- include "quotad.securityContext" . | nindent 4 }}
{{- end -}}

{{/*
quotad.volumes: the socket's emptyDir and the policies (and with
rls.enabled the rate limit service's descriptors), items of a pod's
volumes.
*/}}
{{- define "quotad.volumes" -}}
- name: quotad-socket
  emptyDir:
    medium: Memory
    sizeLimit: 1Mi
- name: quotad-policies
  configMap:
    name: {{ include "quotad.fullname" . }}-policies
{{- if .Values.rls.enabled }}
- name: quotad-rls
  configMap:
    name: {{ include "quotad.fullname" . }}-rls
{{- end }}
{{- end -}}

{{/*
quotad.socketMount and quotad.socketEnv: for the container that talks to
quotad, an item of its volumeMounts and of its env.
*/}}
{{- define "quotad.socketMount" -}}
- name: quotad-socket
  mountPath: {{ .Values.socket.dir }}
{{- end -}}

{{- define "quotad.socketEnv" -}}
- name: QUOTAD_SOCKET
  value: {{ include "quotad.socketPath" . }}
{{- end -}}
