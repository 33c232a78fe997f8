"""Kubernetes label and field selectors, parsed and matched the way the API server does.

Label selectors support ``k=v``, ``k==v``, ``k!=v``, ``k in (a,b)``, ``k notin (a,b)``, ``k``
and ``!k``; field selectors support ``path=v``, ``path==v`` and ``path!=v`` where the path is a
dotted path into the object (``metadata.name``, ``involvedObject.name``, ``status.phase``...).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

Predicate = Callable[[Mapping[str, Any]], bool]

_SET_RE = re.compile(r"^\s*(?P<key>[^\s!=()]+)\s+(?P<op>in|notin)\s+\((?P<values>[^)]*)\)\s*$")
_EQ_RE = re.compile(r"^\s*(?P<key>[^\s!=()]+)\s*(?P<op>==|=|!=)\s*(?P<value>[^\s=()!]*)\s*$")
_EXISTS_RE = re.compile(r"^\s*(?P<neg>!?)\s*(?P<key>[^\s!=()]+)\s*$")


class SelectorError(ValueError):
    """A label or field selector that cannot be parsed.

    :param selector: the selector as given
    :param reason: what is wrong with it
    """

    def __init__(self, selector: str, reason: str) -> None:
        super().__init__(f"invalid selector {selector!r}: {reason}")
        self.selector = selector
        self.reason = reason


def split_requirements(selector: str) -> list[str]:
    """Split a selector on the commas that are not inside a ``(...)`` value set.

    :param selector: a label or field selector
    """
    parts: list[str] = []
    depth = 0
    current: list[str] = []
    for char in selector:
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        if char == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    parts.append("".join(current))
    return [part.strip() for part in parts if part.strip()]


def _label_requirement(text: str, selector: str) -> Predicate:
    """Return a predicate over a label mapping for one requirement.

    :param text: one requirement, such as ``app in (a,b)``
    :param selector: the whole selector, for error messages
    """
    if match := _SET_RE.match(text):
        key, values = match["key"], {v.strip() for v in match["values"].split(",") if v.strip()}
        if match["op"] == "in":
            return lambda labels: labels.get(key) in values
        return lambda labels: labels.get(key) not in values
    if match := _EQ_RE.match(text):
        key, value = match["key"], match["value"]
        if match["op"] == "!=":
            return lambda labels: labels.get(key) != value
        return lambda labels: labels.get(key) == value
    if match := _EXISTS_RE.match(text):
        key = match["key"]
        if match["neg"]:
            return lambda labels: key not in labels
        return lambda labels: key in labels
    raise SelectorError(selector, f"cannot parse requirement {text!r}")


def parse_label_selector(selector: str | None) -> Predicate:
    """Return a predicate telling whether an object's labels match a label selector.

    :param selector: the selector, e.g. ``app=train,tier notin (web)``; empty or ``None`` matches all
    """
    requirements = [_label_requirement(part, selector or "") for part in split_requirements(selector or "")]

    def matches(obj: Mapping[str, Any]) -> bool:
        labels = (obj.get("metadata") or {}).get("labels") or {}
        return all(requirement(labels) for requirement in requirements)

    return matches


def field_value(obj: Mapping[str, Any], path: str) -> str | None:
    """Return the value at a dotted path of an object as the API server compares it (a string).

    :param obj: the object
    :param path: a dotted path such as ``involvedObject.name``
    """
    value: Any = obj
    for part in path.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return None
        value = value[part]
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def parse_field_selector(selector: str | None) -> Predicate:
    """Return a predicate telling whether an object matches a field selector.

    Absent fields compare as the empty string, as in the API server (``spec.nodeName=`` finds
    unscheduled pods).

    :param selector: the selector, e.g. ``involvedObject.name=p1,type!=Normal``
    """
    checks: list[tuple[str, bool, str]] = []
    for part in split_requirements(selector or ""):
        match = _EQ_RE.match(part)
        if match is None:
            raise SelectorError(selector or "", f"cannot parse field requirement {part!r}")
        checks.append((match["key"], match["op"] != "!=", match["value"]))

    def matches(obj: Mapping[str, Any]) -> bool:
        return all(((field_value(obj, key) or "") == value) is equal for key, equal, value in checks)

    return matches
