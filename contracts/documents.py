"""Reading a YAML document from disk, with the errors every config and data file gives.

The one place that turns a path into a parsed document: the extender's and the agent's configs,
site files and the simulator's cluster specs all start here, and then validate the document with
:class:`policy.validate.Checker` (``policy/`` itself does no I/O).

The loader is PyYAML's ``SafeLoader`` with one difference: a mapping that gives a key twice is
refused (PyYAML keeps the last value silently), each such key named with its dotted path and the
lines of both. A file that is not YAML is one problem naming the line and column::

    config.yaml: 1 problem
      line 3, column 7: not valid YAML: could not find expected ':' (while scanning a simple key at line 2, column 1)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from joulesched.contracts.errors import ContractError
from joulesched.policy.errors import ConfigError

# keys the SafeLoader rewrites before it constructs a mapping: a merge (<<) brings keys that
# the mapping's own keys override, by design; a value key (=) is one of its own
_REWRITTEN = frozenset({"tag:yaml.org,2002:merge", "tag:yaml.org,2002:value"})


class DuplicateKeys(ContractError):
    """A document gives a mapping key twice; ``problems`` names each, with its path and lines
    (raised by :class:`StrictSafeLoader` once the document is read; :func:`parse_yaml` turns it
    into the caller's error)."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("; ".join(problems))


class StrictSafeLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses a key given twice in one mapping.

    The check costs one dictionary insert per key: the keys are constructed once (PyYAML caches
    each constructed node, so the construction that follows reuses them), and where a duplicate
    is, is worked out only when there is one.
    """

    def __init__(self, stream: Any) -> None:
        super().__init__(stream)
        self._root: yaml.Node | None = None
        self._duplicates: list[tuple[yaml.MappingNode, yaml.Node, yaml.Node]] = []
        self._checked: set[int] = set()  # mappings whose own keys were checked (ids; the nodes live as long)

    def construct_document(self, node: yaml.Node) -> Any:
        self._root = node
        data = super().construct_document(node)
        if self._duplicates:
            found = sorted(self._duplicates, key=lambda d: (d[2].start_mark.line, d[2].start_mark.column))
            raise DuplicateKeys([self._duplicate_problem(*d) for d in found])
        return data

    def flatten_mapping(self, node: yaml.MappingNode) -> None:
        # A mapping's own keys are checked before PyYAML flattens it, and once: flattening puts
        # the keys of the mappings it merges (``<<``) in front of its own, in place, and a
        # mapping merged elsewhere (an anchor, ``<<: *x``) is flattened there before it is
        # constructed here, so a key overriding a merged one would look given twice.
        if id(node) not in self._checked:
            self._checked.add(id(node))
            seen: dict[Any, yaml.Node] = {}
            for key_node, _ in node.value:
                if key_node.tag in _REWRITTEN or not isinstance(key_node, yaml.ScalarNode):
                    continue
                key = self.construct_object(key_node)
                try:
                    first = seen.setdefault(key, key_node)
                except TypeError:  # not hashable: the construction that follows says so
                    continue
                if first is not key_node:
                    self._duplicates.append((node, first, key_node))
        super().flatten_mapping(node)

    def _duplicate_problem(self, mapping: yaml.MappingNode, first: yaml.Node, again: yaml.Node) -> str:
        parent = _path_to(self._root, mapping)
        name = str(again.value)  # as written (``true``, not Python's True)
        where = f"{parent}.{name}" if parent else name
        one, two = first.start_mark, again.start_mark
        at = [f"line {m.line + 1}" + (f", column {m.column + 1}" if one.line == two.line else "") for m in (one, two)]
        if first.value != again.value:  # equal once read: 1 and true, 1 and 1.0
            at[0] += f" (as {first.value})"
        return f"{where}: given twice in one mapping, at {at[0]} and again at {at[1]} (a key appears once)"


def _path_to(root: yaml.Node | None, target: yaml.Node) -> str:
    """The dotted path (``nodes[2].gpus``) of ``target`` in the node tree under ``root``."""
    stack: list[tuple[yaml.Node, str]] = [(root, "")] if root is not None else []
    visited: set[int] = set()
    while stack:
        node, path = stack.pop()
        if node is target:
            return path
        if id(node) in visited:  # an alias seen before (or a recursive one)
            continue
        visited.add(id(node))
        if isinstance(node, yaml.MappingNode):
            for key_node, value_node in node.value:
                label = key_node.value if isinstance(key_node, yaml.ScalarNode) else "?"
                stack.append((value_node, f"{path}.{label}" if path else str(label)))
        elif isinstance(node, yaml.SequenceNode):
            stack.extend((item, f"{path}[{i}]") for i, item in enumerate(node.value))
    return ""


def yaml_problem(err: yaml.YAMLError, text: str = "") -> str:
    """One line saying where ``err`` is and what it is (``text``: the document, for a reader error)."""
    if isinstance(err, yaml.MarkedYAMLError):
        mark = err.problem_mark or err.context_mark
        what = err.problem or err.context or "unknown problem"
        said = f"not valid YAML: {what}"
        if err.context and err.problem:
            cm = err.context_mark
            at = ""
            if cm is not None and mark is not None and (cm.line, cm.column) != (mark.line, mark.column):
                at = f" at line {cm.line + 1}, column {cm.column + 1}"
            if err.problem.startswith("but "):  # "expected a single document ..., but found another"
                said = f"not valid YAML: {err.context}{at}, {err.problem}"
            else:
                said += f" ({err.context}{at})"
        if err.note:
            said += f"; {err.note}"
        said = " ".join(said.split())  # one line, whatever the parser's text holds
        return f"line {mark.line + 1}, column {mark.column + 1}: {said}" if mark is not None else said
    if isinstance(err, yaml.reader.ReaderError):
        char = err.character if isinstance(err.character, int) else ord(err.character)
        line = text.count("\n", 0, err.position) + 1
        column = err.position - (text.rfind("\n", 0, err.position) + 1) + 1
        return f"line {line}, column {column}: not valid YAML: unacceptable character #x{char:04x}: {err.reason}"
    return "not valid YAML: " + " ".join(str(err).split())


def parse_yaml(text: str, where: str, error: type[Exception] = ConfigError) -> Any:
    """The document in ``text``; ``error(where, problems)`` when it is not YAML or gives a key twice."""
    try:
        loader = StrictSafeLoader(text)  # the reader checks every character here
        try:
            return loader.get_single_data()
        finally:
            loader.dispose()
    except DuplicateKeys as err:
        raise error(where, err.problems) from err
    except yaml.YAMLError as err:
        raise error(where, [yaml_problem(err, text)]) from err


def read_yaml(path: str | Path, error: type[Exception] = ConfigError) -> Any:
    """The parsed document at ``path``; ``error(path, [problem])`` when it cannot be read or parsed."""
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as err:
        raise error(str(file), [f"cannot read: {err.strerror or err}"]) from err
    except UnicodeDecodeError as err:
        raise error(str(file), [f"not UTF-8 text: byte {err.object[err.start]:#04x} at offset {err.start}"]) from err
    return parse_yaml(text, str(file), error)


__all__ = ["DuplicateKeys", "StrictSafeLoader", "parse_yaml", "read_yaml", "yaml_problem"]
