"""Reading a YAML document from disk, with the errors every config and data file gives.

The one place that turns a path into a parsed document: the extender's and the agent's configs,
site files and the simulator's cluster specs all start here, and then validate the document with
:class:`policy.validate.Checker` (``policy/`` itself does no I/O).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from joulesched.policy.errors import ConfigError


def read_yaml(path: str | Path, error: type[Exception] = ConfigError) -> Any:
    """The parsed document at ``path``; ``error(path, [problem])`` when it cannot be read or parsed."""
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as err:
        raise error(str(file), [f"cannot read: {err.strerror or err}"]) from err
    except UnicodeDecodeError as err:
        raise error(str(file), [f"not UTF-8 text: byte {err.object[err.start]:#04x} at offset {err.start}"]) from err
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise error(str(file), [f"not valid YAML: {err}"]) from err


__all__ = ["read_yaml"]
