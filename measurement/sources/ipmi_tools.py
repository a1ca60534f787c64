"""What the IPMI sources share: their options, the password handling, running the tools, the
classification of the tools' errors, and their one zone.

Two sources read the BMC through the system's IPMI tools — :mod:`measurement.sources.ipmi_dcmi`
(DCMI Get Power Reading) and :mod:`measurement.sources.ipmi_sdr` (power sensors of the sensor
data repository) — with the same options (:data:`TARGET_OPTIONS`, validated by
:func:`parse_target` into an :class:`IpmiTarget`) and the same way of running ``ipmitool`` or
FreeIPMI (:class:`IpmiRunner`); each keeps only its own command and parser.

Local (in-band, ``/dev/ipmi0``) or remote (IPMI 2.0 ``lanplus``). The password never appears on
a command line that ``ps`` shows: ipmitool reads it from ``-f FILE`` or, with ``-E``, from the
``IPMI_PASSWORD`` variable of the child's environment; FreeIPMI has no password-file option, so
the runner writes a private configuration file (mode 0600, in a 0700 directory of its own) and
passes ``--config-file``.

A failed run is classified (:meth:`IpmiRunner.classify`): no device or an unsupported command is
:class:`~measurement.errors.SourceAbsent`, a session, privilege or other failure is
:class:`~measurement.errors.SourceFailed`, each naming the BMC, the cause and the fix.

Both sources have one zone, ``platform`` (:class:`IpmiZone`: kind ``power``, domain
``platform``), in watts, stamped with the midpoint of the tool's run on the agent's clock (the
BMC's own clock has one-second resolution and is often wrong).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from joulesched.measurement.errors import SourceAbsent, SourceFailed
from joulesched.measurement.sources.base import Reading, ReadingKind, Roots

Clock = Callable[[], float]

TOOLS = ("auto", "ipmitool", "freeipmi")
INTERFACES = ("lanplus", "lan")
# option value -> (ipmitool -L, FreeIPMI privilege-level)
PRIVILEGES = {
    "user": ("USER", "USER"),
    "operator": ("OPERATOR", "OPERATOR"),
    "administrator": ("ADMINISTRATOR", "ADMIN"),
}
IN_BAND_DEVICES = ("ipmi0", "ipmi/0", "ipmidev/0")

# Options every IPMI source accepts (ipmi_sdr adds ``sensors``).
TARGET_OPTIONS = frozenset(
    {
        "tool",
        "binary",
        "host",
        "port",
        "username",
        "password_file",
        "password_env",
        "interface",
        "cipher_suite",
        "privilege",
        "timeout_s",
        "retries",
        "clock",
    }
)

_IPMITOOL_INSTALL = "install Debian's ipmitool package (apt-get install ipmitool) or set option binary"
_FREEIPMI_INSTALL = "install Debian's freeipmi-tools package (apt-get install freeipmi-tools) or set option binary"
# Lines that make ipmitool's "Unable to establish" specific (it prints them with -v).
_IPMITOOL_DETAIL = (
    "rakp 2 hmac is invalid",
    "unauthorized name",
    "no response from rakp",
    "get auth capabilities error",
    "authentication capabilities",
    "insufficient privilege",
    "privilege level",
)
# A BMC that does not answer at all, by tool.
_NO_ANSWER = (
    "connection timeout",  # FreeIPMI
    "get auth capabilities error",  # ipmitool -v
    "error issuing get channel authentication capabilities",  # ipmitool -v
    "no response from remote",
)
_NO_DEVICE_FIX = (
    "load the ipmi_si and ipmi_devintf kernel modules (modprobe ipmi_devintf ipmi_si), give the agent "
    "/dev/ipmi0 (in a container: a device mount), or set option host to read the BMC over the network"
)


# --- options ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class IpmiTarget:
    """Where the BMC is and how to log in; the password itself is read only when a tool runs."""

    tool: str  # ipmitool | freeipmi (resolved from "auto")
    binary: str  # path of ipmitool / ipmi-dcmi / ipmi-sensors
    host: str | None  # None: in-band, the local BMC through /dev/ipmi0
    port: int = 623
    username: str = ""
    password_file: str | None = None
    password_env: str | None = None
    interface: str = "lanplus"
    cipher_suite: int | None = None
    privilege: str = "user"
    timeout_s: float = 15.0
    retries: int = 2

    def describe(self) -> str:
        if self.host is None:
            return "local BMC (in-band, /dev/ipmi0)"
        user = f", user {self.username!r}" if self.username else ""
        return f"BMC {self.host}:{self.port} ({self.interface}{user})"

    def password_origin(self) -> str:
        if self.password_file:
            return f"password file {self.password_file}"
        if self.password_env:
            return f"environment variable {self.password_env}"
        return "no password"


def _as_str(value: object, key: str, problems: list[str], *, optional: bool = True) -> str | None:
    if value is None and optional:
        return None
    if isinstance(value, str) and value:
        return value
    problems.append(f"{key}: must be a non-empty string, got {value!r}")
    return None


def _as_int(value: object, key: str, problems: list[str], low: int, high: int) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        problems.append(f"{key}: must be an integer in [{low}, {high}], got {value!r}")
        return None
    return value


def parse_target(
    source: str,
    options: Mapping[str, object],
    *,
    default_binaries: Mapping[str, str],
    extra_options: frozenset[str] = frozenset(),
) -> tuple[IpmiTarget, Clock]:
    """Validate the options shared by the IPMI sources; raise SourceFailed listing every problem.

    ``default_binaries`` maps ``ipmitool``/``freeipmi`` to the program this source runs
    (``ipmitool`` and ``ipmi-dcmi`` or ``ipmi-sensors``).
    """
    problems: list[str] = []
    unknown = sorted(set(options) - TARGET_OPTIONS - extra_options)
    if "password" in unknown:
        problems.append(
            "password: not accepted (it would sit in the config and on a command line) — put the password "
            "in a file readable by the agent only and set password_file, or name an environment variable "
            "with password_env"
        )
        unknown.remove("password")
    if unknown:
        problems.append(
            f"unknown options {', '.join(unknown)} (known: {', '.join(sorted(TARGET_OPTIONS | extra_options))})"
        )
    clock = options.get("clock", time.time)
    if not callable(clock):
        problems.append(f"clock: must be callable, got {clock!r}")
        clock = time.time
    tool = options.get("tool", "auto")
    if tool not in TOOLS:
        problems.append(f"tool: must be one of {', '.join(TOOLS)}, got {tool!r}")
        tool = "auto"
    host = _as_str(options.get("host"), "host", problems)
    port = _as_int(options.get("port", 623), "port", problems, 1, 65535) or 623
    username = options.get("username", "")
    if not isinstance(username, str):
        problems.append(f"username: must be a string, got {username!r}")
        username = ""
    password_file = _as_str(options.get("password_file"), "password_file", problems)
    password_env = _as_str(options.get("password_env"), "password_env", problems)
    if password_file and password_env:
        problems.append("password_file, password_env: set one, not both")
    if host is not None and not (password_file or password_env):
        problems.append(
            f"password_file: a remote BMC ({host}) needs a password — set password_file (a file readable by the "
            "agent only) or password_env (the name of an environment variable holding it)"
        )
    if host is None and (password_file or password_env or username):
        problems.append(
            "host: username/password given but no host — set host for a remote BMC, or drop them for in-band"
        )
    interface = options.get("interface", "lanplus")
    if interface not in INTERFACES:
        problems.append(f"interface: must be one of {', '.join(INTERFACES)}, got {interface!r}")
        interface = "lanplus"
    cipher_suite = options.get("cipher_suite")
    if cipher_suite is not None:
        cipher_suite = _as_int(cipher_suite, "cipher_suite", problems, 0, 17)
    privilege = options.get("privilege", "user")
    if not isinstance(privilege, str) or privilege.lower() not in PRIVILEGES:
        problems.append(f"privilege: must be one of {', '.join(PRIVILEGES)}, got {privilege!r}")
        privilege = "user"
    timeout_s = options.get("timeout_s", 15.0)
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, int | float) or not 1 <= timeout_s <= 300:
        problems.append(f"timeout_s: must be a number of seconds in [1, 300], got {timeout_s!r}")
        timeout_s = 15.0
    retries = _as_int(options.get("retries", 2), "retries", problems, 0, 10)
    binary_option = _as_str(options.get("binary"), "binary", problems)
    if problems:
        raise SourceFailed(f"{source}: invalid options — " + "; ".join(problems))

    resolved_tool, binary = _resolve_tool(source, str(tool), binary_option, default_binaries)
    target = IpmiTarget(
        tool=resolved_tool,
        binary=binary,
        host=host,
        port=port,
        username=username,
        password_file=password_file,
        password_env=password_env,
        interface=str(interface),
        cipher_suite=cipher_suite,
        privilege=str(privilege).lower(),
        timeout_s=float(timeout_s),
        retries=2 if retries is None else retries,
    )
    return target, clock


def _resolve_tool(source: str, tool: str, binary: str | None, defaults: Mapping[str, str]) -> tuple[str, str]:
    """Pick the tool and find its program; SourceAbsent when it is not installed."""
    if binary is not None:
        if tool == "auto":
            tool = "freeipmi" if os.path.basename(binary).startswith("ipmi-") else "ipmitool"
        if not (os.path.isfile(binary) and os.access(binary, os.X_OK)) and shutil.which(binary) is None:
            raise SourceAbsent(f"{source}: {binary} (option binary) is not an executable file — fix the path")
        return tool, shutil.which(binary) or binary
    # FreeIPMI first: per read it costs a fraction of ipmitool's CPU (docs/benchmarks.md, bench/ipmi_cost.py)
    candidates = ("freeipmi", "ipmitool") if tool == "auto" else (tool,)
    for candidate in candidates:
        found = shutil.which(defaults[candidate])
        if found:
            return candidate, found
    if tool == "auto":
        raise SourceAbsent(
            f"{source}: neither {defaults['freeipmi']} nor {defaults['ipmitool']} is on PATH "
            f"({os.environ.get('PATH', '')}) — {_IPMITOOL_INSTALL}"
        )
    fix = _IPMITOOL_INSTALL if tool == "ipmitool" else _FREEIPMI_INSTALL
    raise SourceAbsent(f"{source}: {defaults[tool]} is not on PATH ({os.environ.get('PATH', '')}) — {fix}")


# --- running the tools ----------------------------------------------------------------------------


def _read_password(target: IpmiTarget, source: str) -> str:
    if target.password_file:
        try:
            with open(target.password_file, encoding="utf-8") as fh:
                return fh.readline().rstrip("\r\n")
        except OSError as err:
            raise SourceFailed(
                f"{source} ({target.describe()}): cannot read password file {target.password_file}: "
                f"{err.strerror or err} — create it (mode 0600) or fix option password_file"
            ) from err
    if target.password_env:
        value = os.environ.get(target.password_env)
        if value is None:
            raise SourceFailed(
                f"{source} ({target.describe()}): environment variable {target.password_env} (option password_env) "
                "is not set — set it in the agent's environment (e.g. systemd LoadCredential/EnvironmentFile)"
            )
        return value
    return ""


@dataclass
class ToolResult:
    stdout: str
    stderr: str
    returncode: int
    started: float
    finished: float

    @property
    def midpoint(self) -> float:
        return (self.started + self.finished) / 2


@dataclass
class IpmiRunner:
    """Runs one IPMI tool against one BMC, keeping every secret off the command line."""

    source: str
    target: IpmiTarget
    clock: Clock = time.time
    dev_root: str = "/dev"
    _private_dir: str | None = field(default=None, init=False, repr=False)
    _finalizer: Any = field(default=None, init=False, repr=False)  # weakref.finalize

    # -- command lines --
    def base_command(self) -> tuple[list[str], dict[str, str]]:
        """argv prefix and child environment for the target (the password is in neither argv nor logs)."""
        t = self.target
        env = {"PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"), "LC_ALL": "C", "TZ": "UTC"}
        if t.tool == "ipmitool":
            if t.host is None:
                return [t.binary, "-I", "open"], env
            argv = [t.binary, "-I", t.interface, "-H", t.host, "-p", str(t.port), "-L", PRIVILEGES[t.privilege][0]]
            argv += ["-N", "1", "-R", str(max(1, t.retries))]  # ipmitool reads -R 0 as "its default" (~20 s)
            if t.username:
                argv += ["-U", t.username]
            if t.cipher_suite is not None:
                argv += ["-C", str(t.cipher_suite)]
            if t.password_file:
                argv += ["-f", t.password_file]
            else:
                env["IPMI_PASSWORD"] = _read_password(t, self.source)
                argv += ["-E"]
            return argv, env
        # FreeIPMI
        if t.host is None:
            return [t.binary], env
        host = f"[{t.host}]:{t.port}" if ":" in t.host else f"{t.host}:{t.port}"
        driver = "LAN_2_0" if t.interface == "lanplus" else "LAN"
        argv = [t.binary, "-D", driver, "-h", host, f"--config-file={self._freeipmi_config()}"]
        return argv, env

    def _freeipmi_config(self) -> str:
        """A private FreeIPMI configuration file holding the credentials (FreeIPMI has no password file)."""
        t = self.target
        password = _read_password(t, self.source)
        for what, value in (("password", password), ("username", t.username)):
            # Double quotes keep spaces; nothing keeps '#' (a comment), '"' or '\\' (continuation).
            if re.search(r'[#"\\\x00-\x1f]', value):
                raise SourceFailed(
                    f"{self.source} ({t.describe()}): the {what} contains '#', '\"', '\\' or a control character, which "
                    "FreeIPMI's configuration file cannot hold — use tool: ipmitool, or change the BMC account"
                )
        path = self.private_path("freeipmi.conf")
        lines = [f"privilege-level {PRIVILEGES[t.privilege][1]}"]
        if t.username:
            lines.append(f'username "{t.username}"')
        if password:
            lines.append(f'password "{password}"')
        if t.cipher_suite is not None:
            lines.append(f"cipher-suite-id {t.cipher_suite}")
        session_ms = int(t.timeout_s * 1000 * 0.8)
        lines.append(f"session-timeout {session_ms}")
        lines.append(f"retransmission-timeout {max(250, session_ms // (t.retries + 2))}")
        fd = os.open(path + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write("\n".join(lines) + "\n")
        os.replace(path + ".tmp", path)
        return path

    def private_path(self, name: str) -> str:
        """A path in this runner's private directory (mode 0700, removed by :meth:`close` or at exit)."""
        if self._private_dir is None:
            self._private_dir = tempfile.mkdtemp(prefix="joulesched-ipmi-")
            self._finalizer = weakref.finalize(self, shutil.rmtree, self._private_dir, True)
        return os.path.join(self._private_dir, name)

    def sdr_cache_dir(self) -> str:
        """A private directory for FreeIPMI's SDR cache (its default under $HOME is often read-only)."""
        path = self.private_path("freeipmi-sdr-cache")
        os.makedirs(path, mode=0o700, exist_ok=True)
        return path

    def close(self) -> None:
        if self._finalizer is not None:
            self._finalizer()

    # -- running --
    def check_in_band_device(self) -> None:
        """In-band needs /dev/ipmi0 (or /dev/ipmi/0, /dev/ipmidev/0) under the dev root."""
        if self.target.host is not None:
            return
        paths = [os.path.join(self.dev_root, d) for d in IN_BAND_DEVICES]
        if not any(os.path.exists(p) for p in paths):
            raise SourceAbsent(f"{self.source}: no local BMC device ({', '.join(paths)}) — {_NO_DEVICE_FIX}")

    def run(self, args: Sequence[str]) -> ToolResult:
        """Run the tool with ``args``; raise SourceAbsent/SourceFailed with a classified message."""
        prefix, env = self.base_command()
        argv = [*prefix, *args]
        command = " ".join([os.path.basename(prefix[0]), *args])
        started = self.clock()
        try:
            proc = self._spawn(argv, env)
        except FileNotFoundError as err:
            fix = _IPMITOOL_INSTALL if self.target.tool == "ipmitool" else _FREEIPMI_INSTALL
            raise SourceAbsent(f"{self.source}: {prefix[0]} not found — {fix}") from err
        except subprocess.TimeoutExpired as err:
            t = self.target
            where = f"{self.source} ({t.describe()})"
            if t.host is None:
                raise SourceFailed(
                    f"{where}: `{command}` did not finish within {t.timeout_s:g} s — check the local BMC "
                    "(ipmi_si driver), or raise option timeout_s"
                ) from err
            raise SourceFailed(
                f"{where}: cannot open an IPMI session: no answer from the BMC at {self._address()} — `{command}` did "
                f"not finish within {t.timeout_s:g} s; check host and port, that the BMC is up, that IPMI over LAN is "
                f"enabled on it and that UDP {t.port} is reachable from this host, or raise option timeout_s"
            ) from err
        except OSError as err:
            raise SourceFailed(f"{self.source}: cannot run {prefix[0]}: {err.strerror or err}") from err
        result = ToolResult(proc.stdout, proc.stderr, proc.returncode, started, self.clock())
        if proc.returncode != 0:
            if self._vague(result):
                result = self._diagnose(argv, env, result)
            raise self.classify(command, result)
        return result

    def _spawn(self, argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            argv,
            capture_output=True,
            text=True,
            env=env,
            timeout=self.target.timeout_s,
            check=False,
            stdin=subprocess.DEVNULL,
        )

    def _address(self) -> str:
        host = self.target.host or "local"
        return f"[{host}]:{self.target.port}" if ":" in host else f"{host}:{self.target.port}"

    def _vague(self, result: ToolResult) -> bool:
        """ipmitool says only "Unable to establish IPMI v2 / RMCP+ session" for a wrong password and
        for a BMC that does not answer alike; its -v output tells them apart."""
        text = (result.stderr + result.stdout).lower()
        return (
            self.target.tool == "ipmitool"
            and self.target.host is not None
            and "unable to establish" in text
            and not any(marker for marker in _IPMITOOL_DETAIL if marker in text)
        )

    def _diagnose(self, argv: list[str], env: dict[str, str], result: ToolResult) -> ToolResult:
        """Run the failed command once more with -v, only to name the cause (a failure is rare: the
        meter backs off); the first run's timing stands."""
        try:
            proc = self._spawn([argv[0], "-v", *argv[1:]], env)
        except (subprocess.TimeoutExpired, OSError):
            return result
        return ToolResult(
            result.stdout, result.stderr + "\n" + proc.stderr, result.returncode, result.started, result.finished
        )

    def classify(self, command: str, result: ToolResult) -> SourceAbsent | SourceFailed:
        """Turn a failed run into the right error, naming the BMC, the cause and the fix."""
        text = (result.stderr + "\n" + result.stdout).strip()
        first = next((line.strip() for line in text.splitlines() if line.strip()), f"exit status {result.returncode}")
        where = f"{self.source} ({self.target.describe()})"
        lowered = text.lower()
        if "could not open device" in lowered or "could not find inband device" in lowered:
            return SourceAbsent(f"{self.source}: no local BMC device ({first}) — {_NO_DEVICE_FIX}")
        t = self.target
        session = f"{where}: cannot open an IPMI session"
        user = f"user {t.username!r}" if t.username else "the anonymous user"
        lines = [line.strip().lstrip("> ").strip() for line in text.splitlines() if line.strip()]

        def said(markers: Sequence[str]) -> str | None:
            """The tool's line that names the cause, if one does."""
            return next((line for line in lines if any(m in line.lower() for m in markers)), None)

        # the causes, most specific first: each message names the configured address and what to fix
        if line := said(("password invalid", "rakp 2 hmac is invalid", "k_g invalid")):
            return SourceFailed(
                f"{session}: the BMC at {self._address()} rejected the password of {user} ({line}) — fix the "
                f"password ({t.password_origin()})"
            )
        if line := said(("username invalid", "unauthorized name", "invalid user name", "no response from rakp 1")):
            return SourceFailed(
                f"{session}: the BMC at {self._address()} does not know {user} ({line}) — check option username "
                "against the BMC's user list"
            )
        if line := said(_NO_ANSWER):
            return SourceFailed(
                f"{session}: no answer from the BMC at {self._address()} ({line}) — check host and port, that the "
                f"BMC is up, that IPMI over LAN is enabled on it and that UDP {t.port} is reachable from this host"
            )
        if line := said(("session timeout",)):
            return SourceFailed(
                f"{session}: the BMC at {self._address()} answered, then stopped during the session setup ({line})"
                f" — some BMCs do this for a user they do not know: check option username ({user}); else the BMC is "
                "overloaded or rate-limits sessions"
            )
        if any(
            s in lowered
            for s in (
                "unable to establish",
                "password invalid",
                "username invalid",
                "k_g invalid",
                "connection timeout",
                "session timeout",
                "privilege level cannot be obtained",
                "unauthorized name",
                "rakp",
            )
        ):
            return SourceFailed(
                f"{where}: cannot open an IPMI session: {first} — check host and port, the username, the password "
                f"({self.target.password_origin()}), that IPMI over LAN is enabled on the BMC and UDP {self.target.port} "
                "is reachable, and the cipher suite (option cipher_suite)"
            )
        if "insufficient privilege" in lowered:
            return SourceFailed(
                f"{where}: `{command}`: {first} — give the BMC account at least the {self.target.privilege} privilege "
                "or raise option privilege"
            )
        if "invalid command" in lowered or "command invalid or unsupported" in lowered or "(c1)" in lowered:
            return SourceAbsent(f"{where}: `{command}` is not supported by this BMC ({first})")
        return SourceFailed(f"{where}: `{command}` failed: {first}")


# --- opening and the zone ------------------------------------------------------------------------


def open_runner(
    source: str,
    options: Mapping[str, object],
    roots: Roots,
    clock: Clock | None,
    *,
    default_binaries: Mapping[str, str],
    extra_options: frozenset[str] = frozenset(),
) -> IpmiRunner:
    """Validate the options (:func:`parse_target`) and make the runner; the sampler's clock, when
    the registry passes one, wins over ``options["clock"]``."""
    if clock is not None:
        options = {**options, "clock": clock}
    target, target_clock = parse_target(source, options, default_binaries=default_binaries, extra_options=extra_options)
    return IpmiRunner(source, target, target_clock, roots.dev)


@dataclass(frozen=True, slots=True)
class IpmiZone:
    """The whole server's power as the BMC reports it: DCMI's meter, or the sum of SDR sensors."""

    name: str
    read_power: Callable[[], tuple[float, float]]  # -> (watts, timestamp)
    sensors: tuple[str, ...] = ()  # ipmi_sdr: the sensors summed; ipmi_dcmi: none
    domain: str = "platform"
    kind: ReadingKind = "power"
    max_joules: float | None = None
    parent: str | None = None

    def read(self) -> Reading:
        try:
            watts, timestamp = self.read_power()
        except SourceAbsent as err:  # it was there when the source opened: now it is a failure
            raise SourceFailed(str(err)) from err
        return Reading(watts, timestamp)


class IpmiSource:
    """What both IPMI sources are: a name, a runner, notes, one :class:`IpmiZone`."""

    name: str

    def __init__(self, runner: IpmiRunner, zone: IpmiZone) -> None:
        self.runner = runner
        self.target: IpmiTarget = runner.target
        self.notes: list[str] = []
        self._zone = zone

    def zones(self) -> Sequence[IpmiZone]:
        return [self._zone]

    def close(self) -> None:
        self.runner.close()


__all__ = [
    "INTERFACES",
    "IN_BAND_DEVICES",
    "PRIVILEGES",
    "TARGET_OPTIONS",
    "TOOLS",
    "IpmiRunner",
    "IpmiSource",
    "IpmiTarget",
    "IpmiZone",
    "ToolResult",
    "open_runner",
    "parse_target",
]
