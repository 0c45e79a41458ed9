"""Packaging: every subpackage is listed, and `import conduit` stays light."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]
MAPPING = {"conduit": "conduit", "conduit.integrations": "integrations", "conduit.cli": "cli"}


def _folder(package: str) -> Path:
    """Where ``package`` lives in the checkout (``MAPPING`` is pyproject's package-dir)."""
    top = max((p for p in MAPPING if package == p or package.startswith(p + ".")), key=len)
    rest = package[len(top) :].lstrip(".")
    return ROOT / MAPPING[top] / Path(*rest.split(".")) if rest else ROOT / MAPPING[top]


def test_every_package_folder_is_listed_in_pyproject():
    """Code packages (an ``__init__.py``) and data-only ones (package data, no Python) alike, so setuptools
    ships every folder it finds without warning that one is absent from ``packages``."""
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(setuptools["packages"])
    found = set()
    for pkg, folder in MAPPING.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder)
            found.add(".".join([pkg, *rel.parts]) if rel.parts else pkg)
    data_only = {pkg for pkg in setuptools["package-data"] if pkg not in found}
    for pkg in data_only:
        folder = _folder(pkg)
        assert folder.is_dir() and not list(folder.glob("*.py")), f"{pkg}: expected a folder of data files, {folder}"
        for pattern in setuptools["package-data"][pkg]:
            assert list(folder.glob(pattern)), f"{pkg}: package-data {pattern!r} matches nothing in {folder}"
    found |= data_only
    assert found == listed, f"missing from pyproject: {sorted(found - listed)}; stale: {sorted(listed - found)}"


def test_import_conduit_does_not_import_cli_frameworks_or_the_harness():
    code = (
        "import sys, conduit; "
        "bad = [m for m in sys.modules if m.split('.')[0] in ('typer', 'rich', 'ray', 'gymnasium', 'benchmarks') "
        "or m.startswith(('conduit.cli', 'conduit.integrations'))]; "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_import_conduit_is_lazy_and_every_name_and_submodule_still_resolves():
    """``conduit --help`` must not pay for torch: ``import conduit`` imports no torch; the first public name
    that needs it does; a submodule read as an attribute (``conduit.errors``) is imported on the spot."""
    code = (
        "import sys, conduit; assert 'torch' not in sys.modules, 'torch at import'; "
        "assert conduit.errors.ConfigError.__name__ == 'ConfigError'; "
        "assert conduit.Conduit.__name__ == 'Conduit' and 'torch' in sys.modules; "
        "assert all(getattr(conduit, n) is not None for n in conduit.__all__); "
        "assert set(conduit.__all__) <= set(dir(conduit))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_public_api_is_curated_and_sorted():
    import conduit

    assert conduit.__all__ == sorted(conduit.__all__)
    for name in conduit.__all__:
        assert hasattr(conduit, name), name


def test_the_wheel_ships_the_library_and_not_the_benchmark_harness(tmp_path):
    """``pip wheel .``: the core, the CLI and the adapters; no harness, synthetic workload or validation sweep.

    Built from a copy of the sources: setuptools builds in ``./build``, where modules renamed since an
    earlier build would still lie and be shipped.
    """
    src = tmp_path / "src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(
        ".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache", ".ruff_cache", "*.so",
    ))
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", str(src), "--no-deps", "-q", "-w", str(tmp_path)],
        check=True, capture_output=True, timeout=600,
    )
    (wheel,) = tmp_path.glob("conduit_edp-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    modules = [n for n in names if n.endswith(".py")]
    harness = [n for n in modules if any(w in Path(n).stem for w in ("bench", "synthetic", "validate"))]
    assert harness == [] and not any(n.startswith("benchmarks/") for n in names), harness
    for needed in (
        "conduit/__init__.py", "conduit/runtime.py", "conduit/scheduling/workload.py", "conduit/cli/profile.py",
        "conduit/cli/harness.py", "conduit/integrations/rllib/__init__.py", "conduit/py.typed",
        "conduit/placement/topologies/a100_8x_nvlink.yaml",
    ):
        assert needed in names, needed


#: import name of each declared dependency (pyproject's ``dependencies``), and what is optional by design
IMPORT_NAMES = {"torch": "torch", "numpy": "numpy", "pydantic": "pydantic", "typer": "typer", "rich": "rich",
                "scipy": "scipy", "pyyaml": "yaml"}
OPTIONAL = {
    "psutil",  # conduit.placement.live reads host memory from it when installed, else /proc/meminfo
    "ray",  # conduit.distributed.launch.ray_learners, imported when called (a clear ImportError without the extra)
}


def test_the_core_and_the_cli_import_only_declared_dependencies():
    """A plain install gets only ``dependencies``: an undeclared import (click, which typer no longer brings)
    breaks ``conduit`` on a fresh machine while this checkout's full environment hides it."""
    import ast
    import re

    declared = {
        IMPORT_NAMES[re.split(r"[<>=!~\[ ]", d, maxsplit=1)[0].lower()]
        for d in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    }
    allowed = declared | OPTIONAL | set(sys.stdlib_module_names) | {"conduit"}
    undeclared = []
    for folder in ("conduit", "cli"):
        for f in sorted((ROOT / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(f.read_text())):
                if isinstance(node, ast.Import):
                    tops = [a.name.split(".")[0] for a in node.names]
                elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                    tops = [node.module.split(".")[0]]
                else:
                    continue
                undeclared += [f"{f.relative_to(ROOT)}:{node.lineno}: {t}" for t in tops if t not in allowed]
    assert undeclared == []
