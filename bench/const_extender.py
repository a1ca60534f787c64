"""A do-nothing scheduler extender: the floor an extender's cost is measured against.

Standard library only (http.server, HTTP/1.1 keep-alive, as kube-scheduler's Go client keeps
its connection): filter passes every node it is sent by name, prioritize scores every node 0,
bind is not served. Names mode only (``nodeCacheCapable: true``): the request is decoded to
find ``NodeNames``, which is the least any extender must do.

    python bench/const_extender.py PORT
"""

from __future__ import annotations

import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


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
