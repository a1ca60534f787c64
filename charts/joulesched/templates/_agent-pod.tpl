{{/*
The agent's DaemonSet. Call with (dict "root" $ "name" "joulesched-agent" "gpu" false).
*/}}
{{- define "joulesched.agentDaemonSet" -}}
{{- $root := .root -}}
{{- $v := $root.Values -}}
{{- $gpu := .gpu -}}
apiVersion: apps/v1
kind: DaemonSet
metadata:
  name: {{ .name }}
  namespace: {{ include "joulesched.agentNamespace" $root }}
  labels:
    app.kubernetes.io/name: joulesched-agent
    {{- if $gpu }}
    app.kubernetes.io/component: agent-gpu
    {{- end }}
    {{- include "joulesched.labels" $root | nindent 4 }}
spec:
  selector:
    matchLabels:
      app.kubernetes.io/name: joulesched-agent
      {{- if $gpu }}
      app.kubernetes.io/component: agent-gpu
      {{- end }}
  updateStrategy:
    type: RollingUpdate
    rollingUpdate:
      maxUnavailable: 10%
  template:
    metadata:
      labels:
        app.kubernetes.io/name: joulesched-agent
        {{- if $gpu }}
        app.kubernetes.io/component: agent-gpu
        {{- end }}
      annotations:
        checksum/config: {{ $root.Files.Get "files/agent.yaml" | sha256sum }}
    spec:
      serviceAccountName: joulesched-agent
      {{- if $gpu }}
      {{- with $v.gpu.runtimeClassName }}
      # NVML comes from the NVIDIA container runtime (libnvidia-ml and the device nodes).
      runtimeClassName: {{ . }}
      {{- end }}
      {{- with $v.gpu.nodeSelector }}
      nodeSelector:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $v.gpu.tolerations }}
      tolerations:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- else }}
      {{- with $v.agent.nodeSelector }}
      nodeSelector:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- if $v.gpu.enabled }}
      # The GPU nodes run joulesched-agent-gpu instead.
      affinity:
        nodeAffinity:
          requiredDuringSchedulingIgnoredDuringExecution:
            nodeSelectorTerms:
              - matchExpressions:
                  {{- range $key, $value := $v.gpu.nodeSelector }}
                  - key: {{ $key }}
                    operator: NotIn
                    values: [{{ $value | quote }}]
                  {{- end }}
      {{- end }}
      {{- with $v.agent.tolerations }}
      # Every node, whatever its taints (control plane, GPU, dedicated pools).
      tolerations:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- end }}
      securityContext:
        # energy_uj is readable by root only since Linux 5.10 (PLATYPUS, CVE-2020-8694): the agent
        # runs as UID 0, but unprivileged, with no capability and a read-only root filesystem.
        runAsUser: 0
        runAsGroup: 0
        runAsNonRoot: false
        seccompProfile:
          type: RuntimeDefault
      containers:
        - name: agent
          image: {{ include "joulesched.image" (list $root $v.agent.image) }}
          imagePullPolicy: {{ $v.agent.image.pullPolicy }}
          args:
            - agent
            - --config=/etc/joulesched/agent.yaml
            - --node-name=$(NODE_NAME)
            - --listen=0.0.0.0:{{ $v.agent.port }}
            - --sysfs-root=/host/sys
            - --procfs-root=/host/proc
            - --cgroup-root=/host/sys/fs/cgroup
          env:
            - name: NODE_NAME
              valueFrom:
                fieldRef:
                  fieldPath: spec.nodeName
            {{- if $gpu }}
            - name: NVIDIA_VISIBLE_DEVICES
              value: all
            - name: NVIDIA_DRIVER_CAPABILITIES
              value: utility
            {{- end }}
          ports:
            - name: metrics
              containerPort: {{ $v.agent.port }}
              protocol: TCP
          # ready once an energy source reads (503 naming every source's error until then);
          # alive as long as the HTTP server answers
          readinessProbe:
            httpGet:
              path: /readyz
              port: metrics
            periodSeconds: 10
          livenessProbe:
            httpGet:
              path: /healthz
              port: metrics
            initialDelaySeconds: 10
            periodSeconds: 30
            failureThreshold: 4
          {{- with (ternary $v.gpu.resources $v.agent.resources $gpu) }}
          resources:
            {{- toYaml . | nindent 12 }}
          {{- end }}
          securityContext:
            privileged: false
            allowPrivilegeEscalation: false
            readOnlyRootFilesystem: true
            capabilities:
              drop: ["ALL"]
          volumeMounts:
            # /sys/class/powercap holds symlinks into /sys/devices/virtual/powercap: both are
            # mounted, at the same relative places, so that the links resolve inside the container.
            - name: powercap
              mountPath: /host/sys/class/powercap
              readOnly: true
            - name: powercap-devices
              mountPath: /host/sys/devices/virtual/powercap
              readOnly: true
            - name: cgroup
              mountPath: /host/sys/fs/cgroup
              readOnly: true
            - name: proc
              mountPath: /host/proc
              readOnly: true
            - name: config
              mountPath: /etc/joulesched
              readOnly: true
            - name: tmp
              mountPath: /tmp
            - name: state
              mountPath: /var/lib/joulesched
      volumes:
        - name: powercap
          hostPath:
            path: /sys/class/powercap
        - name: powercap-devices
          hostPath:
            path: /sys/devices/virtual/powercap
        - name: cgroup
          hostPath:
            path: /sys/fs/cgroup
            type: Directory
        - name: proc
          hostPath:
            path: /proc
            type: Directory
        - name: config
          configMap:
            name: joulesched-agent
        - name: tmp
          emptyDir:
            sizeLimit: 16Mi
        # server.state_dir: windows kept across agent restarts and pod re-creations on this node
        - name: state
          hostPath:
            path: /var/lib/joulesched/{{ .name }}
            type: DirectoryOrCreate
{{- end -}}
