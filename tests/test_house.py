"""The shape of the codebase: no import cycles, no reaching into private names, small modules, safe loads.

Each check reads the source (``ast``), so it runs in milliseconds and fails with the
offending place named.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: import name -> folder (pyproject's package-dir), and the harness beside them
PACKAGES = {"conduit": "conduit", "conduit.integrations": "integrations", "conduit.cli": "cli", "benchmarks": "benchmarks"}
#: RLlib's own private hook points the adapter overrides or reads (integrations/rllib/_compat.py says why)
RLLIB_PRIVATE = {
    "_learner_connector", "_create_iterator_if_necessary", "_make_batch_if_necessary",
    "_create_local_replay_buffer_if_necessary",
}
MAX_LINES = 500


def _modules() -> dict[str, Path]:
    out = {}
    for pkg, folder in PACKAGES.items():
        for f in (ROOT / folder).rglob("*.py"):
            parts = list(f.relative_to(ROOT / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join([pkg, *parts])] = f
    return out


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """Every module of ours ``name`` imports anywhere: at the top, inside functions, under TYPE_CHECKING."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package
                for _ in range(node.level - 1):
                    up = up.rpartition(".")[0]
                base = f"{up}.{base}" if node.module else up
            # ``from pkg import sub`` imports the submodule; ``from mod import name`` the module
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        for t in targets:
            while t and t not in known:  # ``import conduit.storage.tensor`` -> the module itself
                t = t.rpartition(".")[0]
            if t and t != name:
                found.add(t)
    return found


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycles():
    modules = _modules()
    known = set(modules) | {"conduit._native"}  # the C extension: a leaf
    graph: dict[str, set[str]] = defaultdict(set)
    for name, path in modules.items():
        graph[name] |= _imports(name, path, known)
    assert _cycles(graph) == []


def test_the_core_never_imports_the_planner_the_cli_the_adapters_or_the_harness():
    modules = _modules()
    known = set(modules) | {"conduit._native"}
    # conduit.distributed builds on the runtime as scheduling does (a shard is a runtime): above the core too
    above = ("conduit.scheduling", "conduit.distributed", "conduit.cli", "conduit.integrations", "benchmarks")
    for name, path in modules.items():
        if name.startswith(above) or not name.startswith("conduit"):
            continue
        bad = sorted(t for t in _imports(name, path, known) if t.startswith(above))
        assert not bad, f"{name} imports {bad}: the runtime sits below scheduling, the CLI and the adapters"
    vocabulary = _imports("conduit.core", modules["conduit.core"], known)
    assert vocabulary == set(), f"conduit.core must import nothing of Conduit, imports {sorted(vocabulary)}"


def test_adapters_and_cli_use_only_public_names_of_the_core():
    """No ``obj._name`` (but on ``self``, ``cls``, ``super()``) and no ``from conduit... import _name``."""
    offences = []
    for folder in ("integrations", "cli"):
        for f in sorted((ROOT / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(f.read_text())):
                where = f"{f.relative_to(ROOT)}:{getattr(node, 'lineno', 0)}"
                if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("conduit"):
                    offences += [f"{where}: import {a.name}" for a in node.names if _private(a.name)]
                if isinstance(node, ast.Attribute) and _private(node.attr) and node.attr not in RLLIB_PRIVATE:
                    v = node.value
                    mine = isinstance(v, ast.Name) and v.id in ("self", "cls")
                    parent = isinstance(v, ast.Call) and isinstance(v.func, ast.Name) and v.func.id == "super"
                    if not (mine or parent):
                        offences.append(f"{where}: {ast.unparse(node)}")
    assert offences == []


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


#: the modules an adapter may import from, each by its ``__all__``: the API, the extension surface, the sharded
#: runtime, and the stage-wave planner (above the core, so ``conduit.ext`` cannot re-export it)
SURFACE = ("conduit", "conduit.ext", "conduit.distributed", "conduit.scheduling.stages")


def test_adapters_import_only_the_public_surface():
    import importlib

    public = {m: set(importlib.import_module(m).__all__) for m in SURFACE}
    offences = []
    for f in sorted((ROOT / "integrations").rglob("*.py")):
        for node in ast.walk(ast.parse(f.read_text())):
            where = f"{f.relative_to(ROOT)}:{getattr(node, 'lineno', 0)}"
            if isinstance(node, ast.ImportFrom) and not node.level:
                mod = node.module or ""
                if not mod.startswith("conduit") or mod.startswith("conduit.integrations"):
                    continue
                if mod not in public:
                    offences.append(f"{where}: from {mod} import ...")
                else:
                    offences += [f"{where}: {mod}.{a.name}" for a in node.names if a.name not in public[mod]]
            elif isinstance(node, ast.Import):
                offences += [
                    f"{where}: import {a.name}" for a in node.names
                    if a.name.startswith("conduit.") and a.name not in public
                    and not a.name.startswith("conduit.integrations")
                ]
    assert offences == [], "\n".join(offences)


#: what only the core may make (conduit/executor.py is the one place for threads, streams and events)
CONCURRENCY = {
    "Thread": "a thread", "Timer": "a thread", "ThreadPoolExecutor": "a thread pool",
    "ProcessPoolExecutor": "a process pool", "Process": "a process", "Pool": "a process pool",
    "Stream": "a CUDA stream", "Event": "a CUDA event or a threading event", "start_new_thread": "a thread",
}
#: the locks an adapter may hold, each with what it guards; none guards a store of experience
ADAPTER_LOCKS = {
    ("integrations/srl/install.py", "_lock"): "registering the buffer names in SRL's make_buffer, once per module",
    ("integrations/srl/consumer.py", "_lock"): "making one consumer class per SRL stream module",
    ("integrations/srl/prioritized.py", "_classes_lock"): "making one PER class per SRL buffer module",
    ("integrations/verl/plugin.py", "LOCK"): "registering the V1 trainers once per process",
    ("integrations/srl/replay.py", "self._lock"): "the runtime's creation at the first put (the replay counts "
    "are the runtime's: count_replays)",
    ("integrations/rllib/buffer.py", "self._lock"): "RLlib's metrics and the batches handed out, kept consistent "
    "with each add, sample and priority update (the rows are the runtime's or RLlib's own buffer's)",
}


def test_adapters_start_no_thread_pool_stream_or_event_and_keep_no_locked_store():
    """Threads, pools, processes, CUDA streams and events are the core's (``conduit.ext`` hands adapters its
    worker, streams, hand-off and reuse queue); a lock in an adapter is listed above with what it guards."""
    offences, locks, assigned = [], set(), set()
    for f in sorted((ROOT / "integrations").rglob("*.py")):
        rel = str(f.relative_to(ROOT))
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Call):
                fn = node.func
                name = fn.attr if isinstance(fn, ast.Attribute) else fn.id if isinstance(fn, ast.Name) else ""
                if name in CONCURRENCY:
                    offences.append(f"{rel}:{node.lineno}: {ast.unparse(fn)}() makes {CONCURRENCY[name]}")
                if name in ("Lock", "RLock", "Condition", "Semaphore", "BoundedSemaphore"):
                    locks.add((rel, node.lineno))
            if isinstance(node, (ast.Assign, ast.AnnAssign)):
                value = node.value
                if isinstance(value, ast.Call) and ast.unparse(value.func).split(".")[-1] in ("Lock", "RLock"):
                    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                    for t in targets:
                        if (rel, ast.unparse(t)) not in ADAPTER_LOCKS:
                            offences.append(f"{rel}:{node.lineno}: {ast.unparse(t)} = {ast.unparse(value)}")
                    assigned.add((rel, value.lineno))
    offences += [f"{rel}:{line}: a lock made outside an assignment" for rel, line in sorted(locks - assigned)]
    assert offences == [], "\n".join(offences)


def test_no_module_is_over_500_lines():
    long = {
        str(p.relative_to(ROOT)): n
        for p in _modules().values()
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert long == {}


def test_every_torch_load_of_the_package_refuses_arbitrary_objects():
    """``torch.load`` unpickles; only ``weights_only=True`` keeps a tampered file from running code."""
    unsafe = []
    for name, path in _modules().items():
        if name.startswith("benchmarks"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and ast.unparse(node.func) == "torch.load":
                kw = {k.arg: k.value for k in node.keywords}
                safe = isinstance(kw.get("weights_only"), ast.Constant) and kw["weights_only"].value is True
                if not safe:
                    unsafe.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert unsafe == []


#: a measured figure: a number with a unit of time, bandwidth, a ratio or a percentage
FIGURE = re.compile(r"\d[\d.,]*\s*(?:-\s*\d[\d.,]*\s*)?(?:ms\b|µs\b|us\b|ns\b|GB/s|MB/s|GiB/s|x\s+(?:faster|slower)|x\b|×|%)")


def _prose_lines(src: str) -> dict[int, str]:
    """Comments and docstrings (string statements) by line number."""
    lines = src.splitlines()
    prose: dict[int, str] = {}
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            for i in range(node.lineno, (node.end_lineno or node.lineno) + 1):
                prose[i] = lines[i - 1]
    for tok in tokenize.generate_tokens(io.StringIO(src).readline):
        if tok.type == tokenize.COMMENT:
            prose[tok.start[0]] = prose.get(tok.start[0], "") + tok.string
    return prose


def test_measured_figures_live_in_benchmarks_md_not_in_the_code():
    """Fewer than 15 lines of comments and docstrings in the package carry a measured figure."""
    found = []
    for name, path in sorted(_modules().items()):
        if name.startswith("benchmarks"):
            continue
        for i, text in _prose_lines(path.read_text()).items():
            if FIGURE.search(text):
                found.append(f"{path.relative_to(ROOT)}:{i}: {text.strip()}")
    assert len(found) < 15, "\n".join(found)


#: a citation of a design document outside the repository (the project carries its own: docs/design.md)
OUTSIDE = re.compile(r"(?<!docs/)\bDESIGN\.md|research notes|\.\./shared\b|srl_gear_reverb\.md")
DESIGN = ROOT / "docs" / "design.md"


def test_the_code_cites_the_projects_own_design_page_and_its_sections_exist():
    """Code, scripts and tests cite ``docs/design.md §N``, never a document the repository does not carry,
    and every section cited is a heading of that page."""
    sections = set(re.findall(r"^## (\d+)\.", DESIGN.read_text(), flags=re.M))
    outside, missing = [], []
    for folder in ("conduit", "integrations", "cli", "benchmarks", "scripts", "examples", "tests"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path == Path(__file__):
                continue
            text = path.read_text()
            outside += [f"{path.relative_to(ROOT)}: {m.group(0)}" for m in OUTSIDE.finditer(text)]
            missing += [f"{path.relative_to(ROOT)}: §{n}" for n in re.findall(r"docs/design\.md §(\d+)", text)
                        if n not in sections]
    assert not outside, f"citations of documents outside the repository: {outside}"
    assert not missing, f"sections of docs/design.md that do not exist: {missing}"


#: the runtime's one face to a buffer (``push``/``flush``/``pull``/``minibatches`` are the runtime's own)
BUFFER_FACE = {"update_priorities", "state_dict", "load_state_dict"}
#: the buffer's side doors still called from outside the runtime (none left; a new one must be named here, with why)
BUFFER_SIDE_DOORS: set[tuple[str, str]] = set()


def test_adapters_and_the_sharded_runtime_reach_a_buffer_only_through_its_face():
    """A call on a runtime's buffer (``buf`` / ``buffer`` / ``<runtime>.buffer``) from ``integrations/`` or
    ``conduit/distributed/`` outside the face is one of the listed side doors; the list only shrinks (a door
    closed leaves it). A delivery path's own draws are the route itself (a class deriving ``DeliveryPath``: the
    sharded buffer's global draw is its path's row source, as one process's draw is its path's)."""
    import inspect

    from conduit.buffers.replay import ReplayBuffer

    methods = {n for n, _ in inspect.getmembers(ReplayBuffer, inspect.isfunction) if not n.startswith("_")}
    found, routes = set(), 0
    for folder in ("integrations", "conduit/distributed"):
        for f in sorted((ROOT / folder).rglob("*.py")):
            rel = str(f.relative_to(ROOT))
            tree = ast.parse(f.read_text())
            paths = [c for c in ast.walk(tree) if isinstance(c, ast.ClassDef)
                     and any(ast.unparse(b) == "DeliveryPath" for b in c.bases)]
            inside = {id(n) for c in paths for n in ast.walk(c)}
            for node in ast.walk(tree):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in methods:
                    receiver = ast.unparse(node.func.value)
                    if re.fullmatch(r"buf|buffer|\w*(edp|shard)\.buffer", receiver) and node.func.attr not in BUFFER_FACE:
                        if id(node) in inside:
                            routes += 1
                        else:
                            found.add((rel, node.func.attr))
    assert routes, "the global draw's own buffer calls are inside its delivery path"
    assert found - BUFFER_SIDE_DOORS == set(), "new side doors into a buffer"
    assert BUFFER_SIDE_DOORS - found == set(), "closed side doors: take them off BUFFER_SIDE_DOORS"
