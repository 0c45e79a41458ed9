"""Every Python block of README.md and of the pages under docs/ runs.

A block is either complete — it is written to a file exactly as it appears and run with a fresh
interpreter, as a user who pastes it would — or it says on its first line that it is a fragment
(``# fragment: <what the reader supplies>``); a fragment runs in a namespace holding the
placeholders of ``tests/readme_fixtures.py``. A block whose first lines say ``# requires: <module>``
is skipped where that module is not installed (a framework's extra).
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

import conduit
from tests import readme_fixtures

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCKS = [
    (page, i, block)
    for page in PAGES
    for i, block in enumerate(re.findall(r"```python\n(.*?)```", page.read_text(), flags=re.S))
]


def _requires(block: str) -> list[str]:
    return [m.group(1) for m in re.finditer(r"^# requires: ([\w.]+)", block, flags=re.M)]


def test_the_readme_has_a_complete_quickstart_and_labelled_fragments():
    readme = [b for page, _, b in BLOCKS if page.name == "README.md"]
    complete = [b for b in readme if not b.startswith("# fragment")]
    assert complete and "import conduit" in complete[0]  # the first block is the quickstart, whole
    assert len(complete[0].splitlines()) <= 30


@pytest.mark.parametrize(
    "page,block", [(p, b) for p, _, b in BLOCKS], ids=[f"{p.stem}-block{i}" for p, i, _ in BLOCKS]
)
def test_a_documented_block_runs(page, block, tmp_path):
    fragment = block.startswith("# fragment")
    for module in _requires(block):
        if not _importable(module, fresh=not fragment):
            pytest.skip(f"{module} is not installed")
    if fragment:
        _run_fragment(page, block)
        return
    script = tmp_path / "pasted.py"
    script.write_text(block)
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"{page.name}: the block fails as pasted:\n{done.stdout}\n{done.stderr}"


def _importable(module: str, fresh: bool) -> bool:
    """Whether ``module`` is installed: where the block runs, in this interpreter (a fragment) or a fresh one
    (a complete block) -- an opt-in test may have put a checkout on this session's path only (CONDUIT_SRL_SRC)."""
    if not fresh:
        return importlib.util.find_spec(module) is not None
    probe = f"import importlib.util, sys; sys.exit(importlib.util.find_spec({module!r}) is None)"
    return subprocess.run([sys.executable, "-c", probe], capture_output=True, timeout=120).returncode == 0


def _run_fragment(page: Path, block: str) -> None:
    namespace = {k: v for k, v in vars(readme_fixtures).items() if not k.startswith("__")}
    namespace["conduit"] = conduit
    given = namespace["edp"] = conduit.Conduit(policy="off_policy", train_batch_size=32, capacity=1_000)
    try:
        exec(compile(block, str(page), "exec"), namespace)
    finally:
        for edp in {id(e): e for e in (given, namespace.get("edp"))}.values():
            if isinstance(edp, conduit.Conduit):
                edp.close()
    import torch.distributed as dist

    if dist.is_initialized():  # a block that formed a (one-rank) group leaves the next block none
        dist.destroy_process_group()
