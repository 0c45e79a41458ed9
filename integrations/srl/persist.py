"""A Conduit checkpoint as bytes, so SRL can pickle a Conduit buffer (``save_buffer_on_exit``).

SRL's trainer pickles the whole buffer object into its parameter DB and unpickles
it on ``load_buffer_on_restart``. A Conduit replay buffer's rows live in a running
runtime (threads, storage, maybe CUDA memory), which does not pickle; so its pickle
carries Conduit's own checkpoint instead: ``Conduit.save`` writes the versioned,
checksummed directory, its files travel as bytes, and unpickling writes them back
and loads them with ``Conduit.restore`` — which checks every checksum and reads
each file with ``torch.load(weights_only=True)``, so a tampered checkpoint fails
with :class:`~conduit.errors.CheckpointError` rather than running code.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import conduit
from conduit import CheckpointError

__all__ = ["checkpoint_bytes", "restore_into", "written"]

#: the checkpoint's directory name inside the temporary folder
_NAME = "conduit-srl-buffer"


def checkpoint_bytes(edp: conduit.Conduit, timeout: float | None = None) -> dict[str, bytes]:
    """``edp.save(...)`` as ``{relative path: bytes}``."""
    with tempfile.TemporaryDirectory(prefix="conduit-srl-") as tmp:
        root = edp.save(Path(tmp) / _NAME, timeout=timeout)
        return {str(f.relative_to(root)): f.read_bytes() for f in sorted(root.rglob("*")) if f.is_file()}


@contextmanager
def written(files: Mapping[str, bytes]) -> Iterator[Path]:
    """The checkpoint directory of ``files`` (from :func:`checkpoint_bytes`), for the duration of the block."""
    with tempfile.TemporaryDirectory(prefix="conduit-srl-") as tmp:
        root = Path(tmp) / _NAME
        for rel, data in files.items():
            target = (root / rel).resolve()
            if root.resolve() not in target.parents:
                raise CheckpointError(f"a pickled Conduit SRL buffer names a file outside its checkpoint: {rel!r}")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
        yield root


def restore_into(edp: conduit.Conduit, files: Mapping[str, bytes]) -> None:
    """Load ``files`` into the fresh ``edp`` and start it (its hooks must be registered already)."""
    with written(files) as root:
        edp.restore(root)
        edp.start()
