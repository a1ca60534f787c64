"""Networking shared by the parts: loopback ports for the parts that start local servers (the
extender's demo, the simulator's spawned extenders, the tests and benchmarks), a deadline for a
whole HTTP exchange (the carbon-intensity clients, the agent's Redfish client), and the rules
every client that sends a credential follows.

A socket's timeout bounds each read and restarts with every byte, so a server that trickles its
answer holds the caller for as long as it likes. At the deadline :class:`Deadline` shuts the
connection's socket down, which wakes the read blocked on it (closing it alone does not on
Linux); ``expired`` then says why the exchange failed.

Credentials (docs/agent.md, "Credentials and URLs"), each rule defined here once:

* :func:`url_problem`: a configured URL is ``http://`` or ``https://`` and carries no user
  information (``https://user:password@host``): a URL is logged, put in error messages and so on
  the unauthenticated ``/metrics``; the secret goes in the key made for it (a password or token
  file). The message never repeats the URL's password.
* :func:`plain_http_problem`: a URL that a password or token is sent to is ``https://``, unless
  its host is loopback (127.0.0.0/8, ::1, ``localhost``: the traffic never leaves the host) or
  the config sets :data:`ALLOW_PLAIN_HTTP` (``allow_plain_http: true``, for a trusted network).
* :func:`open_url`: ``urllib.request.urlopen`` with a redirect handler that drops the credential
  headers (:data:`CREDENTIAL_HEADERS`) when a redirect leaves the origin (scheme, host and port)
  they were set for — what requests and httpx do. urllib's own handler copies every header to
  any redirect target.
"""

from __future__ import annotations

import http.client
import ipaddress
import socket
import ssl
import threading
import urllib.parse
import urllib.request
from types import TracebackType
from typing import IO, Any

# The config key that accepts sending a credential over plain http:// to a host that is not loopback.
ALLOW_PLAIN_HTTP = "allow_plain_http"
# Request headers that carry a credential (lower case): sent to their own origin only.
CREDENTIAL_HEADERS = frozenset({"authorization", "proxy-authorization", "cookie", "auth-token"})
DEFAULT_PORTS = {"http": 80, "https": 443}


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free now (the OS picks it; another process may take it later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Deadline:
    """``with Deadline(conn, seconds) as d:`` around one exchange on ``conn``; ``d.expired`` after."""

    def __init__(self, conn: http.client.HTTPConnection, seconds: float) -> None:
        self.conn = conn
        self._expired = threading.Event()
        self._timer = threading.Timer(seconds, self._cut)
        self._timer.daemon = True

    @property
    def expired(self) -> bool:
        return self._expired.is_set()

    def _cut(self) -> None:
        self._expired.set()
        sock = self.conn.sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # closed already

    def __enter__(self) -> Deadline:
        self._timer.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None) -> None:
        self._timer.cancel()


# -- credentials and URLs --------------------------------------------------------------------------


def is_loopback_host(host: str) -> bool:
    """``localhost`` or a loopback address (127.0.0.0/8, ::1); names are not resolved."""
    if host.lower().rstrip(".") == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _userinfo_split(url: str) -> tuple[str, str, str] | None:
    """``(scheme://, user information, the rest)`` when ``url`` holds user information, else None.

    Any ``@`` between ``://`` and the query counts: a password with ``/``, ``?`` or ``#`` in it
    ends ``urlsplit``'s netloc early (``https://admin:pa/ss@bmc`` parses as host ``admin``, port
    ``pa``), and such a URL still carries it."""
    scheme, sep, rest = url.partition("://")
    head = rest.split("?", 1)[0].split("#", 1)[0]
    if not sep or "@" not in head:
        return None
    at = head.rindex("@")
    return scheme + sep, rest[:at], rest[at + 1 :]


def redact(url: str) -> str:
    """``url`` without its user information (``user:password@``), for logs and messages."""
    split = _userinfo_split(url)
    return url if split is None else split[0] + split[2]


def url_problem(url: str, secret_keys: str) -> str | None:
    """Why ``url`` cannot be a configured endpoint, or None.

    It must be ``http://`` or ``https://`` with a host and a valid port, and must not carry user
    information: ``secret_keys`` names where the credential goes instead (``password_file or
    password_env``; empty: nowhere). The message shows the URL without its user information.
    """
    credentials = (
        "must not carry credentials (user:password@ in the URL ends up in logs, errors and /metrics):"
        " remove them" + (f" and use {secret_keys}" if secret_keys else "")
    )
    if _userinfo_split(url) is not None:
        return credentials
    try:
        parts = urllib.parse.urlsplit(url)
        scheme, host = parts.scheme, parts.hostname
        _ = parts.port  # a port that is no number, or out of range, raises here
    except ValueError:
        if "@" in url.partition("://")[2]:  # a password with ? or # in it: cut there, it breaks the port
            return credentials
        return f"is not a URL ({url!r}): give http(s)://host[:port][/path]"
    if scheme not in DEFAULT_PORTS or not host:
        return f"must be an http:// or https:// URL, got {redact(url)!r}"
    return None


def plain_http_problem(url: str, credential: str, allowed: bool, allow_key: str = ALLOW_PLAIN_HTTP) -> str | None:
    """Why a ``credential`` (what is sent: "the BMC password (password_file)") may not go to
    ``url``, or None: over ``http://`` it crosses the network in cleartext. Loopback hosts, and
    ``allowed`` (the config's ``allow_key: true``), accept it."""
    try:
        parts = urllib.parse.urlsplit(url)
        host = parts.hostname or ""
    except ValueError:
        return None  # url_problem says what is wrong with it
    if parts.scheme != "http" or allowed or is_loopback_host(host):
        return None
    return (
        f"http:// would send {credential} in cleartext to {host}: use https://, or set {allow_key}: true"
        " to accept that on a network you trust (loopback needs neither)"
    )


def origin(url: str) -> tuple[str, str, int | None]:
    """(scheme, host, port) of ``url``, the port filled in from the scheme's default."""
    parts = urllib.parse.urlsplit(url)
    scheme = parts.scheme.lower()
    try:
        port = parts.port
    except ValueError:
        port = None
    return scheme, (parts.hostname or "").lower(), port or DEFAULT_PORTS.get(scheme)


class SameOriginCredentials(urllib.request.HTTPRedirectHandler):
    """urllib's redirect handling, less the credential headers when a redirect leaves their origin.

    The headers are dropped from the redirected request for good: a later redirect back to the
    first origin does not bring them back (requests and httpx strip the same way)."""

    def redirect_request(
        self,
        req: urllib.request.Request,
        fp: IO[bytes],
        code: int,
        msg: str,
        headers: Any,
        newurl: str,
    ) -> urllib.request.Request | None:
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        if new is not None and origin(new.full_url) != origin(req.full_url):
            for name in [n for n in new.headers if n.lower() in CREDENTIAL_HEADERS]:
                del new.headers[name]
            for name in [n for n in new.unredirected_hdrs if n.lower() in CREDENTIAL_HEADERS]:
                del new.unredirected_hdrs[name]
        return new


def open_url(
    request: urllib.request.Request | str, *, timeout: float, context: ssl.SSLContext | None = None
) -> Any:
    """``urllib.request.urlopen(request, timeout=timeout, context=context)``, following redirects
    with :class:`SameOriginCredentials`; the same answer and the same errors (HTTPError, URLError)."""
    handlers: list[urllib.request.BaseHandler] = [SameOriginCredentials()]
    if context is not None:
        handlers.append(urllib.request.HTTPSHandler(context=context))
    return urllib.request.build_opener(*handlers).open(request, timeout=timeout)
