{{/*
Labels on every object's metadata: Helm's standard labels and .Values.commonLabels.
Pod templates and selectors carry only app.kubernetes.io/name (and component), as in deploy/.
*/}}
{{- define "joulesched.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* "repository:tag", the tag defaulting to the chart's appVersion. Call with (list $ .Values.x.image). */}}
{{- define "joulesched.image" -}}
{{- $root := index . 0 -}}
{{- $img := index . 1 -}}
{{- printf "%s:%s" $img.repository (default $root.Chart.AppVersion $img.tag) -}}
{{- end -}}

{{/*
The kube-scheduler image tag: .Values.scheduler.image.tag, else the cluster's version
vMAJOR.MINOR.PATCH from .Capabilities.KubeVersion, without vendor suffixes (+k3s1, -eks-...).
*/}}
{{- define "joulesched.schedulerTag" -}}
{{- if .Values.scheduler.image.tag -}}
{{- .Values.scheduler.image.tag -}}
{{- else -}}
{{- $v := regexFind "^v?[0-9]+\\.[0-9]+\\.[0-9]+" .Capabilities.KubeVersion.Version -}}
{{- if $v -}}
{{- printf "v%s" (trimPrefix "v" $v) -}}
{{- else -}}
{{- printf "v%s.%s.0" .Capabilities.KubeVersion.Major (regexFind "^[0-9]+" .Capabilities.KubeVersion.Minor) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The extender's config file: files/extender-config.yaml, verbatim unless .Values.extender.config merges keys over it. */}}
{{- define "joulesched.extenderConfig" -}}
{{- $file := .Files.Get "files/extender-config.yaml" -}}
{{- if or .Values.extender.config .Values.extender.tls.enabled -}}
{{- $cfg := mustMergeOverwrite (fromYaml $file) (deepCopy (.Values.extender.config | default dict)) -}}
{{- if .Values.extender.tls.enabled -}}
{{- $tls := dict "cert_file" (printf "%s/tls.crt" (include "joulesched.extenderTLSDir" .)) "key_file" (printf "%s/tls.key" (include "joulesched.extenderTLSDir" .)) "client_ca_file" (printf "%s/ca.crt" (include "joulesched.extenderTLSDir" .)) -}}
{{- $_ := mustMergeOverwrite $cfg (dict "server" (dict "tls" $tls)) -}}
{{- end -}}
{{- toYaml $cfg -}}
{{- else -}}
{{- $file -}}
{{- end -}}
{{- end -}}

{{/* Where the extender's serving certificate (extender.tls.serverSecret) is mounted. */}}
{{- define "joulesched.extenderTLSDir" -}}/etc/joulesched-tls{{- end -}}

{{/* Where kube-scheduler's client certificate for the extender (extender.tls.clientSecret) is mounted. */}}
{{- define "joulesched.schedulerTLSDir" -}}/etc/kubernetes/extender-tls{{- end -}}

{{/* The extender's Service URL, as the scheduler calls it. */}}
{{- define "joulesched.extenderURL" -}}
{{- printf "%s://joulesched-extender.%s.svc:%v/scheduler" (ternary "https" "http" .Values.extender.tls.enabled) .Release.Namespace .Values.extender.port -}}
{{- end -}}

{{/* The agent's namespace (Pod Security "privileged"; everything else stays in the release namespace). */}}
{{- define "joulesched.agentNamespace" -}}
{{- .Values.agent.namespace.name -}}
{{- end -}}
