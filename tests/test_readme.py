"""Every Python block of README.md runs as written (placeholders from ``tests/readme_fixtures.py``)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import conduit
from tests import readme_fixtures

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_the_readme_has_python_blocks():
    assert len(BLOCKS) >= 2


@pytest.mark.parametrize("block", BLOCKS, ids=[f"block{i}" for i in range(len(BLOCKS))])
def test_a_readme_block_runs_as_written(block):
    namespace = {k: v for k, v in vars(readme_fixtures).items() if not k.startswith("__")}
    namespace["conduit"] = conduit
    exec(compile(block, str(README), "exec"), namespace)
    edp = namespace.get("edp")
    if isinstance(edp, conduit.Conduit):
        edp.close()
    import torch.distributed as dist

    if dist.is_initialized():  # a block that formed a (one-rank) group leaves the next block none
        dist.destroy_process_group()
