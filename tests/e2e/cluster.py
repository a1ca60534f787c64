"""A real Kubernetes control plane on loopback for end-to-end tests.

Starts etcd, kube-apiserver and any number of kube-scheduler processes (no
kubelet, no kube-controller-manager) on 127.0.0.1, with freshly generated
certificates (``openssl`` CLI) and an admin kubeconfig. Nodes are plain API
objects made Ready/untainted by hand, so pods get *bound* (``spec.nodeName``)
but never run.

Typical use (see conftest.py for the pytest fixtures)::

    cp = ControlPlane(bin_dir, workdir)
    cp.start()
    cp.create_node("n1", cpu="8", memory="32Gi", gpus=2, labels={...})
    sched = cp.start_scheduler({"profiles": [{"schedulerName": "joule"}],
                                "extenders": [...]}, name="joule", verbosity=4)
    cp.create_pod("p1", scheduler_name="joule", cpu="1", memory="1Gi")
    node = cp.wait_for_pod_scheduled("p1")
    sched.stop(); cp.stop()

Every process is started in its own session, tracked by PID, and stopped by
PID in ``stop()``; an ``atexit`` hook (and PR_SET_PDEATHSIG on Linux) makes
sure nothing outlives the Python process. Only third-party dependency: the
``kubernetes`` Python client (and PyYAML, which it depends on).

The parts: ``processes`` (child processes, waiting, free ports), ``binaries`` (building the
Kubernetes binaries), ``pki`` (certificates, kubeconfigs), ``kube_scheduler`` (its config and
process), ``objects`` (namespaces, nodes, pods) and, here, the control plane itself (etcd,
kube-apiserver, kubectl, the Python client, schedulers).
"""

from __future__ import annotations

import os
import shutil
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from kube_scheduler import SchedulerProcess, scheduler_config
from objects import ApiObjects
from pki import PKI, write_kubeconfig
from processes import ClusterError, ManagedProcess, _http_ok, _wait_until

from joulesched.contracts.net import free_port

# --------------------------------------------------------------------------
# the control plane
# --------------------------------------------------------------------------

@dataclass
class ControlPlane(ApiObjects):
    """etcd + kube-apiserver on loopback, plus helpers.

    ``bin_dir`` holds kube-apiserver, kube-scheduler and kubectl (see
    hack/build-k8s.sh). ``workdir`` receives certs, kubeconfigs, etcd data and
    every process's log (``<workdir>/logs/*.log``); a temp dir if None.
    """

    bin_dir: Path
    workdir: Path | None = None
    etcd_bin: str = field(default_factory=lambda: os.environ.get("JOULESCHED_ETCD", "etcd"))
    openssl: str = "openssl"
    apiserver_extra_args: Sequence[str] = ()
    apiserver_verbosity: int = 1

    # set by start()
    pki: PKI | None = field(default=None, init=False)
    etcd: ManagedProcess | None = field(default=None, init=False)
    apiserver: ManagedProcess | None = field(default=None, init=False)
    schedulers: list[SchedulerProcess] = field(default_factory=list, init=False)
    server: str = field(default="", init=False)
    kubeconfig: Path | None = field(default=None, init=False)            # system:masters
    scheduler_kubeconfig: Path | None = field(default=None, init=False)  # system:kube-scheduler
    startup_seconds: float = field(default=0.0, init=False)
    _api_client: Any = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self.bin_dir = Path(self.bin_dir)
        if self.workdir is None:
            self.workdir = Path(tempfile.mkdtemp(prefix="joulesched-e2e-"))
        self.workdir = Path(self.workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.log_dir = self.workdir / "logs"
        self.log_dir.mkdir(exist_ok=True)

    # ---- lifecycle ---------------------------------------------------------

    def binary(self, name: str) -> Path:
        p = self.bin_dir / name
        if not os.access(p, os.X_OK):
            raise ClusterError(f"missing binary {p}")
        return p

    def start(self, timeout: float = 60) -> ControlPlane:
        t0 = time.monotonic()
        try:
            self._start(timeout)
        except BaseException:
            self.stop()
            raise
        self.startup_seconds = time.monotonic() - t0
        return self

    def _start(self, timeout: float) -> None:
        etcd = shutil.which(self.etcd_bin) or self.etcd_bin
        if not os.access(etcd, os.X_OK):
            raise ClusterError(f"etcd binary not found: {self.etcd_bin}")
        if not shutil.which(self.openssl):
            raise ClusterError(f"openssl not found: {self.openssl}")
        apiserver_bin = self.binary("kube-apiserver")
        self.binary("kube-scheduler")

        self.pki = PKI.generate(self.workdir / "pki", self.openssl)

        # etcd
        client_port, peer_port = free_port(), free_port()
        client_url = f"http://127.0.0.1:{client_port}"
        peer_url = f"http://127.0.0.1:{peer_port}"
        self.etcd_url = client_url
        self.etcd = ManagedProcess("etcd", [
            etcd, "--name", "e2e", "--data-dir", self.workdir / "etcd",
            "--listen-client-urls", client_url, "--advertise-client-urls", client_url,
            "--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url,
            "--initial-cluster", f"e2e={peer_url}", "--initial-cluster-state", "new",
            "--log-level", "warn", "--logger", "zap",
        ], self.log_dir / "etcd.log")
        _wait_until(lambda: _http_ok(f"{client_url}/health"), timeout,
                    what="etcd /health", proc=self.etcd)

        # kube-apiserver
        port = free_port()
        self.server = f"https://127.0.0.1:{port}"
        pki = self.pki
        self.apiserver = ManagedProcess("kube-apiserver", [
            apiserver_bin,
            f"--etcd-servers={client_url}",
            f"--secure-port={port}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            "--endpoint-reconciler-type=none",
            "--service-cluster-ip-range=10.0.0.0/24",
            "--authorization-mode=Node,RBAC",
            f"--client-ca-file={pki.ca_crt}",
            f"--tls-cert-file={pki.apiserver_crt}",
            f"--tls-private-key-file={pki.apiserver_key}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={pki.sa_pub}",
            f"--service-account-signing-key-file={pki.sa_key}",
            f"--requestheader-client-ca-file={pki.front_proxy_ca_crt}",
            "--requestheader-allowed-names=front-proxy-client",
            "--requestheader-username-headers=X-Remote-User",
            "--requestheader-group-headers=X-Remote-Group",
            "--requestheader-extra-headers-prefix=X-Remote-Extra-",
            f"--proxy-client-cert-file={pki.dir / 'front-proxy-client.crt'}",
            f"--proxy-client-key-file={pki.dir / 'front-proxy-client.key'}",
            "--profiling=false",
            f"--v={self.apiserver_verbosity}",
            *self.apiserver_extra_args,
        ], self.log_dir / "kube-apiserver.log")

        admin_crt, admin_key = pki.client("admin", "kubernetes-admin", ["system:masters"])
        self.kubeconfig = write_kubeconfig(self.workdir / "admin.kubeconfig", self.server,
                                           pki.ca_crt, admin_crt, admin_key, "admin")
        s_crt, s_key = pki.client("scheduler", "system:kube-scheduler")
        self.scheduler_kubeconfig = write_kubeconfig(
            self.workdir / "scheduler.kubeconfig", self.server, pki.ca_crt, s_crt, s_key,
            "system:kube-scheduler")
        self._admin_cert = (admin_crt, admin_key)

        _wait_until(lambda: self.readyz()[0] == 200, timeout, what="kube-apiserver /readyz",
                    proc=self.apiserver, interval=0.2)
        # Without kube-controller-manager nobody creates the `default`
        # ServiceAccount, and the ServiceAccount admission plugin would reject
        # every pod in the namespace. Create it ourselves.
        self.ensure_service_account("default")

    def stop(self) -> None:
        """Stop every scheduler, the apiserver and etcd (by PID). Idempotent."""
        for s in list(self.schedulers):
            s.stop()
        self.schedulers.clear()
        if self.apiserver is not None:
            self.apiserver.stop()
        if self.etcd is not None:
            self.etcd.stop()
        if self._api_client is not None:
            try:
                self._api_client.close()
            except Exception:
                pass
            self._api_client = None

    def pids(self) -> list[int]:
        """PIDs of all processes this control plane started (running or not)."""
        procs = [self.etcd, self.apiserver, *self.schedulers]
        return [p.pid for p in procs if p is not None]

    def __enter__(self) -> ControlPlane:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # ---- raw access --------------------------------------------------------

    def ssl_context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.pki.ca_crt))
        ctx.load_cert_chain(str(self._admin_cert[0]), str(self._admin_cert[1]))
        return ctx

    def readyz(self, verbose: bool = False) -> tuple[int, str]:
        url = f"{self.server}/readyz" + ("?verbose" if verbose else "")
        try:
            with urllib.request.urlopen(url, context=self.ssl_context(), timeout=3) as r:
                return r.status, r.read().decode(errors="replace")
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode(errors="replace")

    def kubectl(self, *args: str, input: str | None = None, check: bool = True,
                kubeconfig: Path | None = None, timeout: float = 60
                ) -> subprocess.CompletedProcess:
        """Run the built kubectl against this cluster (admin by default)."""
        argv = [str(self.binary("kubectl")), f"--kubeconfig={kubeconfig or self.kubeconfig}",
                *map(str, args)]
        proc = subprocess.run(argv, input=input, text=True, capture_output=True,
                              timeout=timeout)
        if check and proc.returncode != 0:
            raise ClusterError(f"kubectl {' '.join(args)} failed ({proc.returncode}):\n"
                               f"{proc.stdout}\n{proc.stderr}")
        return proc

    def client_kubeconfig(self, user: str, groups: Iterable[str] = (),
                          name: str | None = None) -> Path:
        """A kubeconfig for an arbitrary user/groups (client cert), for RBAC tests."""
        name = name or user.replace(":", "_").replace("/", "_")
        crt, key = self.pki.client(name, user, groups)
        return write_kubeconfig(self.workdir / f"{name}.kubeconfig", self.server,
                                self.pki.ca_crt, crt, key, user)

    def service_account_kubeconfig(self, namespace: str, name: str,
                                   duration: str = "1h") -> Path:
        """A kubeconfig that authenticates as ServiceAccount ``namespace/name``
        with a bound token from the TokenRequest API (``kubectl create token``;
        no controller-manager needed). For running a component with the RBAC
        that a manifest grants its ServiceAccount."""
        token = self.kubectl("create", "token", name, "-n", namespace,
                             f"--duration={duration}").stdout.strip()
        user = f"system:serviceaccount:{namespace}:{name}"
        cfg = {
            "apiVersion": "v1", "kind": "Config",
            "clusters": [{"name": "e2e", "cluster": {
                "server": self.server, "certificate-authority": str(self.pki.ca_crt)}}],
            "users": [{"name": user, "user": {"token": token}}],
            "contexts": [{"name": "e2e", "context": {"cluster": "e2e", "user": user}}],
            "current-context": "e2e",
        }
        path = self.workdir / f"sa-{namespace}-{name}.kubeconfig"
        path.write_text(yaml.safe_dump(cfg, sort_keys=False))
        path.chmod(0o600)
        return path

    # ---- kubernetes python client -----------------------------------------

    @property
    def api_client(self):
        """A ``kubernetes.client.ApiClient`` using the admin kubeconfig."""
        if self._api_client is None:
            from kubernetes import config as kconfig
            self._api_client = kconfig.new_client_from_config(config_file=str(self.kubeconfig))
        return self._api_client

    @property
    def core(self):
        from kubernetes import client
        return client.CoreV1Api(self.api_client)

    # ---- schedulers --------------------------------------------------------

    def start_scheduler(self, config: str | Mapping[str, Any] | None = None, *,
                        name: str | None = None, verbosity: int = 2,
                        extra_args: Sequence[str] = (), kubeconfig: Path | None = None,
                        leader_election: bool = False,
                        wait: bool = True, timeout: float = 30) -> SchedulerProcess:
        """Start a kube-scheduler with the given KubeSchedulerConfiguration.

        ``config`` is YAML text or a dict holding at least what you care about
        (``profiles``, ``extenders``, ...); apiVersion/kind,
        ``clientConnection.kubeconfig`` (default: the ``system:kube-scheduler``
        kubeconfig) and ``leaderElection.leaderElect=false`` are filled in.
        Serves /healthz on 127.0.0.1:<free port>. Logs go to
        ``<workdir>/logs/scheduler-<name>.log``. With ``wait`` it returns once
        /readyz is 200 (informers synced). ``leader_election=True`` keeps the
        config's ``leaderElection`` section instead of forcing it off.
        """
        cfg = scheduler_config(config, kubeconfig or self.scheduler_kubeconfig,
                               leader_election)
        if name is None:
            first = (cfg.get("profiles") or [{}])[0].get("schedulerName", "default-scheduler")
            name = f"{first}-{len(self.schedulers)}"
        cfg_path = self.workdir / f"scheduler-{name}.yaml"
        cfg_path.write_text(yaml.safe_dump(cfg, sort_keys=False))
        port = free_port()
        kc = cfg["clientConnection"]["kubeconfig"]
        argv = [self.binary("kube-scheduler"), f"--config={cfg_path}",
                f"--secure-port={port}", "--bind-address=127.0.0.1",
                f"--authentication-kubeconfig={kc}", f"--authorization-kubeconfig={kc}",
                f"--v={verbosity}", *extra_args]
        proc = SchedulerProcess(f"kube-scheduler[{name}]", argv,
                                self.log_dir / f"scheduler-{name}.log", cfg, cfg_path, port)
        self.schedulers.append(proc)
        if wait:
            try:
                proc.wait_ready(timeout)
            except BaseException:
                self.stop_scheduler(proc)
                raise
        return proc

    def stop_scheduler(self, proc: SchedulerProcess) -> None:
        proc.stop()
        if proc in self.schedulers:
            self.schedulers.remove(proc)
