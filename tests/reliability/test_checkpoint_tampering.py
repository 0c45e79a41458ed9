"""Promise: a damaged, foreign or tampered checkpoint fails with ``CheckpointError`` in bounded time and memory.

The manifest's ``COMPLETE`` checksum is not a signature: anyone can edit ``MANIFEST.json`` and reseal it
(write the sha256 of the edited manifest into ``COMPLETE``). Each case below does exactly that (or swaps a
file for something that is not a regular file), then loads the checkpoint in a child process that reports
what it raised, how long the load took and how much memory it took at its peak. The child runs under an
address-space limit, and a load that hangs is killed: a regression fails its test, never the suite.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import select
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from conduit import Conduit
from tests.helpers import transitions

ROOT = Path(__file__).resolve().parents[2]
#: what a load may take, on a loaded 2-core host (a checkpoint of 48 slots loads in milliseconds)
SECONDS = 20.0
#: the most a load may add to the child's peak resident memory (the absurd sizes below ask for gigabytes)
PEAK_MB = 400.0

_CHILD = textwrap.dedent(
    f"""
    import json, resource, sys, time
    sys.path.insert(0, {str(ROOT)!r})
    from conduit import Conduit, CheckpointError
    from conduit.checkpoint import load

    def vm_bytes():
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmSize:"):
                    return int(line.split()[1]) * 1024
        return None

    vm = vm_bytes()
    if vm is not None:  # a regression that allocates gigabytes fails fast instead of swamping the host
        resource.setrlimit(resource.RLIMIT_AS, (vm + (3 << 30), resource.RLIM_INFINITY))
    print("ready", flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        t0 = time.monotonic()
        out = {{"error": None, "message": "", "checkpoint_error": False}}
        try:
            if req["call"] == "load":
                load(req["path"])
            else:
                edp = Conduit.from_checkpoint(req["path"])
                try:
                    edp.start()
                finally:
                    edp.close()
        except BaseException as e:
            out.update(error=type(e).__name__, message=str(e), checkpoint_error=isinstance(e, CheckpointError))
        out["seconds"] = time.monotonic() - t0
        out["peak_mb"] = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
        print(json.dumps(out), flush=True)
    """
)


class Loader:
    """A child process that loads checkpoints on request; one that hangs is killed and replaced."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen[str] | None = None

    def _line(self, timeout: float) -> str | None:
        assert self.proc is not None and self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        return self.proc.stdout.readline() if ready else None

    def _start(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT
        )
        assert (self._line(180.0) or "").strip() == "ready", "the loading child did not start"

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self.proc = None

    def __call__(self, call: str, path: Path) -> dict[str, Any]:
        if self.proc is None or self.proc.poll() is not None:
            self._start()
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"call": call, "path": str(path)}) + "\n")
        self.proc.stdin.flush()
        line = self._line(3 * SECONDS)
        if not line:  # hung (or died): a fresh child for the next case
            self.stop()
            return {"error": "hung", "message": f"no answer within {3 * SECONDS:.0f}s", "checkpoint_error": False}
        out = json.loads(line)
        if out["peak_mb"] > PEAK_MB:  # its peak is spent: the next case measures in a fresh child
            self.stop()
        return out


@pytest.fixture(scope="module")
def loader() -> Iterator[Loader]:
    child = Loader()
    yield child
    child.stop()


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    where = tmp_path_factory.mktemp("saved") / "ck"
    with Conduit(policy="off_policy", train_batch_size=4, capacity=48, seed=0) as edp:
        edp.push(transitions(16))
        edp.flush()
        edp.save(where)
    return where


@pytest.fixture
def ck(saved: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "ck"
    shutil.copytree(saved, copy)
    return copy


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def reseal(ck: Path, edit: Callable[[dict[str, Any]], Any]) -> None:
    """Edit the manifest and seal it again, as anyone can: the checksum is not a signature."""
    manifest = json.loads((ck / "MANIFEST.json").read_text())
    result = edit(manifest)
    text = json.dumps(manifest if result is None else result)
    (ck / "MANIFEST.json").write_text(text)
    (ck / "COMPLETE").write_text(_sha(text.encode()))


def _entry(f: Path) -> dict[str, Any]:
    data = f.read_bytes()
    return {"sha256": _sha(data), "bytes": len(data)}


# -- the cases: each damages the checkpoint ``ck`` (``outside`` is a folder beside it) ---------------------
def symlink_to_dev_zero(ck: Path, name: str) -> None:
    (ck / name).unlink()
    (ck / name).symlink_to("/dev/zero")


def fifo(ck: Path, name: str) -> None:
    (ck / name).unlink()
    os.mkfifo(ck / name)


def data_symlink_out(ck: Path, outside: Path) -> None:
    """buffer.pt a symlink to a copy outside (same bytes: every checksum matches)."""
    shutil.copy(ck / "buffer.pt", outside / "buffer.pt")
    (ck / "buffer.pt").unlink()
    (ck / "buffer.pt").symlink_to(outside / "buffer.pt")


def component_out(ck: Path, outside: Path, absolute: bool) -> None:
    """The buffer's state read from a file outside the directory, the manifest naming it."""
    shutil.move(ck / "buffer.pt", outside / "buffer.pt")
    name = str(outside / "buffer") if absolute else f"../{outside.name}/buffer"

    def edit(m: dict[str, Any]) -> None:
        m["files"].pop("buffer.pt")
        m["files"][f"{name}.pt"] = _entry(outside / "buffer.pt")
        m["components"] = [name if c == "buffer" else c for c in m["components"]]

    reseal(ck, edit)


def huge_capacity(ck: Path, capacity: int, in_data_too: bool) -> None:
    if in_data_too:  # the buffer's own state says so too (its file rewritten, its checksum recorded)
        state = torch.load(ck / "buffer.pt", weights_only=True)
        state["capacity"] = capacity
        torch.save(state, ck / "buffer.pt")

    def edit(m: dict[str, Any]) -> None:
        m["config"]["capacity"] = capacity
        m["files"]["buffer.pt"] = _entry(ck / "buffer.pt")

    reseal(ck, edit)


def _set(key: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def edit(m: dict[str, Any]) -> None:
        if value is _DELETE:
            del m[key]
        else:
            m[key] = value

    return edit


_DELETE = object()

CASES: dict[str, tuple[str, Callable[[Path, Path], Any], str]] = {
    # name: (call, damage, what the error must say)
    "data-file-symlink-to-dev-zero": ("from_checkpoint", lambda ck, o: symlink_to_dev_zero(ck, "buffer.pt"),
                                      r"buffer\.pt.*symbolic link"),
    "data-file-fifo": ("from_checkpoint", lambda ck, o: fifo(ck, "buffer.pt"), r"buffer\.pt.*FIFO"),
    "data-file-fifo-load": ("load", lambda ck, o: fifo(ck, "delivery.pt"), r"delivery\.pt.*FIFO"),
    "manifest-symlink-to-dev-zero": ("from_checkpoint", lambda ck, o: symlink_to_dev_zero(ck, "MANIFEST.json"),
                                     r"MANIFEST\.json.*symbolic link"),
    "complete-fifo": ("from_checkpoint", lambda ck, o: fifo(ck, "COMPLETE"), r"COMPLETE.*FIFO"),
    "data-file-symlink-out": ("from_checkpoint", data_symlink_out, r"buffer\.pt.*symbolic link"),
    "component-dotdot": ("from_checkpoint", lambda ck, o: component_out(ck, o, absolute=False),
                         r"not a file name"),
    "component-absolute": ("load", lambda ck, o: component_out(ck, o, absolute=True), r"not a file name"),
    "capacity-1e8": ("from_checkpoint", lambda ck, o: huge_capacity(ck, 10**8, False), "capacity"),
    "capacity-1e13": ("from_checkpoint", lambda ck, o: huge_capacity(ck, 10**13, False), "capacity"),
    "capacity-1e8-in-data-too": ("from_checkpoint", lambda ck, o: huge_capacity(ck, 10**8, True), "capacity"),
    "manifest-not-an-object": ("from_checkpoint", lambda ck, o: reseal(ck, lambda m: [m]), "JSON object"),
    "files-not-a-mapping": ("load", lambda ck, o: reseal(ck, _set("files", ["buffer.pt"])), "files"),
    "files-entry-not-a-mapping": ("load", lambda ck, o: reseal(ck, lambda m: m["files"].update({"buffer.pt": 7})),
                                  "files"),
    "components-not-a-list": ("load", lambda ck, o: reseal(ck, _set("components", 5)), "components"),
    "config-missing": ("from_checkpoint", lambda ck, o: reseal(ck, _set("config", _DELETE)), "config"),
    "config-not-a-mapping": ("from_checkpoint", lambda ck, o: reseal(ck, _set("config", "capacity=48")), "config"),
    "config-bad-value": ("from_checkpoint",
                         lambda ck, o: reseal(ck, lambda m: m["config"].update({"capacity": "many"})), "capacity"),
    "schedule-not-a-mapping": ("from_checkpoint", lambda ck, o: reseal(ck, _set("schedule", [1, 2])), "schedule"),
    "schedule-malformed": ("from_checkpoint",
                           lambda ck, o: reseal(ck, _set("schedule", {"ingestion": {"overlap": True}})), "schedule"),
    "schedule-infeasible": ("from_checkpoint", lambda ck, o: reseal(
        ck, lambda m: m["schedule"]["delivery"].update({"granularity": "99"})), "schedule"),
    "spec-malformed": ("from_checkpoint", lambda ck, o: reseal(ck, _set("spec", {"obs": {"dtype": "float32"}})),
                       "spec"),
    "policy-missing": ("from_checkpoint", lambda ck, o: reseal(ck, _set("policy", _DELETE)), "policy"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_tampered_checkpoint_fails_with_checkpoint_error_in_bounded_time_and_memory(case, ck, tmp_path, loader):
    call, damage, says = CASES[case]
    outside = tmp_path / "outside"
    outside.mkdir()
    damage(ck, outside)
    out = loader(call, ck)
    assert out["checkpoint_error"], f"{case}: {out['error']}: {out['message']}"
    assert str(ck) in out["message"], out["message"]  # names the checkpoint
    assert re.search(says, out["message"]), out["message"]
    assert out["seconds"] < SECONDS, out
    assert out["peak_mb"] < PEAK_MB, out


def test_the_loader_itself_loads_an_untampered_copy(ck, loader):
    """The child's harness is sound: the same calls on a good copy succeed, quickly and small."""
    for call in ("from_checkpoint", "load"):
        out = loader(call, ck)
        assert out["error"] is None, out
        assert out["seconds"] < SECONDS and out["peak_mb"] < PEAK_MB, out


def test_a_state_file_rewritten_without_a_field_fails_with_checkpoint_error_when_the_runtime_starts(ck, loader):
    """A state ``capture`` never writes (the slot table's count removed, the file's checksum recorded anew):
    restoring it is a CheckpointError saying which state is malformed, not a bare KeyError."""
    state = torch.load(ck / "buffer.pt", weights_only=True)
    del state["table"]["count"]
    torch.save(state, ck / "buffer.pt")
    reseal(ck, lambda m: m["files"].update({"buffer.pt": _entry(ck / "buffer.pt")}))
    out = loader("from_checkpoint", ck)
    assert out["checkpoint_error"], out
    assert "buffer state is malformed" in out["message"] and "count" in out["message"], out["message"]
    assert out["seconds"] < SECONDS and out["peak_mb"] < PEAK_MB, out
