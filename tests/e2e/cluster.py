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
"""

from __future__ import annotations

import atexit
import copy
import ctypes
import json
import os
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from joulesched.contracts.net import free_port

REPO_ROOT = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO_ROOT / "hack" / "build-k8s.sh"

SCHEDULER_CONFIG_API_VERSION = "kubescheduler.config.k8s.io/v1"
PAUSE_IMAGE = "registry.k8s.io/pause:3.10"
NOT_READY_TAINT_KEY = "node.kubernetes.io/not-ready"
GPU_RESOURCE = "nvidia.com/gpu"


class ClusterError(RuntimeError):
    """A control-plane component failed to start or misbehaved."""


# --------------------------------------------------------------------------
# process bookkeeping
# --------------------------------------------------------------------------

_LIVE: dict[int, ManagedProcess] = {}
_LIVE_LOCK = threading.Lock()


def _pdeathsig() -> None:  # runs in the child between fork and exec
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:
        pass


def _stop_all_live() -> None:
    with _LIVE_LOCK:
        procs = list(_LIVE.values())
    for p in procs:
        p.stop(timeout=5)


atexit.register(_stop_all_live)


def live_pids() -> list[int]:
    """PIDs of harness-started processes that have not been stopped yet."""
    with _LIVE_LOCK:
        return [pid for pid, p in _LIVE.items() if p.running]


def pid_alive(pid: int) -> bool:
    """True if a process with this PID exists (and is not a zombie)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


class ManagedProcess:
    """A child process with its output in a log file, stopped by PID."""

    def __init__(self, name: str, argv: Sequence[str], log_path: Path,
                 env: Mapping[str, str] | None = None, cwd: Path | None = None):
        self.name = name
        self.argv = [str(a) for a in argv]
        self.log_path = Path(log_path)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "ab", buffering=0)
        self._log.write(("$ " + " ".join(self.argv) + "\n").encode())
        preexec = _pdeathsig if sys.platform.startswith("linux") else None
        self.popen = subprocess.Popen(
            self.argv, stdin=subprocess.DEVNULL, stdout=self._log,
            stderr=subprocess.STDOUT, env=dict(env) if env is not None else None,
            cwd=str(cwd) if cwd else None, start_new_session=True,
            preexec_fn=preexec)
        self.pid = self.popen.pid
        with _LIVE_LOCK:
            _LIVE[self.pid] = self

    @property
    def running(self) -> bool:
        return self.popen.poll() is None

    @property
    def returncode(self) -> int | None:
        return self.popen.poll()

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    def stop(self, timeout: float = 10) -> None:
        """SIGTERM the PID, SIGKILL after ``timeout``; reaps it. Idempotent."""
        if self.popen.poll() is None:
            try:
                os.kill(self.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.popen.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                try:
                    os.kill(self.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.popen.wait(timeout=10)
        with _LIVE_LOCK:
            _LIVE.pop(self.pid, None)
        if not self._log.closed:
            self._log.close()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name} pid={self.pid} running={self.running}>"


# --------------------------------------------------------------------------
# small helpers
# --------------------------------------------------------------------------

def find_go() -> str | None:
    """The go binary: $GO, `go` on PATH, or /usr/local/go/bin/go."""
    cand = os.environ.get("GO")
    if cand and os.access(cand, os.X_OK):
        return cand
    cand = shutil.which("go")
    if cand:
        return cand
    if os.access("/usr/local/go/bin/go", os.X_OK):
        return "/usr/local/go/bin/go"
    return None


def build_k8s(timeout: float = 3600) -> Path:
    """Run hack/build-k8s.sh (cache hit: instant) and return the bin dir.

    Build progress is streamed to our stderr. Raises ClusterError on failure.
    """
    env = dict(os.environ)
    go = find_go()
    if go:
        env["GO"] = go
    proc = subprocess.run(["bash", str(BUILD_SCRIPT)], stdout=subprocess.PIPE,
                          stderr=None, env=env, timeout=timeout, text=True)
    if proc.returncode != 0:
        raise ClusterError(f"{BUILD_SCRIPT} failed with exit code {proc.returncode}")
    lines = [ln for ln in proc.stdout.splitlines() if ln.strip()]
    if not lines:
        raise ClusterError(f"{BUILD_SCRIPT} printed no bin directory")
    return Path(lines[-1].strip())


def _run(argv: Sequence[str], cwd: Path) -> None:
    proc = subprocess.run([str(a) for a in argv], cwd=str(cwd),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if proc.returncode != 0:
        raise ClusterError(f"command failed: {' '.join(map(str, argv))}\n{proc.stdout}")


def _wait_until(pred, timeout: float, interval: float = 0.1, what: str = "condition",
                proc: ManagedProcess | None = None):
    deadline = time.monotonic() + timeout
    last_exc: BaseException | None = None
    while True:
        if proc is not None and not proc.running:
            raise ClusterError(
                f"{proc.name} exited with code {proc.returncode} while waiting for {what}; "
                f"log {proc.log_path}:\n{proc.log_tail()}")
        try:
            val = pred()
            if val:
                return val
        except Exception as exc:
            last_exc = exc
        if time.monotonic() >= deadline:
            msg = f"timed out after {timeout}s waiting for {what}"
            if last_exc is not None:
                msg += f" (last error: {last_exc!r})"
            if proc is not None:
                msg += f"; log {proc.log_path}:\n{proc.log_tail()}"
            raise ClusterError(msg)
        time.sleep(interval)


# --------------------------------------------------------------------------
# PKI (openssl CLI)
# --------------------------------------------------------------------------

@dataclass
class PKI:
    dir: Path
    ca_crt: Path
    ca_key: Path
    apiserver_crt: Path
    apiserver_key: Path
    sa_key: Path
    sa_pub: Path
    openssl: str = "openssl"

    @classmethod
    def generate(cls, directory: Path, openssl: str = "openssl") -> PKI:
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        pki = cls(dir=d, ca_crt=d / "ca.crt", ca_key=d / "ca.key",
                  apiserver_crt=d / "apiserver.crt", apiserver_key=d / "apiserver.key",
                  sa_key=d / "sa.key", sa_pub=d / "sa.pub", openssl=openssl)
        o = openssl
        pki._make_ca(pki.ca_crt, pki.ca_key, "joulesched-e2e-ca")
        # front-proxy (requestheader) CA + client cert, as kubeadm sets up; keeps
        # kube-scheduler's delegated authn from logging errors about a missing
        # requestheader CA bundle.
        pki._make_ca(d / "front-proxy-ca.crt", d / "front-proxy-ca.key",
                     "joulesched-e2e-front-proxy-ca")
        pki.sign("front-proxy-client", "/CN=front-proxy-client",
                 ca=(d / "front-proxy-ca.crt", d / "front-proxy-ca.key"))
        pki.sign("apiserver", "/CN=kube-apiserver", server=True,
                 sans=["IP:127.0.0.1", "IP:10.0.0.1", "DNS:localhost", "DNS:kubernetes",
                       "DNS:kubernetes.default", "DNS:kubernetes.default.svc",
                       "DNS:kubernetes.default.svc.cluster.local"])
        # service-account token signing key pair
        _run([o, "genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256",
              "-out", pki.sa_key], d)
        _run([o, "pkey", "-in", pki.sa_key, "-pubout", "-out", pki.sa_pub], d)
        return pki

    def _make_ca(self, crt: Path, key: Path, cn: str) -> None:
        o = self.openssl
        _run([o, "genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256",
              "-out", key], self.dir)
        _run([o, "req", "-x509", "-new", "-key", key, "-sha256", "-days", "3650",
              "-subj", f"/CN={cn}", "-out", crt,
              "-addext", "basicConstraints=critical,CA:TRUE",
              "-addext", "keyUsage=critical,keyCertSign,cRLSign,digitalSignature"], self.dir)

    @property
    def front_proxy_ca_crt(self) -> Path:
        return self.dir / "front-proxy-ca.crt"

    def sign(self, name: str, subject: str, *, server: bool = False,
             sans: Iterable[str] = (), ca: tuple[Path, Path] | None = None
             ) -> tuple[Path, Path]:
        """Issue ``<name>.crt``/``<name>.key`` signed by the CA (default: the
        cluster CA). Returns (crt, key)."""
        d, o = self.dir, self.openssl
        ca_crt, ca_key = ca or (self.ca_crt, self.ca_key)
        key, csr, crt, ext = (d / f"{name}.key", d / f"{name}.csr",
                              d / f"{name}.crt", d / f"{name}.ext")
        _run([o, "genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256",
              "-out", key], d)
        _run([o, "req", "-new", "-key", key, "-subj", subject, "-out", csr], d)
        lines = ["basicConstraints=critical,CA:FALSE",
                 "keyUsage=critical,digitalSignature",
                 f"extendedKeyUsage={'serverAuth' if server else 'clientAuth'}"]
        sans = list(sans)
        if sans:
            lines.append("subjectAltName=" + ",".join(sans))
        ext.write_text("\n".join(lines) + "\n")
        _run([o, "x509", "-req", "-in", csr, "-CA", ca_crt, "-CAkey", ca_key,
              "-CAcreateserial", "-sha256", "-days", "365", "-extfile", ext, "-out", crt], d)
        return crt, key

    def client(self, name: str, user: str, groups: Iterable[str] = ()) -> tuple[Path, Path]:
        subject = "".join(f"/O={g}" for g in groups) + f"/CN={user}"
        return self.sign(name, subject)


def write_kubeconfig(path: Path, server: str, ca: Path, crt: Path, key: Path,
                     user: str = "user") -> Path:
    cfg = {
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "e2e", "cluster": {"server": server,
                                                 "certificate-authority": str(ca)}}],
        "users": [{"name": user, "user": {"client-certificate": str(crt),
                                          "client-key": str(key)}}],
        "contexts": [{"name": "e2e", "context": {"cluster": "e2e", "user": user}}],
        "current-context": "e2e",
    }
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


# --------------------------------------------------------------------------
# kube-scheduler
# --------------------------------------------------------------------------

def scheduler_config(config: str | Mapping[str, Any] | None, kubeconfig: Path,
                     leader_election: bool = False) -> dict:
    """Normalise a KubeSchedulerConfiguration (YAML text or dict).

    Fills in apiVersion/kind, ``clientConnection.kubeconfig`` (if absent) and
    forces ``leaderElection.leaderElect: false`` -- unless ``leader_election``,
    which keeps the config's own ``leaderElection`` section as it is (to run a
    manifest's config unchanged, e.g. deploy/scheduler/scheduler-config.yaml).
    """
    if config is None:
        cfg: dict = {}
    elif isinstance(config, str):
        cfg = yaml.safe_load(config) or {}
    else:
        cfg = copy.deepcopy(dict(config))
    cfg.setdefault("apiVersion", SCHEDULER_CONFIG_API_VERSION)
    cfg.setdefault("kind", "KubeSchedulerConfiguration")
    cc = cfg.setdefault("clientConnection", {}) or {}
    cfg["clientConnection"] = cc
    cc.setdefault("kubeconfig", str(kubeconfig))
    if not leader_election:
        le = cfg.setdefault("leaderElection", {}) or {}
        cfg["leaderElection"] = le
        le["leaderElect"] = False
    return cfg


class SchedulerProcess(ManagedProcess):
    """A running kube-scheduler. ``.config`` is the effective config dict."""

    def __init__(self, name: str, argv: Sequence[str], log_path: Path,
                 config: dict, config_path: Path, port: int):
        super().__init__(name, argv, log_path)
        self.config = config
        self.config_path = config_path
        self.port = port

    @property
    def scheduler_names(self) -> list[str]:
        return [p.get("schedulerName", "default-scheduler")
                for p in (self.config.get("profiles") or [{}])]

    def healthz(self, path: str = "/readyz") -> tuple[int, str]:
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        try:
            with urllib.request.urlopen(f"https://127.0.0.1:{self.port}{path}",
                                        context=ctx, timeout=2) as r:
                return r.status, r.read().decode(errors="replace")
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode(errors="replace")

    def wait_ready(self, timeout: float = 30) -> None:
        _wait_until(lambda: self.healthz("/readyz")[0] == 200, timeout,
                    what=f"{self.name} /readyz", proc=self, interval=0.2)


# --------------------------------------------------------------------------
# the control plane
# --------------------------------------------------------------------------

@dataclass
class ControlPlane:
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

    # ---- objects -----------------------------------------------------------

    def ensure_service_account(self, namespace: str, name: str = "default") -> None:
        from kubernetes.client.rest import ApiException
        try:
            self.core.create_namespaced_service_account(
                namespace, {"metadata": {"name": name}})
        except ApiException as e:
            if e.status != 409:
                raise

    def create_namespace(self, name: str, labels: Mapping[str, str] | None = None) -> str:
        """Create a namespace (with its `default` ServiceAccount). Idempotent."""
        from kubernetes.client.rest import ApiException
        try:
            self.core.create_namespace({"metadata": {"name": name,
                                                     "labels": dict(labels or {})}})
        except ApiException as e:
            if e.status != 409:
                raise
        self.ensure_service_account(name)
        return name

    def create_node(self, name: str, *, cpu: str | int = "4", memory: str = "8Gi",
                    pods: int = 110, gpus: int | None = None,
                    labels: Mapping[str, str] | None = None,
                    annotations: Mapping[str, str] | None = None,
                    taints: Sequence[Mapping[str, Any]] = (),
                    extra_resources: Mapping[str, str] | None = None,
                    allocatable: Mapping[str, str] | None = None,
                    ready: bool = True):
        """Create a Node that the scheduler considers usable.

        capacity = cpu/memory/pods (+ ``nvidia.com/gpu`` if ``gpus``, +
        ``extra_resources``); allocatable = capacity unless overridden per
        resource by ``allocatable``. The ``node.kubernetes.io/not-ready``
        taint that the apiserver's admission adds on create is removed (the
        spec's taints become exactly ``taints``) and the Ready condition is set
        through the status subresource. Returns the V1Node.
        """
        capacity = {"cpu": str(cpu), "memory": str(memory), "pods": str(pods),
                    "ephemeral-storage": "100Gi"}
        if gpus is not None:
            capacity[GPU_RESOURCE] = str(gpus)
        capacity.update({k: str(v) for k, v in (extra_resources or {}).items()})
        alloc = dict(capacity)
        alloc.update({k: str(v) for k, v in (allocatable or {}).items()})
        base_labels = {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                       "kubernetes.io/arch": "amd64"}
        base_labels.update(labels or {})
        self.core.create_node({"metadata": {"name": name, "labels": base_labels,
                                            "annotations": dict(annotations or {})},
                               "spec": {"taints": [dict(t) for t in taints]}})
        # TaintNodesByCondition admission adds not-ready:NoSchedule on create.
        self.core.patch_node(name, {"spec": {"taints": [dict(t) for t in taints] or None}})
        return self.set_node_status(name, capacity=capacity, allocatable=alloc, ready=ready)

    def set_node_status(self, name: str, *, capacity: Mapping[str, str] | None = None,
                        allocatable: Mapping[str, str] | None = None, ready: bool = True):
        """Patch a node's status (capacity/allocatable/Ready condition)."""
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        status: dict[str, Any] = {
            "conditions": [{
                "type": "Ready", "status": "True" if ready else "False",
                "reason": "KubeletReady" if ready else "KubeletNotReady",
                "message": "joulesched e2e fake node",
                "lastHeartbeatTime": now, "lastTransitionTime": now}],
            "nodeInfo": {"architecture": "amd64", "operatingSystem": "linux",
                         "kubeletVersion": "v0.0.0-e2e", "kubeProxyVersion": "",
                         "bootID": "", "containerRuntimeVersion": "", "kernelVersion": "",
                         "machineID": "", "osImage": "", "systemUUID": ""},
            "addresses": [{"type": "Hostname", "address": name},
                          {"type": "InternalIP", "address": "127.0.0.1"}],
        }
        if capacity is not None:
            status["capacity"] = dict(capacity)
        if allocatable is not None:
            status["allocatable"] = dict(allocatable)
        return self.core.patch_node_status(name, {"status": status})

    def delete_node(self, name: str) -> None:
        from kubernetes.client.rest import ApiException
        try:
            self.core.delete_node(name)
        except ApiException as e:
            if e.status != 404:
                raise

    def create_pod(self, name: str, namespace: str = "default", *,
                   scheduler_name: str | None = None, cpu: str | None = None,
                   memory: str | None = None, gpus: int | None = None,
                   limits: Mapping[str, str] | None = None,
                   extra_requests: Mapping[str, str] | None = None,
                   labels: Mapping[str, str] | None = None,
                   annotations: Mapping[str, str] | None = None,
                   node_selector: Mapping[str, str] | None = None,
                   tolerations: Sequence[Mapping[str, Any]] = (),
                   priority_class_name: str | None = None,
                   spec_overrides: Mapping[str, Any] | None = None):
        """Create a single-container (pause image) pod. Returns the V1Pod.

        Requests: ``cpu``/``memory``/``gpus`` (nvidia.com/gpu, also set as a
        limit, as extended resources require) + ``extra_requests``.
        ``spec_overrides`` is shallow-merged into the pod spec.
        """
        requests: dict[str, str] = {}
        lim: dict[str, str] = dict(limits or {})
        if cpu is not None:
            requests["cpu"] = str(cpu)
        if memory is not None:
            requests["memory"] = str(memory)
        if gpus is not None:
            requests[GPU_RESOURCE] = str(gpus)
            lim[GPU_RESOURCE] = str(gpus)
        requests.update({k: str(v) for k, v in (extra_requests or {}).items()})
        container: dict[str, Any] = {"name": "main", "image": PAUSE_IMAGE}
        if requests or lim:
            container["resources"] = {}
            if requests:
                container["resources"]["requests"] = requests
            if lim:
                container["resources"]["limits"] = lim
        spec: dict[str, Any] = {"containers": [container],
                                "terminationGracePeriodSeconds": 0,
                                "automountServiceAccountToken": False}
        if scheduler_name:
            spec["schedulerName"] = scheduler_name
        if node_selector:
            spec["nodeSelector"] = dict(node_selector)
        if tolerations:
            spec["tolerations"] = [dict(t) for t in tolerations]
        if priority_class_name:
            spec["priorityClassName"] = priority_class_name
        spec.update(spec_overrides or {})
        body = {"metadata": {"name": name, "namespace": namespace,
                             "labels": dict(labels or {}),
                             "annotations": dict(annotations or {})},
                "spec": spec}
        return self.core.create_namespaced_pod(namespace, body)

    def delete_pod(self, name: str, namespace: str = "default") -> None:
        """Force-delete (grace 0: there is no kubelet to confirm)."""
        from kubernetes.client.rest import ApiException
        try:
            self.core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)
        except ApiException as e:
            if e.status != 404:
                raise

    def delete_all_pods(self, namespace: str) -> None:
        for p in self.core.list_namespaced_pod(namespace).items:
            self.delete_pod(p.metadata.name, namespace)

    def pod_node(self, name: str, namespace: str = "default") -> str | None:
        return self.core.read_namespaced_pod(name, namespace).spec.node_name

    def wait_for_pod_scheduled(self, name: str, namespace: str = "default",
                               timeout: float = 30) -> str:
        """Wait until the pod is bound; returns ``spec.nodeName``."""
        return _wait_until(lambda: self.pod_node(name, namespace), timeout,
                           what=f"pod {namespace}/{name} to be bound")

    def pod_events(self, name: str, namespace: str = "default",
                   reason: str | None = None) -> list:
        """core/v1 Events whose involvedObject is this pod (oldest first)."""
        sel = f"involvedObject.name={name},involvedObject.kind=Pod"
        if reason:
            sel += f",reason={reason}"
        evs = self.core.list_namespaced_event(namespace, field_selector=sel).items
        return sorted(evs, key=lambda e: (e.last_timestamp or e.event_time
                                          or e.metadata.creation_timestamp))

    def wait_for_failed_scheduling(self, name: str, namespace: str = "default",
                                   timeout: float = 30):
        """Wait for a ``FailedScheduling`` event on the pod; returns the V1Event
        (its ``.message`` explains why, e.g. ``0/3 nodes are available: ...``)."""
        return _wait_until(
            lambda: (self.pod_events(name, namespace, "FailedScheduling") or [None])[-1],
            timeout, what=f"FailedScheduling event for pod {namespace}/{name}", interval=0.2)

    def wait_for_pod_outcome(self, name: str, namespace: str = "default",
                             timeout: float = 30) -> tuple[str | None, Any]:
        """Wait until the pod is bound or has a FailedScheduling event.

        Returns ``(node_name, None)`` or ``(None, event)``.
        """
        def probe():
            node = self.pod_node(name, namespace)
            if node:
                return (node, None)
            evs = self.pod_events(name, namespace, "FailedScheduling")
            return (None, evs[-1]) if evs else None
        return _wait_until(probe, timeout, what=f"pod {namespace}/{name} outcome",
                           interval=0.2)


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            body = r.read()
            if r.status != 200:
                return False
            try:
                return json.loads(body).get("health") in ("true", True)
            except ValueError:
                return True
    except (urllib.error.URLError, OSError):
        return False
