"""A do-nothing scheduler extender: the floor an extender's cost is measured against.

Standard library only (http.server, HTTP/1.1 keep-alive, as kube-scheduler's Go client keeps
its connection): filter passes every node it is sent, prioritize scores every node 0. Bind is
served only when given the API server (``--api``): then it POSTs the ``pods/binding`` at once,
over kept-alive TLS connections (http.client, a client certificate or a bearer token), and answers kube-scheduler
with the API's outcome — the least an extender with the bind verb must do, and the floor for
joulesched with it (the binding's API write moves from kube-scheduler into the extender). With
``--bind-declines`` instead, bind is answered with an ``Error`` at once and nothing is written:
kube-scheduler, whose entry is ``ignorable``, then skips the extender and binds the pod with its
own binder (kube-scheduler's ``extendersBinding``) — the floor for an extender that is only told
where each pod goes and leaves the write to kube-scheduler. Names mode (``nodeCacheCapable: true``): the request is decoded to find
``NodeNames``, which is the least any extender must do. Full-Node mode (``false``): nothing is
decoded; filter echoes the ``Nodes`` bytes as kube-scheduler sent them and prioritize finds the
names with a regular expression — the least kube-scheduler's own encoding allows, and a floor
no real extender (which must read the nodes it scores) gets under.

    python bench/const_extender.py PORT [--api URL --ca FILE (--cert FILE --key FILE | --token FILE) | --bind-declines]
"""

from __future__ import annotations

import argparse
import http.client
import json
import queue
import re
import ssl
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import quote, urlsplit

NODE_NAMES_NULL = b',"NodeNames":null}'
NODE_NAME = re.compile(rb'\{"metadata":\{"name":"([^"\\]*)"')


class ApiServer:
    """POSTs to the API server over kept-alive HTTPS connections, one per request in flight."""

    def __init__(self, url: str, ca: str, cert: str | None, key: str | None, token: str | None = None) -> None:
        split = urlsplit(url)
        if split.scheme != "https":
            raise ValueError(f"--api {url!r}: an https:// URL expected")
        self.host, self.port = split.hostname or "127.0.0.1", split.port or 443
        self.context = ssl.create_default_context(cafile=ca)
        if cert and key:
            self.context.load_cert_chain(cert, key)
        self.headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if token:
            self.headers["Authorization"] = f"Bearer {token}"
        self.idle: queue.LifoQueue[http.client.HTTPSConnection] = queue.LifoQueue()

    def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        try:
            conn, reused = self.idle.get_nowait(), True
        except queue.Empty:
            conn, reused = self._connect(), False
        while True:
            try:
                conn.request("POST", path, body, self.headers)
                resp = conn.getresponse()
                data = resp.read()
                break
            except (ConnectionError, http.client.RemoteDisconnected, ssl.SSLEOFError, ssl.SSLZeroReturnError):
                conn.close()
                if not reused:
                    raise
                # a kept-alive connection the API server closed while idle (a TLS close_notify
                # reads as SSLEOFError on the next request): no reply began, so the request is
                # sent once more, on a new connection
                conn, reused = self._connect(), False
            except (OSError, http.client.HTTPException):
                conn.close()
                raise
        if resp.will_close:
            conn.close()
        else:
            self.idle.put(conn)
        return resp.status, data

    def _connect(self) -> http.client.HTTPSConnection:
        return http.client.HTTPSConnection(self.host, self.port, context=self.context, timeout=5)


API: ApiServer | None = None
DECLINES = False  # --bind-declines


class Server(ThreadingHTTPServer):
    # socketserver listens with a backlog of 5, which can overflow when kube-scheduler opens a
    # connection for each of dozens of binds in flight; a dropped SYN is sent again after 1 s,
    # past deploy/'s httpTimeout. gunicorn listens with 2048.
    request_queue_size = 2048
    daemon_threads = True


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Headers and body go out in two writes: without TCP_NODELAY the body waits on Nagle's
    # algorithm and the client's delayed ACK, 40 ms a reply (gunicorn sets it too).
    disable_nagle_algorithm = True

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        self._send(200, b"ok\n")

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        verb = self.path.rsplit("/", 1)[-1]
        if verb == "bind" and API is not None:
            self._bind(body)
            return
        if verb == "bind" and DECLINES:
            self._send(200, b'{"Error":"not bound here: kube-scheduler binds (ignorable)"}')
            return
        nodes = body.find(b',"Nodes":{')
        if nodes > 0 and body.endswith(NODE_NAMES_NULL):
            self._full_nodes(verb, body, nodes + len(b',"Nodes":'))
            return
        try:
            names = json.loads(body).get("NodeNames") or []
        except (ValueError, AttributeError):
            self._send(400, b'{"Error": "not an ExtenderArgs object"}')
            return
        if verb == "filter":
            out = {"NodeNames": names, "FailedNodes": {}, "FailedAndUnresolvableNodes": {}, "Error": ""}
        elif verb == "prioritize":
            out = [{"Host": n, "Score": 0} for n in names]
        else:
            self._send(404, json.dumps({"Error": f"no verb {verb!r}"}).encode())
            return
        self._send(200, json.dumps(out).encode())

    def _bind(self, body: bytes) -> None:
        try:
            args = json.loads(body)
            namespace, name, uid, node = (args[k] for k in ("PodNamespace", "PodName", "PodUID", "Node"))
            if not all(isinstance(v, str) for v in (namespace, name, uid, node)):
                raise TypeError("a field that is not a string")
        except (ValueError, KeyError, TypeError):
            self._send(
                400, b'{"Error": "not an ExtenderBindingArgs object: PodNamespace, PodName, PodUID and Node strings"}'
            )
            return
        binding = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": name, "namespace": namespace, "uid": uid},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        path = f"/api/v1/namespaces/{quote(namespace, safe='')}/pods/{quote(name, safe='')}/binding"
        assert API is not None
        try:
            status, data = API.post(path, json.dumps(binding).encode())
            error = "" if 200 <= status < 300 else f"HTTP {status}: {data[:200].decode(errors='replace')}"
        except (OSError, http.client.HTTPException) as err:
            error = f"binding {namespace}/{name}: {err!r}"
        if error:
            print(error, file=sys.stderr, flush=True)
        self._send(200, json.dumps({"Error": error}).encode())

    def _full_nodes(self, verb: str, body: bytes, start: int) -> None:
        if verb == "filter":
            tail = b',"NodeNames":null,"FailedNodes":{},"FailedAndUnresolvableNodes":{},"Error":""}'
            self._send(200, b'{"Nodes":' + body[start : len(body) - len(NODE_NAMES_NULL)] + tail)
        elif verb == "prioritize":
            names = [m.decode() for m in NODE_NAME.findall(body, start)]
            self._send(200, json.dumps([{"Host": n, "Score": 0} for n in names]).encode())
        else:
            self._send(404, json.dumps({"Error": f"no verb {verb!r}"}).encode())

    def _send(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def main() -> None:
    global API, DECLINES
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("port", type=int)
    p.add_argument("--api", help="the API server's URL: serve bind (with --ca, and --cert and --key or --token)")
    p.add_argument("--ca")
    p.add_argument("--cert")
    p.add_argument("--key")
    p.add_argument("--token", help="a file holding a bearer token to bind with (a ServiceAccount's)")
    p.add_argument("--bind-declines", action="store_true", help="answer bind with an Error at once, writing nothing")
    args = p.parse_args()
    if args.api and args.bind_declines:
        p.error("--api and --bind-declines: one or the other")
    DECLINES = args.bind_declines
    if args.api:
        if not (args.ca and bool(args.cert and args.key) != bool(args.token)):
            p.error("--api needs --ca, and --cert and --key or --token")
        try:
            token = None
            if args.token:
                with open(args.token) as f:
                    token = f.read().strip()
            API = ApiServer(args.api, args.ca, args.cert, args.key, token)
        except (ValueError, OSError) as err:
            p.error(str(err))
    server = Server(("127.0.0.1", args.port), Handler)
    server.serve_forever()


if __name__ == "__main__":
    main()
