"""A do-nothing scheduler extender: the floor an extender's cost is measured against.

Standard library only (http.server, HTTP/1.1 keep-alive, as kube-scheduler's Go client keeps
its connection): filter passes every node it is sent, prioritize scores every node 0, bind is
not served. Names mode (``nodeCacheCapable: true``): the request is decoded to find
``NodeNames``, which is the least any extender must do. Full-Node mode (``false``): nothing is
decoded; filter echoes the ``Nodes`` bytes as kube-scheduler sent them and prioritize finds the
names with a regular expression — the least kube-scheduler's own encoding allows, and a floor
no real extender (which must read the nodes it scores) gets under.

    python bench/const_extender.py PORT
"""

from __future__ import annotations

import json
import re
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

NODE_NAMES_NULL = b',"NodeNames":null}'
NODE_NAME = re.compile(rb'\{"metadata":\{"name":"([^"\\]*)"')


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
    server = ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler)
    server.daemon_threads = True
    server.serve_forever()


if __name__ == "__main__":
    main()
