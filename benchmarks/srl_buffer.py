"""SRL's experience buffer vs Conduit's drop-in: exposed delivery latency and push/pull cost.

``python -m benchmarks.srl_buffer [--repeats 7] [--json out.json] [--size small]``; with ``CONDUIT_SRL_SRC``
pointing at an SRL checkout (``openpsi-projects/srl`` or the monorepo) SRL's *own* classes
are timed (its buffer layer needs ``prometheus_client``); without it, a reimplementation
of their behaviour written from SRL's documented protocol (docs/srl.md), with the test suite's
SRL-protocol stub (``tests/integrations/srl_stub.py``) for SRL's types, and the report says which.

Two SRL paths, same samples (``T`` time steps, nested as SRL's actors post them: an ``obs``
record holding the observation vector, an ``action`` record, ``analyzed_result`` with a
``None`` leaf, and the policy fields), same batch:

- **replay** — SRL's ``SimpleReplayBuffer``: storage allocated pinned (``pin_memory``
  is the identity on a machine without CUDA, where torch refuses it), ``get()``
  gathers by fancy indexing into new pageable arrays; vs ``conduit_replay`` (Conduit's
  runtime inside, the batch laid out time-major in staging memory).
- **queue** — SRL's default ``PriorityQueueBuffer`` (stack ``B`` samples on axis 1 at
  ``put``, reuse each entry); vs ``conduit_queue``.

Cases, each a loop of training steps whose update is a fixed matmul workload:

- ``srl inline``: the trainer thread's ``get()`` then ``torch.from_numpy`` of every
  field (what ``GPUThread`` + an algorithm do, without a prefetcher);
- ``srl + prefetch``: SRL's one-step overlap as a thread: a helper thread runs
  ``get()`` and the conversion for batch ``t+1`` while batch ``t`` trains (the
  ``PyTorchGPUPrefetcher``'s lookahead; its CUDA side stream does not exist on a CPU);
- ``conduit``: the drop-in, Conduit's default schedule for this machine.

*Exposed delivery latency* is the trainer thread's time between two updates (getting
the next batch ready as tensors). As in SRL's trainer worker, samples arrive on another
thread: while a queue case runs, a stream thread (the worker's main thread and its
``consume_to``) puts ``B`` samples whenever fewer than two entries are queued, and the
trainer thread polls ``empty()`` before ``get()`` (time waiting for the stream is
exposed). The replay cases draw from a filled buffer. Push cost is ``put`` per sample,
pull cost ``get`` per batch without an update (a queue refilled inline when empty).
Cases are interleaved in a fresh random order each repeat; the figures are medians over
repeats with their min–max.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import random
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from conduit.integrations import srl

from benchmarks.timing import Stat, interleaved, torch_threads
from conduit.ext import build_record
from conduit.ext import flatten_record as flatten
from tests.integrations import srl_stub

T, B, OBS, CAPACITY = 8, 256, 512, 4096
#: ``--size small``: a run of seconds (what the test of this script uses)
SMALL = (4, 8, 16, 64)


# -- SRL: its own classes, or a reimplementation from SRL's documented protocol -----------------------------------
def srl_classes() -> tuple[Any, Any, Any, str]:
    """(replay buffer class, queue class, SRL buffer module, label): SRL's own when ``CONDUIT_SRL_SRC`` is set,
    else the notes' replay and the stub's queue, with the stub's types."""
    src = os.environ.get("CONDUIT_SRL_SRC")
    if src:
        root = Path(src)
        sys.path.insert(0, str(root / "src") if (root / "src" / "rlsrl").is_dir() else str(root))
        if not torch.cuda.is_available():
            torch.Tensor.pin_memory = lambda self, *a, **k: self  # type: ignore[method-assign]
        buf = srl.find()
        return buf.SimpleReplayBuffer, buf.PriorityQueueBuffer, buf, f"SRL's own classes ({buf.__name__})"
    label = "a reimplementation from SRL's documented protocol (no SRL checkout)"
    return NotesReplay, srl_stub.PriorityQueueBuffer, srl_stub, label


class NotesReplay:
    """SRL's uniform replay as the notes describe it: ``[T, max_size, ...]`` storage, fancy-index gather."""

    def __init__(self, max_size: int, batch_size: int, warmup_transitions: int, seed: int = 0,
                 sample_length: int | None = None, batch_length: int | None = None) -> None:
        self.max_size, self.batch_size, self.warmup = max_size, batch_size, warmup_transitions
        self.store: dict[str, np.ndarray] | None = None
        self.ptr = self.count = 0
        self.times = np.zeros(max_size, np.int64)

    def put(self, x: Any) -> None:
        leaves = dict(flatten(x))  # nested records by dotted name; None leaves stay None
        if self.store is None:
            self.store = {k: None if v is None else
                          torch.from_numpy(np.zeros((v.shape[0], self.max_size, *v.shape[1:]), v.dtype)).numpy()
                          for k, v in leaves.items()}
        for k, v in self.store.items():
            if v is not None and leaves.get(k) is not None:
                v[:, self.ptr] = leaves[k]
        self.times[self.ptr] = 0
        self.ptr, self.count = (self.ptr + 1) % self.max_size, min(self.count + 1, self.max_size)

    def empty(self) -> bool:
        return self.count * T < self.warmup

    def get(self) -> Any:
        assert self.store is not None
        idx = np.sort(np.random.choice(self.count, self.batch_size, replace=False))
        reuses = self.times[idx].mean()
        self.times[idx] += 1
        columns = [(k, None if v is None else v[:, idx]) for k, v in self.store.items()]
        sample = build_record(columns, srl_stub.NamedArray)
        return srl_stub.ReplayEntry(-1, -1, sample, reuses)


# -- the workload ------------------------------------------------------------------------------------------------
def make_sample(named: Any, i: int, rng: np.random.Generator) -> Any:
    """A sample as SRL's actors post it: ``obs`` and ``action`` records, ``analyzed_result`` with a ``None``
    leaf, ``policy_state`` ``None``, and the policy fields."""
    return named(
        obs=named(obs=rng.standard_normal((T, OBS), dtype=np.float32)),
        action=named(x=np.full((T, 1), i % 6, np.int64)),
        reward=np.ones((T, 1), np.float32), done=np.zeros((T, 1), np.uint8),
        analyzed_result=named(log_probs=np.zeros((T, 1), np.float32), value=np.zeros((T, 1), np.float32), ret=None),
        policy_state=None, policy_version_steps=np.zeros((T, 1), np.int64), policy_name=None,
    )


def as_tensors(sample: Any) -> dict[str, torch.Tensor]:
    """What an algorithm does with a sample first (on a GPU, the prefetcher's ``.cuda(non_blocking=True)``),
    every array leaf by its dotted name (``obs.obs``)."""
    return {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in flatten(sample) if isinstance(v, np.ndarray)}


class Update:
    """A fixed learner update: matmuls on the batch's observations plus a fixed amount of model compute."""

    def __init__(self, reps: int = 2) -> None:
        self.w = torch.randn(OBS, OBS)
        self.reps = reps

    def __call__(self, batch: dict[str, torch.Tensor]) -> float:
        x = batch["obs.obs"].reshape(-1, OBS)[:B]
        for _ in range(self.reps):
            x = torch.tanh(x @ self.w)
        return float(x[0, 0])


class Stream:
    """SRL's sample stream into a queue buffer, on its own thread (the trainer worker's main thread calling
    ``consume_to``): ``B`` samples whenever fewer than two entries are queued; bounded by ``limit_s``."""

    def __init__(self, buf: Any, next_sample: Callable[[], Any], limit_s: float = 120.0) -> None:
        self.buf, self.next_sample, self.limit_s = buf, next_sample, limit_s
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="srl-stream", daemon=True)

    def _run(self) -> None:
        deadline = time.monotonic() + self.limit_s
        try:
            while not self.stop.is_set() and time.monotonic() < deadline:
                if self.buf.qsize() < 2:
                    for _ in range(B):
                        self.buf.put(self.next_sample())
                else:
                    time.sleep(2e-4)
        except BaseException as e:  # re-raised on the trainer's side by __exit__
            self.error = e

    def __enter__(self) -> Stream:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop.set()
        self.thread.join(60)
        if self.error is not None:
            raise RuntimeError("the stream thread failed") from self.error


def trainer_loop(get: Callable[[], Any], update: Update, steps: int, prefetch: bool,
                 stream: Stream | None = None) -> float:
    """Mean exposed delivery latency per step (seconds): the trainer's time between two updates."""
    if stream is not None:
        with stream:
            return trainer_loop(get, update, steps, prefetch)
    exposed = 0.0
    if not prefetch:
        for _ in range(steps):
            t0 = time.perf_counter()
            batch = as_tensors(get().sample)
            exposed += time.perf_counter() - t0
            update(batch)
        return exposed / steps
    ready: queue.Queue[dict[str, torch.Tensor]] = queue.Queue(maxsize=1)  # one step of lookahead

    def helper() -> None:
        for _ in range(steps):
            ready.put(as_tensors(get().sample), timeout=60)

    th = threading.Thread(target=helper, daemon=True)
    th.start()
    for _ in range(steps):
        t0 = time.perf_counter()
        batch = ready.get(timeout=60)
        exposed += time.perf_counter() - t0
        update(batch)
    th.join(60)
    return exposed / steps


def build(module: Any, replay_cls: Any, queue_cls: Any, rng: np.random.Generator) -> dict[str, Any]:
    samples = [make_sample(srl.types_of(module).named_array, i, rng) for i in range(CAPACITY)]
    args = dict(max_size=CAPACITY, batch_size=B, warmup_transitions=B * T, sample_length=T, batch_length=T)
    bufs = {
        "replay/srl": replay_cls(**args),
        "replay/conduit": srl.make("conduit_replay", module, **args),
        "queue/srl": queue_cls(max_size=16, reuses=4, batch_size=B),
        "queue/conduit": srl.make("conduit_queue", module, max_size=16, reuses=4, batch_size=B),
    }
    for name, buf in bufs.items():
        for s in samples[: CAPACITY if name.startswith("replay") else 4 * B]:
            buf.put(s)
    return {"samples": samples, **bufs}


def run(repeats: int, steps: int, seed: int = 0) -> dict[str, Any]:
    torch.manual_seed(seed)
    np.random.seed(seed)
    rng = np.random.default_rng(seed)
    replay_cls, queue_cls, module, label = srl_classes()
    env = build(module, replay_cls, queue_cls, rng)
    update = Update()
    samples = env["samples"]
    cursor = {"i": 0}

    def next_sample() -> Any:
        cursor["i"] = (cursor["i"] + 1) % len(samples)
        return samples[cursor["i"]]

    def queue_get(buf: Any) -> Callable[[], Any]:
        def get() -> Any:  # SRL's GPUThread: poll ``empty()``, then ``get()``; the stream thread feeds the queue
            deadline = time.monotonic() + 60
            while buf.empty():
                if time.monotonic() > deadline:
                    raise TimeoutError("the stream thread fed no entry for 60 s")
                time.sleep(1e-4)
            return buf.get()
        return get

    def queue_get_fed(buf: Any) -> Callable[[], Any]:
        def get() -> Any:  # for the pull cost: refilled inline when empty (the push cost is timed on its own)
            if buf.empty():
                for _ in range(B):
                    buf.put(next_sample())
            return buf.get()
        return get

    exposed_cases = {
        "replay/srl inline": (env["replay/srl"].get, False, None),
        "replay/srl + prefetch": (env["replay/srl"].get, True, None),
        "replay/conduit": (env["replay/conduit"].get, False, None),
        "queue/srl inline": (queue_get(env["queue/srl"]), False, env["queue/srl"]),
        "queue/srl + prefetch": (queue_get(env["queue/srl"]), True, env["queue/srl"]),
        "queue/conduit": (queue_get(env["queue/conduit"]), False, env["queue/conduit"]),
    }
    exposed: dict[str, list[float]] = {k: [] for k in exposed_cases}
    order = list(exposed_cases)
    shuffle = random.Random(seed)

    def case(name: str, n: int) -> float:
        get, prefetch, fed = exposed_cases[name]
        return trainer_loop(get, update, n, prefetch, Stream(fed, next_sample) if fed is not None else None)

    for name in order:  # warm-up
        case(name, 3)
    for _ in range(repeats):
        shuffle.shuffle(order)
        for name in order:
            exposed[name].append(case(name, steps))
    update_s = statistics.median(_time(lambda: update(as_tensors(env["replay/srl"].get().sample))) for _ in range(9))

    cost_cases: dict[str, Callable[[int], None]] = {}
    for kind in ("replay", "queue"):
        for who in ("srl", "conduit"):
            buf = env[f"{kind}/{who}"]
            cost_cases[f"{kind}/{who} push"] = _pushes(buf, next_sample)
            if who == "conduit":  # what ConduitSampleConsumer does with one consume_to's samples
                cost_cases[f"{kind}/{who} put_many"] = _put_many(buf, next_sample)
            get = buf.get if kind == "replay" else queue_get_fed(buf)
            cost_cases[f"{kind}/{who} pull"] = _pulls(get)
    calls = {k: (20 if k.endswith("pull") else B) for k in cost_cases}
    costs = interleaved(cost_cases, calls, repeats, seed=seed)
    env["replay/conduit"].close()
    return {
        "srl": label, "shape": {"T": T, "B": B, "obs": OBS, "capacity": CAPACITY}, "repeats": repeats,
        "steps": steps, "update_s": update_s, "cuda": torch.cuda.is_available(),
        "exposed": {k: Stat(tuple(v)).to_json() for k, v in exposed.items()},
        "costs": {k: v.to_json() for k, v in costs.items()},
    }


def _time(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _pushes(buf: Any, next_sample: Callable[[], Any]) -> Callable[[int], None]:
    def block(n: int) -> None:
        for _ in range(n):
            buf.put(next_sample())
    return block


def _put_many(buf: Any, next_sample: Callable[[], Any], group: int = 32) -> Callable[[int], None]:
    def block(n: int) -> None:
        for _ in range(max(1, n // group)):
            buf.put_many([next_sample() for _ in range(group)])
    return block


def _pulls(get: Callable[[], Any]) -> Callable[[int], None]:
    def block(n: int) -> None:
        for _ in range(n):
            as_tensors(get().sample)
    return block


def report(result: dict[str, Any]) -> str:
    def fmt(s: dict[str, Any], unit: float = 1e3) -> str:
        return f"{s['median_s'] * unit:.3f} [{s['min_s'] * unit:.3f}–{s['max_s'] * unit:.3f}]"

    lines = [
        f"SRL side: {result['srl']}; T={T}, B={B}, obs={OBS} float32, capacity={CAPACITY} samples; "
        f"cuda={result['cuda']}; median [min–max] of {result['repeats']} interleaved repeats of "
        f"{result['steps']} steps; update ≈ {result['update_s'] * 1e3:.2f} ms",
        "", "exposed delivery latency per step (ms)",
    ]
    ex = result["exposed"]
    for kind in ("replay", "queue"):
        base = ex[f"{kind}/srl inline"]["median_s"]
        for case in (f"{kind}/srl inline", f"{kind}/srl + prefetch", f"{kind}/conduit"):
            ratio = ex[case]["median_s"] / base if base else float("nan")
            lines.append(f"  {case:24s} {fmt(ex[case])}   {ratio:.2f} of srl inline")
    lines += ["", "push (µs per sample) and pull (ms per batch, to tensors)"]
    co = result["costs"]
    for kind in ("replay", "queue"):
        for op, unit in (("push", 1e6), ("pull", 1e3)):
            s, c = co[f"{kind}/srl {op}"], co[f"{kind}/conduit {op}"]
            lines.append(f"  {kind} {op}: srl {fmt(s, unit)}  conduit {fmt(c, unit)}  "
                         f"conduit/srl {c['median_s'] / s['median_s']:.2f}")
        pm, s = co[f"{kind}/conduit put_many"], co[f"{kind}/srl push"]
        lines.append(f"  {kind} put_many(32), per sample: conduit {fmt(pm, 1e6)}  conduit/srl push "
                     f"{pm['median_s'] / s['median_s']:.2f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    global T, B, OBS, CAPACITY
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    parser.add_argument("--size", choices=("full", "small"), default="full",
                        help="full: T, B, obs, capacity = 8, 256, 512, 4096; small: T, B, obs, capacity = {SMALL}")
    args = parser.parse_args(argv)
    if args.size == "small":
        T, B, OBS, CAPACITY = SMALL
    with torch_threads(args.threads):
        result = run(max(5, args.repeats), args.steps)
    result["torch_threads"] = args.threads
    print(report(result))
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
