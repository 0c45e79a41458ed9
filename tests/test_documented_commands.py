"""Every command and dotted path the pages and docstrings tell a user to run exists and answers.

The pages (README.md, BENCHMARKS.md, docs/*.md) and the docstrings of the library, the adapters, the
examples, the scripts and the benchmarks name commands: ``python examples/x.py``, ``python -m
benchmarks.y``, ``scripts/z.sh``, ``conduit bench micro``, and verl's ``pkg://module`` + ``name=Class``.
A renamed file or a moved class would leave a user with a command that fails as pasted; here each is
found by reading the text, and each must exist and answer ``--help`` (a shell script: parse), each
``conduit`` subcommand must be one, and each ``pkg://`` path must name the class it is given with.
Whole runs of the examples and benchmarks have their own tests (``test_examples.py``,
``tests/integrations/``, ``test_bench.py``); the GPU script's run is ``scripts/gpu-checks.sh``'s.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", ROOT / "BENCHMARKS.md", *sorted((ROOT / "docs").glob("*.md"))]
SOURCES = [
    f
    for folder in ("conduit", "integrations", "cli", "examples", "scripts", "benchmarks")
    for f in sorted((ROOT / folder).rglob("*"))
    if f.suffix in (".py", ".sh")
]
TEXT = {f: f.read_text() for f in PAGES + SOURCES}

#: what a user would paste: a file run with python (or a module with -m), a script, a conduit command
FILE_RUN = re.compile(r"python3? ((?:examples|scripts|benchmarks)/[\w-]+\.py)")
MODULE_RUN = re.compile(r"python3? -m (benchmarks(?:\.\w+)?)\b")
SCRIPT = re.compile(r"(?<![\w/.])(scripts/[\w-]+\.(?:sh|py))")
CONDUIT = re.compile(r"(?<![\w./-])conduit ((?:[a-z]+ ?){1,2})")
PKG = re.compile(r"path=pkg://([\w.]+)[\s\S]{0,200}?\bname=(\w+)")


def _found(pattern: re.Pattern[str]) -> list[str]:
    return sorted({m.group(1).strip() for text in TEXT.values() for m in pattern.finditer(text)})


def test_the_pages_name_commands_at_all():
    assert {"examples/dqn_corridor.py", "scripts/planner_sweep.py"} <= set(_found(FILE_RUN))
    assert "benchmarks.srl_buffer" in _found(MODULE_RUN)
    assert {"scripts/run-tests.sh", "scripts/run-profile.sh"} <= set(_found(SCRIPT))


@pytest.mark.parametrize("path", sorted(set(_found(SCRIPT)) | set(_found(FILE_RUN))))
def test_a_documented_file_exists(path):
    assert (ROOT / path).is_file(), f"{path} is named in the docs but is not in the repository"


@pytest.mark.parametrize("path", [p for p in _found(SCRIPT) if p.endswith(".sh")])
def test_a_documented_shell_script_parses(path):
    subprocess.run(["bash", "-n", str(ROOT / path)], check=True)


@pytest.mark.parametrize(
    "command",
    [["python", p] for p in sorted(set(_found(FILE_RUN)) | {p for p in _found(SCRIPT) if p.endswith(".py")})]
    + [["python", "-m", m] for m in _found(MODULE_RUN)],
    ids=lambda c: " ".join(c[1:]),
)
def test_a_documented_python_command_answers_help(command):
    needs = {
            "examples/rllib_": "ray", "scripts/bench_rllib": "ray", "examples/verl_": "verl", "benchmarks/verl_": "verl",
        }
    for prefix, module in needs.items():
        if command[-1].startswith(prefix) and importlib.util.find_spec(module) is None:
            pytest.skip(f"{module} is not installed (its extra)")
    done = subprocess.run(
        [sys.executable, *command[1:], "--help"], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, f"`{' '.join(command)} --help` failed:\n{done.stdout}\n{done.stderr}"
    assert "usage" in done.stdout.lower(), done.stdout


def _conduit_commands() -> list[list[str]]:
    """The documented ``conduit`` words that are commands: each prefix the click group resolves."""
    from conduit.cli.main import app

    root = typer.main.get_command(app)
    out = set()
    for words in _found(CONDUIT):
        path, group = [], root
        for word in words.split():  # (typer carries its own click: groups are told by their methods)
            if not hasattr(group, "list_commands") or word not in group.list_commands(group.context_class(group)):
                break
            path.append(word)
            group = group.get_command(group.context_class(group), word)
            if path == ["bench"]:  # a lazy group: its commands are the harness's, imported when it runs
                from conduit.cli import harness

                group = typer.main.get_command(harness.app)
        if path:
            out.add(tuple(path))
    return [list(p) for p in sorted(out)]


def test_the_documented_conduit_commands_include_each_top_level_command():
    assert {("profile",), ("plan",), ("bench",), ("bench", "micro")} <= {tuple(c) for c in _conduit_commands()}


@pytest.mark.parametrize("words", _conduit_commands(), ids=" ".join)
def test_a_documented_conduit_command_answers_help(words):
    from conduit.cli.main import app

    result = CliRunner().invoke(app, [*words, "--help"])
    assert result.exit_code == 0, result.output
    assert "Usage" in result.output


@pytest.mark.parametrize("module,name", sorted({(m.group(1), m.group(2)) for t in TEXT.values() for m in PKG.finditer(t)}))
def test_a_documented_pkg_path_names_the_class(module, name):
    """verl's ``custom_sampler.path=pkg://<module>`` with ``name=<Class>``: the module imports, the class is there."""
    pytest.importorskip("verl")
    cls = getattr(importlib.import_module(module), name, None)
    assert cls is not None, f"pkg://{module} holds no {name}"
