"""The short page: one table per question, from the JSON documents the harness writes. Pure functions, no I/O.

``conduit bench all --json`` (or ``--save-json``) writes ``{"micro": ..., "synthetic": ..., "validation": ...}``
(:func:`benchmarks.report.micro_json`, :func:`benchmarks.report_loop.loop_json`,
:func:`benchmarks.validate.run_validation`); :func:`summary_markdown` renders it as four tables:

- **Delivery and ingestion** — Conduit's push and pull against the bounds and the peers, per dimension;
- **Ratios and targets** — the ratios :data:`benchmarks.report.MICRO_TARGETS` judge, met or missed;
- **The synthetic loop** — inline against Conduit's plan, exposed latency and the cut;
- **The cost model** — predicted against measured ``T_iter``, and where the automatic choice lands.

Every figure is a median over the run's interleaved repeats with its spread, ``97 µs [91–130]`` (min–max); a
figure the document holds only as a median is shown alone, and the table's note says so. ``–``: not measured
(a peer that was not installed or not asked for).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from benchmarks.report import MICRO_TARGETS, TARGET_SHAPE

__all__ = [
    "DASH",
    "cost_model_table",
    "delivery_table",
    "fmt_ms",
    "fmt_spread",
    "fmt_time",
    "loop_table",
    "machine_line_json",
    "ratio_table",
    "split_document",
    "summary_markdown",
]

DASH = "–"
Doc = dict[str, Any]

#: (row label, op, roles (the fastest of them per dimension), sampling)
DELIVERY_ROWS: tuple[tuple[str, str, tuple[str, ...], str], ...] = (
    ("Conduit push (inline g=1)", "ingest", ("conduit",), "-"),
    ("torch slice copy", "ingest", ("slice_copy",), "-"),
    ("Conduit pull (inline g=1)", "deliver", ("conduit",), "uniform"),
    ("torch index_select(out=) (the plain ring)", "deliver", ("index_select",), "uniform"),
    ("memcpy (same bytes)", "deliver", ("memcpy",), "uniform"),
    ("TorchRL sample (its faster variant)", "deliver", ("torchrl", "torchrl_prefetch"), "uniform"),
    ("cpprb sample", "deliver", ("cpprb",), "uniform"),
    ("Conduit pull prioritized", "deliver", ("conduit",), "prioritized"),
    ("cpprb sample prioritized", "deliver", ("cpprb",), "prioritized"),
)

POLICY = {"off_policy": "off-policy (DQN-like)", "on_policy": "on-policy (PPO-like)"}
COST = {"compute": "burns the CPU", "sleep": "releases the CPU (sleep)"}


# -- numbers -----------------------------------------------------------------------------------------------------
def _decimals(v: float) -> int:
    a = abs(v)
    return 2 if a < 10 else 1 if a < 100 else 0


def _num(v: float, decimals: int) -> str:
    return f"{v:,.{decimals}f}"


def _unit(seconds: float) -> tuple[str, float, int]:
    """(unit, scale, decimals) of a time: µs below 1 ms (a decimal below 10 µs), else ms (two below 10 ms)."""
    if abs(seconds) < 1e-3:
        return "µs", 1e6, 1 if abs(seconds) < 1e-5 else 0
    return "ms", 1e3, _decimals(seconds * 1e3)


def fmt_time(seconds: float | None) -> str:
    """A time per operation: ``97 µs``, ``4.2 µs``, ``1.23 ms``."""
    if seconds is None:
        return DASH
    unit, scale, d = _unit(seconds)
    return f"{_num(seconds * scale, d)} {unit}"


def _spread(median: float, samples: Sequence[float], scale: float, decimals: int, unit: str = "") -> str:
    """``median[ unit] [min–max]``; fewer than two samples: the median alone."""
    head = _num(median * scale, decimals) + (f" {unit}" if unit else "")
    if len(samples) < 2:
        return head
    lo, hi = min(samples), max(samples)
    return f"{head} [{_num(lo * scale, decimals)}–{_num(hi * scale, decimals)}]"


def fmt_spread(stat: Doc | None) -> str:
    """A case's ``stat`` as ``97 µs [91–130]``: median [min–max], in the median's unit (one sample: the median)."""
    if not stat:
        return DASH
    median = stat["median_s"]
    samples = stat.get("samples_s") or [x for x in (stat.get("min_s"), stat.get("max_s")) if x is not None]
    unit, scale, d = _unit(median)
    return _spread(median, samples, scale, d, unit)


def fmt_ms(median: float | None, samples: Sequence[float] = ()) -> str:
    """Milliseconds with the spread of ``samples`` (seconds), two decimals: ``4.12 [3.90–4.50]``."""
    return DASH if median is None else _spread(median, samples, 1e3, 2)


def _pct(v: float | None) -> str:
    return DASH if v is None else f"{v:.0%}"


def _count(n: Any) -> str:
    return f"{n:,}" if isinstance(n, int) else str(n)


def _schedule(s: Doc | None) -> str:
    """A schedule, short: ``ingestion / delivery``, each ``overlap g=2`` or ``inline g=1``."""
    if not s:
        return DASH

    def mode(m: Doc) -> str:
        return f"{'overlap' if m['overlap'] else 'inline'} g={m['granularity']}"

    return f"{mode(s['ingestion'])} / {mode(s['delivery'])}"


def _table(columns: list[str], rows: list[list[str]], align: str = "l") -> list[str]:
    """A Markdown table; ``align``: ``l`` or ``r`` per column (text left, figures right; unnamed columns ``r``)."""
    rule = ["---" if a == "l" else "--:" for a in align.ljust(len(columns), "r")]
    out = ["| " + " | ".join(columns) + " |", "|" + "|".join(rule) + "|"]
    out += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in rows]
    return out


def _section(title: str, caption: str, machine: str | None, body: list[str], notes: Sequence[str] = ()) -> str:
    lines = [f"### {title}", "", caption]
    if machine:
        lines += ["", machine]
    lines += ["", *body]
    lines += [f"\n_{n}_" for n in notes]
    return "\n".join(lines) + "\n"


# -- the machine ------------------------------------------------------------------------------------------------------
def machine_line_json(machine: Doc, threads: Any, memcpy_gbps: float | None = None, *, memcpy: bool = True) -> str:
    """:func:`benchmarks.document.machine_line` from a JSON document's ``machine`` (the same words)."""
    load = (machine.get("load_avg") or [float("nan")])[0]
    gbps = DASH if memcpy_gbps is None else f"{memcpy_gbps:.1f}"
    bw = f", memcpy {gbps} GB/s (one 128 MiB copy)" if memcpy else ""
    return (
        f"Machine: {machine.get('nproc')} CPUs ({machine.get('cpu_model')}), torch {machine.get('torch')}, "
        f"torch threads {threads}{bw}; 1-minute load average at the start: {load:.1f}"
    )


def _micro_machine(micro: Doc) -> str:
    return machine_line_json(micro.get("machine", {}), micro["settings"].get("threads"), micro.get("memcpy_gb_per_s"))


def _loop_machine(loop: Doc) -> str:
    return machine_line_json(loop.get("machine", {}), loop["settings"].get("threads"), memcpy=False)


# -- micro --------------------------------------------------------------------------------------------------------
def _find(d: Doc, op: str, roles: tuple[str, ...], sampling: str) -> Doc | None:
    pool = [c for c in d["cases"] if c["op"] == op and c["role"] in roles and c["sampling"] == sampling]
    return min(pool, key=lambda c: c["stat"]["median_s"]) if pool else None


def _dims(micro: Doc) -> list[str]:
    return [f"dim {d['dim']:,}" for d in micro["dims"]]


def _capacities(micro: Doc) -> str:
    caps = {d["capacity"] for d in micro["dims"]}
    if len(caps) == 1:
        return f"capacity {_count(caps.pop())}"
    return "capacity " + ", ".join(f"{_count(d['capacity'])} at dim {d['dim']:,}" for d in micro["dims"])


def _repeats(n: Any) -> str:
    return f"{n} interleaved repeat{'' if n == 1 else 's'}"


def delivery_table(micro: Doc) -> str:
    """Delivery and ingestion: Conduit's push and pull against the bounds and the peers, one column per dim."""
    s = micro["settings"]
    rows = []
    for label, op, roles, sampling in DELIVERY_ROWS:
        cases = [_find(d, op, roles, sampling) for d in micro["dims"]]
        rows.append([label, *(fmt_spread(c["stat"]) if c else DASH for c in cases)])
    notes = []
    picked = [_find(d, "deliver", ("torchrl", "torchrl_prefetch"), "uniform") for d in micro["dims"]]
    if any(picked):
        notes.append(
            "TorchRL: the faster of its sample and its prefetching sample at each dim ("
            + ", ".join(f"dim {d['dim']:,}: {c['name']}" for d, c in zip(micro["dims"], picked) if c)
            + ")"
        )
    missing = sorted({(m["name"], m["reason"]) for d in micro["dims"] for m in d.get("missing", [])})
    if any(DASH in r[1:] for r in rows):
        notes.append(f"{DASH}: not measured in this run (a peer missing here, or not asked for)")
    notes += [f"missing: {name} — {reason}" for name, reason in missing]
    notes += [d["capacity_note"] for d in micro["dims"] if d.get("capacity_note")]
    if s.get("repeats", 2) < 2:
        notes.append("one repeat: medians without a spread")
    caption = (
        f"_How long Conduit takes to ingest a chunk of {_count(s['chunk'])} transitions and to deliver a training "
        f"batch of {_count(s['batch'])}, against the bounds and the peers: median time per call [min–max] over "
        f"{_repeats(s['repeats'])}; {_capacities(micro)}, float32 obs and next_obs of each dim._"
    )
    return _section(
        "Delivery and ingestion", caption, _micro_machine(micro), _table(["case", *_dims(micro)], rows), notes
    )


def _micro_targets(micro: Doc) -> list[Doc]:
    """The document's targets, or (a document without them) the targets evaluated on its ratios."""
    if micro.get("targets"):
        return list(micro["targets"])
    out = []
    for question, name, key, threshold, at_most in MICRO_TARGETS:
        for d in micro["dims"]:
            value = d.get("ratios", {}).get(key)
            met = None if value is None else value <= threshold if at_most else value >= threshold
            out.append(
                dict(
                    question=question,
                    name=name,
                    scope=f"dim {d['dim']:,}",
                    value=value,
                    threshold=threshold,
                    at_most=at_most,
                    met=met,
                    detail=key,
                )
            )
    return out


def _verdict(t: Doc | None) -> str:
    if t is None or t.get("value") is None:
        return DASH
    word = {True: "met", False: "**missed**"}.get(t.get("met"), "reported")
    return f"{t['value']:.2f} {word}"


def ratio_table(micro: Doc) -> str:
    """Ratios and targets: each target's ratio per dim, met or **missed**."""
    s = micro["settings"]
    targets = _micro_targets(micro)
    order: list[tuple[str, str]] = []
    for t in targets:
        if (t["name"], t["detail"]) not in order:
            order.append((t["name"], t["detail"]))
    rows = []
    for name, key in order:
        ts = [t for t in targets if (t["name"], t["detail"]) == (name, key)]
        first = ts[0]
        by_scope = {t["scope"]: t for t in ts}
        criterion = f"{key} {'≤' if first['at_most'] else '≥'} {first['threshold']:g}"
        rows.append([name, criterion, *(_verdict(by_scope.get(dim)) for dim in _dims(micro))])
    notes = [
        "a/b: median time of a over median time of b; against a bound (index_select, slice copy, memcpy) lower is "
        "better and 1.0 is the bound; against a peer (TorchRL, cpprb) higher is better: how many times faster "
        "Conduit is"
    ]
    if (s.get("chunk"), s.get("batch")) != TARGET_SHAPE:
        notes.append(
            f"the targets are set for chunks of {TARGET_SHAPE[0]} and batches of {TARGET_SHAPE[1]}; this run's chunks "
            f"of {_count(s.get('chunk'))} and batches of {_count(s.get('batch'))} read them for reference only"
        )
    caption = (
        f"_Does Conduit meet its targets? The ratios of the medians above, per dim; chunk {_count(s['chunk'])}, "
        f"batch {_count(s['batch'])}, {_repeats(s['repeats'])}, {_capacities(micro)}._"
    )
    body = _table(["target", "criterion", *_dims(micro)], rows, "ll")
    return _section("Ratios and targets", caption, _micro_machine(micro), body, notes)


# -- the synthetic loop -------------------------------------------------------------------------------------------
def _config(w: Doc, kind: str) -> Doc | None:
    return next((c for c in w["configs"] if c["kind"] == kind and not c.get("unavailable")), None)


def _exposed(c: Doc | None) -> tuple[str, bool]:
    """The exposed figure of a configuration, and whether it carries its spread."""
    if c is None or c.get("exposed_s") is None:
        return DASH, True
    samples = c.get("exposed_samples_s") or []
    return fmt_ms(c["exposed_s"], samples), len(samples) >= 2


def loop_table(loop: Doc) -> str:
    """The synthetic loop: per workload, inline's and Conduit's plan's exposed latency, and the cut."""
    s = loop["settings"]
    ws = loop["workloads"]
    targets = loop.get("targets") or []
    batches = len({w["batch_size"] for w in ws if w["policy"] == "off_policy"}) > 1
    rows, spread = [], True
    for i, w in enumerate(ws):
        inline, auto = _config(w, "inline"), _config(w, "auto")
        e_inline, ok_inline = _exposed(inline)
        e_auto, ok_auto = _exposed(auto)
        spread = spread and ok_inline and ok_auto
        cut = _pct(auto.get("reduction_vs_inline")) if auto else DASH
        t = targets[i] if i < len(targets) else None
        if t is not None and t.get("met") is not None and auto is not None:
            cut += " met" if t["met"] else " **missed**"
        plan = _schedule(auto["schedule"]) if auto else DASH
        if auto and auto.get("placement") not in (None, "cpu"):
            plan += f" on {auto['placement']}"
        dim = f"{w['dim']:,}" + (f" (batch {w['batch_size']:,})" if batches else "")
        rows.append(
            [POLICY.get(w["policy"], w["policy"]), COST.get(w["cost"], w["cost"]), dim, plan, e_inline, e_auto, cut]
        )
    notes = [
        "exposed: each run's time per iteration less rollout + update measured alone right before and right after "
        "it; cut: 1 − plan's exposed / inline's (medians); plan: Conduit's schedule, ingestion / delivery"
    ]
    if not spread:
        notes.append("medians only: this document holds no per-repeat exposed times for some rows")
    if any(t.get("threshold") is not None for t in targets):
        notes.append("target: a cut ≥ 70% off-policy at dim ≥ 1,000; the other rows are reported")
    unavailable = sorted({c["name"] for w in ws for c in w["configs"] if c.get("unavailable")})
    if unavailable:
        notes.append("not run on this machine: " + ", ".join(unavailable))
    batch = ", ".join(f"{b:,}" for b in s.get("batch_sizes", [])) or DASH
    caption = (
        f"_How much of the experience path's latency Conduit's plan hides against an inline loop, per workload: "
        f"exposed ms per iteration, median [min–max] over {s.get('repeats')} interleaved repeats of "
        f"{s.get('iterations')} iterations; capacity {_count(s.get('capacity'))}, batch {batch} (on-policy: "
        f"{s.get('units_per_iteration')} units of {_count(s.get('unit_size'))}), rollout {s.get('rollout_ms'):g} ms "
        f"per unit, update {s.get('update_ms'):g} ms per batch._"
    )
    columns = ["policy", "update", "dim", "Conduit's plan", "inline exposed ms", "plan exposed ms", "cut"]
    return _section("The synthetic loop", caption, _loop_machine(loop), _table(columns, rows, "llrl"), notes)


# -- the cost model ------------------------------------------------------------------------------------------------
def cost_model_table(validation: Doc, machine: str | None = None) -> str:
    """The cost model against measurement: Pearson r, MAPE, and per dim where the automatic choice lands."""
    dims = validation["dimensions"]
    s = validation.get("settings") or {}
    rows = [
        [
            f"{d['dim']:,}",
            str(d["configs"]),
            f"{d['best_t_iter_s'] * 1e3:.2f} ({_schedule(d.get('best_schedule'))})",
            f"{d['auto_t_iter_s'] * 1e3:.2f} ({_schedule(d.get('auto_schedule'))})",
            f"{d['auto_vs_best']:.3f}",
        ]
        for d in dims
    ]
    total = sum(d["configs"] for d in dims)
    r, mape = validation["pearson_r"], validation["mape_pct"]
    head = f"**Pearson r = {r:.3f}, MAPE = {mape:.1f}%** over {total} configurations"
    if s:
        settings = (
            f"off-policy loop, {s.get('sweep_rounds')} interleaved sweep rounds of every feasible schedule "
            f"(granularity ≤ {s.get('g_max')}); capacity {_count(s.get('capacity'))}, "
            f"batch {_count(s.get('batch_size'))}, "
            f"rollout {s.get('rollout_ms'):g} ms, update {s.get('update_ms'):g} ms ({s.get('cost')})"
        )
    else:
        settings = "off-policy loop, every feasible schedule (this document does not record the sweep's settings)"
    caption = (
        f"_How well the cost model predicts T_iter, and how close its automatic choice comes to the best: {settings}._"
    )
    notes = [
        "T_iter (schedule: ingestion / delivery): the sweep's medians (the document holds no per-round times, so "
        "no spread); auto/best: from the interleaved re-measurement of the choice and the sweep's fastest where "
        "there was one (1.000 = on the envelope)"
    ]
    body = [
        head,
        "",
        *_table(["dim", "configs", "best measured T_iter ms", "automatic choice T_iter ms", "auto/best"], rows),
    ]
    return _section("The cost model", caption, machine, body, notes)


# -- the page --------------------------------------------------------------------------------------------------------
def split_document(doc: Doc) -> tuple[Doc | None, Doc | None, Doc | None]:
    """(micro, synthetic, validation) of a ``bench all`` document, or of one command's own ``--json``."""
    if not isinstance(doc, dict):
        raise ValueError("expected a JSON object")
    if {"micro", "synthetic", "validation"} & set(doc):
        return doc.get("micro"), doc.get("synthetic"), doc.get("validation")
    if "workloads" in doc:
        return None, doc, None
    if "pearson_r" in doc and "dimensions" in doc:
        return None, None, doc
    if "dims" in doc and "settings" in doc:
        return doc, None, None
    raise ValueError(
        "not a benchmark document: expected `conduit bench all --json` ({micro, synthetic, validation}) "
        "or one of `conduit bench micro|synthetic|validate --json`"
    )


def summary_markdown(doc: Doc) -> str:
    """The summary page of a ``conduit bench all --json`` document: one table per question, in this order."""
    micro, loop, validation = split_document(doc)
    parts = []
    if micro is not None:
        parts += [delivery_table(micro), ratio_table(micro)]
    if loop is not None:
        parts.append(loop_table(loop))
    if validation is not None:
        machine = _micro_machine(micro) if micro else _loop_machine(loop) if loop else None
        parts.append(cost_model_table(validation, machine))
    if not parts:
        raise ValueError("the document holds no results")
    return "## Summary\n\n" + "\n".join(parts)
