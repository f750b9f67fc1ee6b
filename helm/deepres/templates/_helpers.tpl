{{/*
Names, labels and small computed values shared by every template.
*/}}

{{/* Chart name, at most 63 characters (a DNS label). */}}
{{- define "deepres.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Object name prefix: the release name, or `<release>-deepres` when it does not contain the chart name. */}}
{{- define "deepres.fullname" -}}
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

{{/* Name of one component's objects: `<fullname>-<component>` (component in .component). */}}
{{- define "deepres.componentName" -}}
{{- printf "%s-%s" (include "deepres.fullname" .root | trunc 50 | trimSuffix "-") .component }}
{{- end }}

{{- define "deepres.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels on every object. */}}
{{- define "deepres.labels" -}}
helm.sh/chart: {{ include "deepres.chart" . }}
{{ include "deepres.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: deepres
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Labels that select the release's pods (never change them: selectors are immutable). */}}
{{- define "deepres.selectorLabels" -}}
app.kubernetes.io/name: {{ include "deepres.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* Labels of one component's objects (component in .component, context in .root). */}}
{{- define "deepres.componentLabels" -}}
{{ include "deepres.labels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "deepres.componentSelectorLabels" -}}
{{ include "deepres.selectorLabels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/* kube-scheduler image: the cluster's own version unless a tag is set (vendor suffixes such as `-eks-...` or `+k3s1` dropped). */}}
{{- define "deepres.schedulerImage" -}}
{{- $tag := .Values.scheduler.image.tag }}
{{- if not $tag }}
{{- $tag = regexFind "^v[0-9]+\\.[0-9]+\\.[0-9]+" .Capabilities.KubeVersion.Version }}
{{- end }}
{{- printf "%s:%s" .Values.scheduler.image.repository $tag }}
{{- end }}

{{/* The deepres images: under imageRegistry when it is set (`make push-images REGISTRY=...`). */}}
{{- define "deepres.extenderImage" -}}
{{- with .Values.imageRegistry }}{{ trimSuffix "/" . }}/{{ end }}
{{- printf "%s:%s" .Values.extender.image.repository (default .Chart.AppVersion .Values.extender.image.tag) }}
{{- end }}

{{- define "deepres.agentImage" -}}
{{- with .Values.imageRegistry }}{{ trimSuffix "/" . }}/{{ end }}
{{- printf "%s:%s" .Values.agent.image.repository (default .Chart.AppVersion .Values.agent.image.tag) }}
{{- end }}

{{/* The extender Service's in-cluster DNS name. */}}
{{- define "deepres.extenderHost" -}}
{{- printf "%s.%s.svc" (include "deepres.componentName" (dict "root" . "component" "extender")) .Release.Namespace }}
{{- end }}

{{- define "deepres.extenderScheme" -}}
{{- if .Values.extender.tls.enabled }}https{{ else }}http{{ end }}
{{- end }}

{{/* URL kube-scheduler calls. With mtls (the default): the extender's own listener for the scheduler
(extender.schedulerPort, server.scheduler_bind), on 127.0.0.1 with the per-pod certificates in sidecar
mode, through the Service otherwise. Without: the main port, on loopback in sidecar mode (with TLS the
certificate is checked against tls.serverName), through the Service otherwise. */}}
{{- define "deepres.extenderUrlPrefix" -}}
{{- $mtls := eq (include "deepres.verbsAccess" .) "mtls" -}}
{{- $port := ternary (int .Values.extender.schedulerPort) (int .Values.extender.port) $mtls -}}
{{- if and $mtls (eq .Values.extender.mode "sidecar") }}
{{- printf "https://127.0.0.1:%d" $port }}
{{- else if eq .Values.extender.mode "sidecar" }}
{{- printf "%s://127.0.0.1:%d" (include "deepres.extenderScheme" .) $port }}
{{- else }}
{{- printf "%s://%s:%d" (include "deepres.extenderScheme" .) (include "deepres.extenderHost" .) $port }}
{{- end }}
{{- end }}

{{/* Who may call the verbs (extender/server/auth.py): extender.verbsAccess, else mtls (sidecar mode:
per-pod certificates made by the init container; deployment mode: extender.tls.clientSecretName). */}}
{{- define "deepres.verbsAccess" -}}
{{- if .Values.extender.verbsAccess }}
{{- .Values.extender.verbsAccess }}
{{- else -}}
mtls
{{- end }}
{{- end }}

{{/* "true" when the scheduler's mTLS uses the per-pod certificates (sidecar mode with mtls). */}}
{{- define "deepres.podCerts" -}}
{{- if and (eq .Values.extender.mode "sidecar") (eq (include "deepres.verbsAccess" .) "mtls") }}true{{ end }}
{{- end }}

{{/* URL agents post telemetry to. */}}
{{- define "deepres.agentExtenderUrl" -}}
{{- if .Values.agent.extenderUrl }}
{{- .Values.agent.extenderUrl }}
{{- else }}
{{- printf "%s://%s:%d" (include "deepres.extenderScheme" .) (include "deepres.extenderHost" .) (int .Values.extender.port) }}
{{- end }}
{{- end }}

{{/* The rendered extender settings file (also hashed into the pods' checksum annotation). */}}
{{- define "deepres.extenderSettings" -}}
{{- if .Values.extender.settings }}
{{- toYaml .Values.extender.settings }}
{{- else -}}
{}
{{- end }}
{{- end }}

{{/* The extender container, shared by the sidecar (scheduler pod) and the Deployment. */}}
{{- define "deepres.extenderContainer" -}}
- name: extender
  image: {{ include "deepres.extenderImage" . | quote }}
  imagePullPolicy: {{ .Values.extender.image.pullPolicy }}
  args:
    - serve
    - --bind=0.0.0.0:{{ .Values.extender.port }}
    - --config=/etc/deepres/config/settings.yaml
    - --log-level={{ .Values.extender.logLevel }}
    {{- if .Values.extender.tls.enabled }}
    - --tls-cert=/etc/deepres/tls/tls.crt
    - --tls-key=/etc/deepres/tls/tls.key
    {{- end }}
    - --verbs-access={{ include "deepres.verbsAccess" . }}
    {{- if include "deepres.podCerts" . }}
    - --tls-client-ca=/etc/deepres/pod-tls/ca.crt
    {{- else if eq (include "deepres.verbsAccess" .) "mtls" }}
    - --tls-client-ca=/etc/deepres/client-ca/ca.crt
    {{- end }}
  env:
    {{- if eq (include "deepres.verbsAccess" .) "mtls" }}
    # the verbs on a listener of their own: the scheduler's client certificate is checked in its TLS
    # handshake, and its connections are never taken by other callers (docs/network-hardening.md)
    - name: DEEPRES_SCHEDULER_BIND
      value: {{ printf "%s:%d" (ternary "127.0.0.1" "0.0.0.0" (eq .Values.extender.mode "sidecar")) (int .Values.extender.schedulerPort) | quote }}
    - name: DEEPRES_SCHEDULER_MAX_CONNECTIONS
      value: {{ .Values.extender.schedulerMaxConnections | quote }}
    {{- if include "deepres.podCerts" . }}
    - name: DEEPRES_SCHEDULER_TLS_CERT
      value: /etc/deepres/pod-tls/tls.crt
    - name: DEEPRES_SCHEDULER_TLS_KEY
      value: /etc/deepres/pod-tls/tls.key
    {{- end }}
    {{- end }}
    - name: DEEPRES_SCHEDULER_NAME
      value: {{ .Values.scheduler.name | quote }}
    - name: DEEPRES_TELEMETRY_TTL_S
      value: {{ .Values.telemetry.ttlSeconds | quote }}
    - name: DEEPRES_FILTER_SHORTLIST
      value: {{ .Values.extender.filterShortlist | quote }}
    # Agents authenticate with projected tokens for this audience; only the agent ServiceAccount may report.
    - name: DEEPRES_TOKEN_AUDIENCE
      value: {{ .Values.agent.tokenAudience | quote }}
    # the allocation handshake (docs/device-plugin.md): pods requesting this resource are bound one per node
    # at a time and served at Allocate through /v1/allocate
    - name: DEEPRES_DEVICE_RESOURCE
      value: {{ .Values.devicePlugin.resourceName | quote }}
    {{- if eq (include "deepres.mutationMode" .) "webhook" }}
    # the mutating admission webhook (/v1/mutate) on its own TLS listener: clusters without the
    # MutatingAdmissionPolicy (admission.mutation.mode)
    - name: DEEPRES_WEBHOOK_BIND
      value: {{ printf "0.0.0.0:%d" (int .Values.admission.mutation.webhook.port) | quote }}
    - name: DEEPRES_WEBHOOK_TLS_CERT
      value: /etc/deepres/webhook-tls/tls.crt
    - name: DEEPRES_WEBHOOK_TLS_KEY
      value: /etc/deepres/webhook-tls/tls.key
    - name: DEEPRES_MUTATION_WIRING
      value: {{ ternary "device-plugin" "env" .Values.devicePlugin.enabled | quote }}
    {{- end }}
    - name: DEEPRES_AGENT_SERVICE_ACCOUNTS
      value: {{ list (printf "system:serviceaccount:%s:%s" .Release.Namespace (include "deepres.componentName" (dict "root" . "component" "agent"))) | toJson | quote }}
    - name: POD_NAMESPACE
      valueFrom:
        fieldRef:
          fieldPath: metadata.namespace
    # the online calibration's observed pods, kept across restarts (docs/calibration.md; rbac.yaml's Role)
    - name: DEEPRES_CALIBRATION_CONFIGMAP
      value: {{ include "deepres.componentName" (dict "root" . "component" "calibration") | quote }}
    - name: HOME
      value: /tmp
    {{- with .Values.extender.env }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  ports:
    - name: http
      containerPort: {{ .Values.extender.port }}
      protocol: TCP
    {{- if and (eq (include "deepres.verbsAccess" .) "mtls") (ne .Values.extender.mode "sidecar") }}
    - name: scheduler
      containerPort: {{ .Values.extender.schedulerPort }}
      protocol: TCP
    {{- end }}
    {{- if eq (include "deepres.mutationMode" .) "webhook" }}
    - name: webhook
      containerPort: {{ .Values.admission.mutation.webhook.port }}
      protocol: TCP
    {{- end }}
  startupProbe:
    httpGet:
      path: /healthz
      port: http
      scheme: {{ include "deepres.extenderScheme" . | upper }}
    periodSeconds: 2
    failureThreshold: 60
  livenessProbe:
    httpGet:
      path: /healthz
      port: http
      scheme: {{ include "deepres.extenderScheme" . | upper }}
    periodSeconds: 10
    timeoutSeconds: 3
    failureThreshold: 3
  readinessProbe:
    httpGet:
      path: /readyz
      port: http
      scheme: {{ include "deepres.extenderScheme" . | upper }}
    periodSeconds: 5
    timeoutSeconds: 3
  resources:
    {{- toYaml .Values.extender.resources | nindent 4 }}
  securityContext:
    {{- toYaml .Values.containerSecurityContext | nindent 4 }}
  volumeMounts:
    - name: extender-config
      mountPath: /etc/deepres/config
      readOnly: true
    - name: extender-tmp
      mountPath: /tmp
    {{- if .Values.extender.tls.enabled }}
    - name: extender-tls
      mountPath: /etc/deepres/tls
      readOnly: true
    {{- end }}
    {{- if eq (include "deepres.mutationMode" .) "webhook" }}
    - name: webhook-tls
      mountPath: /etc/deepres/webhook-tls
      readOnly: true
    {{- end }}
    {{- if include "deepres.podCerts" . }}
    - name: pod-tls-extender
      mountPath: /etc/deepres/pod-tls
      readOnly: true
    {{- else if eq (include "deepres.verbsAccess" .) "mtls" }}
    - name: scheduler-client-ca
      mountPath: /etc/deepres/client-ca
      readOnly: true
    {{- end }}
{{- end }}

{{/* Sidecar mode with mtls: the init container that makes the per-pod CA, the listener's certificate
and the scheduler's client certificate (deepres pod-certs), each half into its own emptyDir. */}}
{{- define "deepres.podCertsInit" -}}
- name: pod-certs
  image: {{ include "deepres.extenderImage" . | quote }}
  imagePullPolicy: {{ .Values.extender.image.pullPolicy }}
  args:
    - pod-certs
    - --server-dir=/pod-tls/extender
    - --client-dir=/pod-tls/scheduler
  resources:
    requests:
      cpu: 10m
      memory: 32Mi
    limits:
      memory: 128Mi
  securityContext:
    {{- toYaml .Values.containerSecurityContext | nindent 4 }}
  volumeMounts:
    - name: pod-tls-extender
      mountPath: /pod-tls/extender
    - name: pod-tls-scheduler
      mountPath: /pod-tls/scheduler
{{- end }}

{{/* Volumes the extender container mounts. */}}
{{- define "deepres.extenderVolumes" -}}
- name: extender-config
  configMap:
    name: {{ include "deepres.componentName" (dict "root" . "component" "extender") }}
- name: extender-tmp
  emptyDir:
    sizeLimit: 256Mi
{{- if .Values.extender.tls.enabled }}
- name: extender-tls
  secret:
    secretName: {{ .Values.extender.tls.secretName }}
    defaultMode: 0440
{{- end }}
{{- if eq (include "deepres.mutationMode" .) "webhook" }}
- name: webhook-tls
  secret:
    secretName: {{ include "deepres.webhookSecretName" . }}
    defaultMode: 0440
    items:
      - key: tls.crt
        path: tls.crt
      - key: tls.key
        path: tls.key
{{- end }}
{{- if include "deepres.podCerts" . }}
# the per-pod certificates (deepres pod-certs): never in a Secret, gone with the pod
- name: pod-tls-extender
  emptyDir:
    medium: Memory
    sizeLimit: 1Mi
- name: pod-tls-scheduler
  emptyDir:
    medium: Memory
    sizeLimit: 1Mi
{{- else if eq (include "deepres.verbsAccess" .) "mtls" }}
- name: scheduler-client-ca
  secret:
    secretName: {{ .Values.extender.tls.clientSecretName }}
    defaultMode: 0440
    items:
      - key: ca.crt
        path: ca.crt
{{- end }}
{{- end }}

{{/* The user the extender acts as (its ServiceAccount): in sidecar mode the scheduler pod's. The
admission policy lets only it write the annotations the extender writes at bind. */}}
{{- define "deepres.extenderUser" -}}
{{- $component := ternary "scheduler" "extender" (eq .Values.extender.mode "sidecar") -}}
{{- printf "system:serviceaccount:%s:%s" .Release.Namespace (include "deepres.componentName" (dict "root" . "component" $component)) }}
{{- end }}

{{/* The agent's ServiceAccount as the API server names it. */}}
{{- define "deepres.agentUser" -}}
{{- printf "system:serviceaccount:%s:%s" .Release.Namespace (include "deepres.componentName" (dict "root" . "component" "agent")) }}
{{- end }}

{{/* The namespaces the admission policies govern: admission.namespaceSelector, else all but
kube-system and the release namespace (the agent there needs every GPU). */}}
{{- define "deepres.admissionNamespaceSelector" -}}
{{- if .Values.admission.namespaceSelector }}
{{- toYaml .Values.admission.namespaceSelector }}
{{- else -}}
matchExpressions:
  - key: kubernetes.io/metadata.name
    operator: NotIn
    values: [kube-system, {{ .Release.Namespace | quote }}]
{{- end }}
{{- end }}

{{/* How pods carrying deepres job annotations get their wiring (extender/policy/wiring.py):
`policy` (the MutatingAdmissionPolicy, where the API server serves admissionregistration v1 or v1beta1
MutatingAdmissionPolicy), `webhook` (the extender's /v1/mutate, elsewhere), or empty (off).
admission.mutation.mode `auto` chooses from the API server's versions; `policy`/`webhook` force one. */}}
{{- define "deepres.mutationMode" -}}
{{- if .Values.admission.mutation.enabled -}}
{{- $mode := .Values.admission.mutation.mode | default "auto" -}}
{{- if eq $mode "auto" -}}
{{- if or (.Capabilities.APIVersions.Has "admissionregistration.k8s.io/v1/MutatingAdmissionPolicy") (.Capabilities.APIVersions.Has "admissionregistration.k8s.io/v1beta1/MutatingAdmissionPolicy") -}}
policy
{{- else -}}
webhook
{{- end -}}
{{- else -}}
{{- $mode -}}
{{- end -}}
{{- end -}}
{{- end }}

{{/* The webhook's serving certificate: admission.mutation.webhook.secretName (yours, e.g. cert-manager's,
with tls.crt, tls.key and ca.crt), else the chart's own Secret made at install and kept at upgrades. */}}
{{- define "deepres.webhookSecretName" -}}
{{- .Values.admission.mutation.webhook.secretName | default (include "deepres.componentName" (dict "root" . "component" "webhook-tls")) }}
{{- end }}
