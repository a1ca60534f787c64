"""Mutual TLS between the real kube-scheduler and the extender (``server.tls``).

kube-scheduler's ``Extender`` (kubescheduler.config.k8s.io/v1) can present a client
certificate (``tlsConfig.certFile``/``keyFile``, with ``enableHTTPS``) and sends no custom
header, so the extender's shared secret is that certificate: a scheduler with one is
answered, a scheduler without one is refused (403, counted) and, the extender being
``ignorable``, schedules without it.
"""

from __future__ import annotations

import ssl
import uuid

from e2e_extender import (
    EFFICIENT_CURVE,
    INEFFICIENT_CURVE,
    deploy_extender_config,
    energy_scheduler_config,
    node_profile,
    wait_all_bound,
)


def test_kube_scheduler_with_a_client_certificate_is_served_and_without_is_refused(
        control_plane, node_factory, scheduler_factory, extender_factory, e2e_namespace):
    cp, ns, tag = control_plane, e2e_namespace, uuid.uuid4().hex[:6]
    sel = {"e2e-test": f"tls-{tag}"}
    eff, ineff = f"eff-{tag}", f"ineff-{tag}"
    node_factory(eff, cpu="64", memory="128Gi", labels=sel)
    node_factory(ineff, cpu="80", memory="512Gi", labels=sel)
    profiles = {"sites": {"dc": {"pue": 1.2, "carbon_intensity": 300}}, "nodes": [
        node_profile(eff, EFFICIENT_CURVE, 64, site="dc", utilisation=0.3),
        node_profile(ineff, INEFFICIENT_CURVE, 80, site="dc", utilisation=0.3)]}
    pki = cp.pki
    server_crt, server_key = pki.sign(f"extender-{tag}", "/CN=joulesched-extender", server=True,
                                      sans=["IP:127.0.0.1"])
    client_crt, client_key = pki.client(f"scheduler-{tag}", "joulesched-scheduler")
    config = deploy_extender_config(cp.kubeconfig)
    config["server"] = {**config["server"], "tls": {
        "cert_file": str(server_crt), "key_file": str(server_key), "client_ca_file": str(pki.ca_crt)}}
    probe = ssl.create_default_context(cafile=str(pki.ca_crt))  # as the kubelet: no certificate
    ext = extender_factory(profiles, config, tls=probe)
    assert ext.url.startswith("https://")

    with_cert = f"mtls-{tag}"
    scheduler_factory(energy_scheduler_config(with_cert, ext.url, enableHTTPS=True, tlsConfig={
        "certFile": str(client_crt), "keyFile": str(client_key), "caFile": str(pki.ca_crt)}),
        name=with_cert)
    cp.create_pod("served", ns, scheduler_name=with_cert, cpu="4", memory="1Gi", node_selector=sel)
    placed = wait_all_bound(cp, ns, ["served"], timeout=60)
    assert placed["served"] == eff
    assert ext.requests("filter", "200") >= 1 and ext.requests("prioritize", "200") >= 1

    without = f"nocert-{tag}"
    scheduler_factory(energy_scheduler_config(without, ext.url, enableHTTPS=True,
                                              tlsConfig={"caFile": str(pki.ca_crt)}), name=without)
    cp.create_pod("refused", ns, scheduler_name=without, cpu="4", memory="1Gi", node_selector=sel)
    wait_all_bound(cp, ns, ["refused"], timeout=60)  # ignorable: scheduled without the extender
    assert ext.failures("http", "no_client_certificate") >= 1
