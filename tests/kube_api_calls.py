"""What each deployed component asks of the Kubernetes API, found by reading the code.

A component is the code one ServiceAccount runs: some root modules and what they import (see
:func:`component_modules`). In its modules every attribute named as a method of a ``kubernetes``
client API class (``api.list_namespaced_pod``, also when handed to ``Watch().stream`` or to a
pager) is a call. Its permission is derived from the client itself, never listed by hand: each
generated method calls ``call_api(PATH, HTTP_METHOD)``, and the path names the API group and the
resource (and subresource), the HTTP method the verb, as the API server's authorizer does. A list
method handed to ``stream()`` or given ``watch=True`` is a watch. ``CustomObjectsApi`` calls take
their group and plural from the call's arguments, read from literals and module constants.

``KubernetesHook`` methods (the cncf-kubernetes provider's) are followed by name from the scanned
modules, so only the hook methods the operators reach count, not all the hook offers.
"""

from __future__ import annotations

import ast
import importlib.util
import inspect
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROVIDER = "airflow.providers.cncf.kubernetes"
PROVIDER_HOOK = f"{PROVIDER}.hooks.kubernetes"
_CALL_API = re.compile(r"call_api\(\s*'([^']+)',\s*'([A-Z]+)'")
#: Packages that own no Kubernetes client: the ledger sits below every layer that builds one, and
#: its one optional client (``check_invariants``) is handed in by ``gpupool bench`` and the demo.
WITHOUT_CLIENT = ("airflow_gpupool.ledger.",)
_RESOURCE_METHODS = ("list_", "read_", "create_", "replace_", "patch_", "delete_", "connect_")
_HTTP_VERBS = {"POST": "create", "PUT": "update", "PATCH": "patch"}


@dataclass(frozen=True, order=True)
class Permission:
    """One RBAC rule's worth: ``verb`` on ``group``/``resource``; ``cluster_wide`` needs a ClusterRole.

    ``namespace`` is the namespace the code names (a node's Events go to ``default``), else empty:
    the namespace the call is given, one of the workloads'.
    """

    group: str
    resource: str
    verb: str
    cluster_wide: bool
    namespace: str = ""

    def __str__(self) -> str:
        scope = f"namespace {self.namespace}" if self.namespace else "a namespace"
        scope = "every namespace" if self.cluster_wide else scope
        return f"{self.verb} {self.resource} ({self.group or 'core'}) in {scope}"


@cache
def client_endpoints() -> dict[str, frozenset[tuple[str, str, str]]]:
    """Return each client method's ``(API class, path, HTTP method)``, read from the client's code."""
    import kubernetes.client

    found: dict[str, set[tuple[str, str, str]]] = {}
    for class_name in dir(kubernetes.client):
        cls = getattr(kubernetes.client, class_name)
        if not (class_name.endswith("Api") and inspect.isclass(cls)) or class_name == "ApiClient":
            continue
        for name, function in inspect.getmembers(cls, inspect.isfunction):
            # CustomObjectsApi reads with ``get_*_custom_object*``; other ``get_`` methods are discovery.
            read = name.startswith("get_") and "custom_object" in name
            if not (name.endswith("_with_http_info") and (name.startswith(_RESOURCE_METHODS) or read)):
                continue  # discovery (get_api_resources, get_code) needs no rule
            match = _CALL_API.search(inspect.getsource(function))
            if match:
                found.setdefault(name.removesuffix("_with_http_info"), set()).add(
                    (class_name, *match.groups())
                )
    return {name: frozenset(endpoints) for name, endpoints in found.items()}


def permissions_of(
    method: str,
    http: str,
    path: str,
    *,
    watched: bool,
    custom: tuple[str, str] | None = None,
    namespace: str = "",
) -> set[Permission]:
    """Return what one client call needs, from its endpoint.

    :param method: the client method's name (``connect_*`` opens a stream: ``create`` and ``get``)
    :param http: its HTTP method
    :param path: its path template, such as ``/api/v1/namespaces/{namespace}/pods/{name}/log``
    :param watched: whether the call is a watch
    :param custom: ``(group, plural)`` of a ``CustomObjectsApi`` call
    :param namespace: the namespace the call names, when the code names one
    """
    parts = path.strip("/").split("/")
    group, parts = ("", parts[2:]) if parts[0] == "api" else (parts[1], parts[3:])
    namespaced = len(parts) > 2 and parts[0] == "namespaces"
    if namespaced:
        parts = parts[2:]
    resource, named = parts[0], len(parts) > 1 and parts[1].startswith("{")
    if custom is not None:
        group, resource = custom
    if len(parts) > 2:
        resource = f"{resource}/{parts[2]}"
    if method.startswith("connect_"):
        verbs = {"create", "get"}
    elif http == "GET":
        verbs = {"get"} if named else {"list", "watch"} if watched else {"list"}
    elif http == "DELETE":
        verbs = {"delete" if named else "deletecollection"}
    else:
        verbs = {_HTTP_VERBS[http]}
    return {
        Permission(group, resource, verb, not namespaced, namespace if namespaced else "") for verb in verbs
    }


# -- the code's calls -----------------------------------------------------------------------------


@dataclass(frozen=True)
class ApiCall:
    """One client method named in the code, where, and what the code tells of it."""

    method: str
    where: str
    watched: bool
    custom: tuple[str, str] | None = None
    namespace: str = ""


def module_index() -> dict[str, Path]:
    """Return the source file of every module of the package and of the cncf-kubernetes provider."""
    spec = importlib.util.find_spec(PROVIDER)
    assert spec is not None and spec.submodule_search_locations
    tops = [(ROOT / "airflow_gpupool", "airflow_gpupool")]
    tops.append((Path(next(iter(spec.submodule_search_locations))), PROVIDER))
    index = {}
    for folder, prefix in tops:
        for path in folder.rglob("*.py"):
            parts = path.relative_to(folder).with_suffix("").parts
            index[".".join((prefix, *parts[: -1 if parts[-1] == "__init__" else None]))] = path
    return index


def _imports(tree: ast.Module, index: dict[str, Path], *, module_level_only: bool) -> set[str]:
    nodes = tree.body if module_level_only else list(ast.walk(tree))
    found = set()
    for node in nodes:
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                found |= {m for m in (f"{node.module}.{alias.name}", node.module) if m in index}
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name in index}
    return found


def component_modules(roots: Iterable[str]) -> set[str]:
    """Return the modules a component runs: its roots (a name ending in ``.`` is a package's every
    module) and what they import, every import of a root, only module-level ones of the rest: a
    helper's function-local import serves another command (``cli.common`` opens a hook only for
    the commands that use one). The provider's hook is left out: its methods are followed by name.
    """
    index = module_index()
    starts = {m for r in roots for m in index if m == r or (r.endswith(".") and m.startswith(r))}
    skipped = (PROVIDER_HOOK, *WITHOUT_CLIENT)
    seen: set[str] = set()
    todo = list(starts)
    while todo:
        module = todo.pop()
        if module in seen or module.startswith(skipped):
            continue
        seen.add(module)
        tree = ast.parse(index[module].read_text())
        todo += _imports(tree, index, module_level_only=module not in starts)
    return seen


def _constants(tree: ast.Module) -> dict[str, object]:
    found: dict[str, object] = {}
    for node in tree.body:
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1):
            continue
        target = node.targets[0]
        try:
            value = ast.literal_eval(node.value)
        except ValueError:
            continue
        if isinstance(target, ast.Name):
            found[target.id] = value
        elif isinstance(target, ast.Tuple) and isinstance(value, tuple) and len(value) == len(target.elts):
            # ``GROUP, VERSION, PLURAL = "autoscaling.x-k8s.io", "v1", "provisioningrequests"``
            found.update(
                {t.id: v for t, v in zip(target.elts, value, strict=True) if isinstance(t, ast.Name)}
            )
    return found


def _literal(node: ast.expr, constants: dict[str, object]) -> object:
    """Return an argument's value when literals and module constants make it, else None (nothing is run)."""
    try:
        return eval(ast.unparse(node), {"__builtins__": {}}, dict(constants))
    except Exception:
        return None


def _custom_target(call: ast.Call, method: str, constants: dict[str, object]) -> tuple[str, str] | None:
    """Return ``(group, plural)`` of a ``CustomObjectsApi`` call from its literal arguments, else None."""
    args: list[object] = []
    for arg in call.args:
        value = _literal(arg.value if isinstance(arg, ast.Starred) else arg, constants)
        args += list(value) if isinstance(arg, ast.Starred) and isinstance(value, tuple | list) else [value]
    named = {k.arg: _literal(k.value, constants) for k in call.keywords if k.arg in ("group", "plural")}
    at = 3 if "namespaced" in method else 2
    group = named.get("group", args[0] if args else None)
    plural = named.get("plural", args[at] if len(args) > at else None)
    return (group, plural) if isinstance(group, str) and isinstance(plural, str) else None


def calls_in(tree: ast.Module, where: str, names: Iterable[str]) -> Iterator[ApiCall]:
    """Yield the client methods named in a module.

    :param tree: the module
    :param where: its name, for messages
    :param names: the client methods to look for
    """
    names = set(names)
    constants = _constants(tree)
    streamed = {
        node.args[0].attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "stream"
        and node.args
        and isinstance(node.args[0], ast.Attribute)
    }
    called = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in names:
            called.add(id(node.func))
            method = node.func.attr
            watch_kwarg = any(k.arg == "watch" and not _is_false(k.value) for k in node.keywords)
            custom = _custom_target(node, method, constants) if "custom_object" in method else None
            namespace = _named_namespace(node, method, constants)
            yield ApiCall(method, where, method in streamed or watch_kwarg, custom, namespace)
    for node in ast.walk(tree):
        # A method handed on uncalled (to a pager, to ``Watch().stream``) is called there.
        if isinstance(node, ast.Attribute) and node.attr in names and id(node) not in called:
            yield ApiCall(node.attr, where, node.attr in streamed)


def _named_namespace(call: ast.Call, method: str, constants: dict[str, object]) -> str:
    """Return the namespace a call gives as a literal or a module constant, else ``""``."""
    import kubernetes.client

    if "namespaced" not in method:
        return ""
    cls = next(getattr(kubernetes.client, c) for c, _, _ in client_endpoints()[method])
    params = [p for p in inspect.signature(getattr(cls, method)).parameters if p != "self"]
    if "namespace" not in params:
        return ""
    at = params.index("namespace")
    nodes = [k.value for k in call.keywords if k.arg == "namespace"]
    if not nodes and at < len(call.args) and not any(isinstance(a, ast.Starred) for a in call.args[: at + 1]):
        nodes = [call.args[at]]
    value = _literal(nodes[0], constants) if nodes else None
    return value if isinstance(value, str) else ""


def _is_false(node: ast.expr) -> bool:
    return isinstance(node, ast.Constant) and node.value is False


@cache
def hook_methods() -> dict[str, frozenset[ApiCall]]:
    """Return the client calls of each ``KubernetesHook`` method, its calls of other hook methods included."""
    tree = ast.parse(module_index()[PROVIDER_HOOK].read_text())
    methods: dict[str, list[ast.stmt]] = {}  # the sync hook's and the async hook's methods of one name
    for cls in tree.body:
        for node in cls.body if isinstance(cls, ast.ClassDef) else ():
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                methods.setdefault(node.name, []).append(node)
    direct = {
        name: set(
            calls_in(ast.Module(body=nodes, type_ignores=[]), f"KubernetesHook.{name}", client_endpoints())
        )
        for name, nodes in methods.items()
    }
    used = {
        name: {
            n.attr
            for node in nodes
            for n in ast.walk(node)
            if isinstance(n, ast.Attribute) and n.attr in methods
        }
        for name, nodes in methods.items()
    }
    closed: dict[str, frozenset[ApiCall]] = {}
    for name in methods:
        reach, todo = set(), [name]
        while todo:
            if (current := todo.pop()) not in reach:
                reach.add(current)
                todo += used[current]
        closed[name] = frozenset(call for m in reach for call in direct[m])
    return closed


def component_calls(roots: Iterable[str]) -> set[ApiCall]:
    """Return the client calls of a component's modules and of the hook methods they call."""
    index = module_index()
    hooks = hook_methods()
    found: set[ApiCall] = set()
    for module in sorted(component_modules(roots)):
        tree = ast.parse(index[module].read_text())
        found |= set(calls_in(tree, module, client_endpoints()))
        for name in {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)} & set(hooks):
            found |= hooks[name]
    return found


def needed(calls: Iterable[ApiCall]) -> dict[Permission, set[str]]:
    """Return the permissions some calls need, each with the calls (``module: method``) that need it."""
    out: dict[Permission, set[str]] = {}
    for call in calls:
        if "custom_object" in call.method and call.custom is None:
            raise AssertionError(
                f"{call.where}: cannot tell the group and plural of its {call.method} call: "
                "pass them as literals or module-level constants"
            )
        endpoints = client_endpoints()[call.method]
        # A name on several API classes (CoreV1Api and EventsV1Api both list events): the core one.
        core = {e for e in endpoints if e[0] == "CoreV1Api"} or endpoints
        for _, path, http in core:
            for permission in permissions_of(
                call.method, http, path, watched=call.watched, custom=call.custom, namespace=call.namespace
            ):
                out.setdefault(permission, set()).add(f"{call.where}: {call.method}")
    return out
