"""No dataclass of the agent or of the contracts shows a credential in its repr (a repr ends up in
logs, tracebacks and error messages): a field that holds a password, token or secret as text is
declared ``field(repr=False)``. Fields that name where a secret is (``*_file``, ``*_env``) may show."""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
import re

import joulesched.contracts
import joulesched.measurement

SECRET_NAME = re.compile(r"(password|passwd|token|secret|api_?key|credential)s?$")


def credential_fields() -> list[tuple[str, str, bool]]:
    found = []
    for package in (joulesched.measurement, joulesched.contracts):
        for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
            module = importlib.import_module(info.name)
            for name, value in vars(module).items():
                if not (isinstance(value, type) and dataclasses.is_dataclass(value)) or value.__module__ != info.name:
                    continue
                for f in dataclasses.fields(value):
                    if SECRET_NAME.search(f.name.lower()) and "str" in str(f.type):
                        found.append((f"{info.name}.{name}.{f.name}", str(f.type), f.repr))
    return found


def test_every_credential_field_is_left_out_of_repr() -> None:
    fields = credential_fields()
    names = {name.rsplit(".", 2)[-2] + "." + name.rsplit(".", 1)[-1] for name, _, _ in fields}
    assert {"RedfishClient.password", "RegistrarClient.token", "RegistrarReader.token", "InfluxReader.password"} <= names
    assert [name for name, _, shown in fields if shown] == []
