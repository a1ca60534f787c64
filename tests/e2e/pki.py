"""Certificates for the e2e control plane (``openssl`` CLI, EC P-256) and client kubeconfigs."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import yaml
from processes import _run

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
