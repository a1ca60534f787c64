{{/*
The KubeSchedulerConfiguration: the content of deploy/scheduler/scheduler-config.yaml, with the
release namespace, the scheduler name and the extender entry's tunables from the values.
*/}}
{{- define "joulesched.schedulerConfig" -}}
# The energy-aware kube-scheduler instance. Extenders apply to every profile of a scheduler,
# so this is a scheduler of its own: pods opt in with `schedulerName: {{ .Values.scheduler.schedulerName }}`, all others
# (the extender's own pods included) stay with the cluster's default scheduler.
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
leaderElection:
  leaderElect: true
  resourceNamespace: {{ .Release.Namespace }}
  resourceName: joulesched-scheduler
# Score every feasible node: above 100 nodes kube-scheduler otherwise stops after a slice
# (420 of 1,000 nodes, 500 of 5,000) and a pod can only land on the best node of its slice
# (docs/policy.md, "The slice kube-scheduler sends").
percentageOfNodesToScore: {{ .Values.scheduler.percentageOfNodesToScore }}
{{- with .Values.scheduler.clientConnection }}
# kube-scheduler's API client (values scheduler.clientConnection): its bindings are held to qps.
clientConnection:
  {{- toYaml . | nindent 2 }}
{{- end }}
profiles:
  - schedulerName: {{ .Values.scheduler.schedulerName }}
    # Bin-pack within what the extender prefers: MostAllocated keeps pods on nodes that are on
    # anyway, so that empty ones can be powered down (docs/policy.md, "The in-tree profile").
    pluginConfig:
      - name: NodeResourcesFit
        args:
          scoringStrategy:
            type: MostAllocated
            resources:
              - {name: cpu, weight: 1}
              - {name: memory, weight: 1}
extenders:
  - urlPrefix: {{ include "joulesched.extenderURL" . }}
    {{- $cfg := include "joulesched.extenderConfig" . | fromYaml }}
    filterVerb: filter
    {{- $keeps := index ($cfg.policy | default dict) "filter_keeps" | default "all" }}
    {{- if eq $keeps "best" }}
    # policy.filter_keeps: best: filter keeps one node, and kube-scheduler places the pod there
    # without scoring or asking prioritize (docs/extender.md, "Choosing the node").
    {{- else if eq $keeps "top" }}
    # policy.filter_keeps: top: filter keeps only the nodes prioritize would score highest, all
    # alike, and kube-scheduler's own plugins choose among them (docs/extender.md, "Choosing the node").
    {{- else }}
    prioritizeVerb: prioritize
    {{- end }}
    preemptVerb: preempt
    {{- if and $cfg.bind $cfg.bind.enabled }}
    {{- if and (hasKey $cfg.bind "write") (not $cfg.bind.write) (not .Values.scheduler.ignorable) }}
    {{- fail "extender.config.bind.write: false needs scheduler.ignorable: true: kube-scheduler binds a pod itself only when an ignorable extender answers its bind with an error, and a non-ignorable one fails every binding" }}
    {{- end }}
    # The extender binds (with its bind.write: false it only records, and kube-scheduler, the
    # entry ignorable, writes): it knows where each pod went before it answers for the next one
    # (deploy/scheduler/scheduler-config.yaml).
    bindVerb: bind
    {{- end }}
    # kube-scheduler adds score × weight × 10 (MaxNodeScore / MaxExtenderPriority); weight 5
    # (0..500) lets a large energy difference decide (deploy/scheduler/scheduler-config.yaml).
    weight: {{ .Values.scheduler.extenderWeight }}
    {{- if .Values.extender.tls.enabled }}
    # Mutual TLS (values extender.tls): kube-scheduler presents its client certificate and
    # checks the extender's (docs/extender.md, "HTTPS and mutual TLS").
    enableHTTPS: true
    tlsConfig:
      certFile: {{ include "joulesched.schedulerTLSDir" . }}/tls.crt
      keyFile: {{ include "joulesched.schedulerTLSDir" . }}/tls.key
      caFile: {{ include "joulesched.schedulerTLSDir" . }}/ca.crt
    {{- else }}
    # Plain HTTP: any client that reaches the port is answered (values extender.tls).
    enableHTTPS: false
    {{- end }}
    # NodeNames instead of full Node objects: 10-50x smaller requests.
    nodeCacheCapable: true
    # An extender that is down or slow must not stop scheduling.
    ignorable: {{ .Values.scheduler.ignorable }}
    # The extender answers in milliseconds; the 5 s default would stall every pod when it hangs.
    httpTimeout: {{ .Values.scheduler.extenderHttpTimeout }}
{{- end -}}
