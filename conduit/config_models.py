"""The config's building blocks: the base model that turns pydantic's errors into :class:`ConfigError`, and the
replay sections (a samples-per-insert ratio, prioritized replay) :class:`conduit.ConduitConfig` holds.

Split from :mod:`conduit.config` (which re-exports them) to keep modules small; pydantic earns its place here
as it does there (typed, frozen, validated models).
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from conduit.errors import ConfigError, suggest

__all__ = ["PrioritizedReplay", "RateLimit", "explain"]


def explain(exc: ValidationError, model: type[BaseModel], where: str | None = None) -> str:
    """pydantic's errors as a person reads them: one line per bad field, with what it got and what is allowed."""
    lines = []
    for e in exc.errors():
        loc = ".".join(str(p) for p in e["loc"])
        msg = e["msg"].removeprefix("Value error, ")
        got = e.get("input")
        if e["type"] == "extra_forbidden":
            owner = _model_at(model, e["loc"][:-1])
            valid = owner.model_fields if owner is not None else ()
            lines.append(f"{loc}: not a setting (got {got!r}); {suggest(str(e['loc'][-1]), valid)}")
        elif e["type"] == "missing":
            lines.append(f"{loc}: required, not given")
        elif not loc:  # a rule across fields: its message names them
            lines.append(msg)
        elif isinstance(e.get("ctx", {}).get("error"), ConfigError):  # a nested model's own explanation
            lines.append(f"{loc}: {msg}")
        else:
            lines.append(f"{loc}: {msg} (got {got!r})")
    head = where or f"invalid {model.__name__}"
    if len(lines) == 1:
        return f"{head}: {lines[0]}"
    return f"{head} ({len(lines)} problems):\n  - " + "\n  - ".join(lines)


def _model_at(model: type[BaseModel], loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The (nested) model a location points into."""
    for part in loc:
        field = model.model_fields.get(str(part))
        ann = getattr(field, "annotation", None)
        candidates = [ann, *getattr(ann, "__args__", ())]
        nested = next((c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)), None)
        if nested is None:
            return None
        model = nested
    return model


class _Config(BaseModel):
    """A config model whose construction errors are :class:`ConfigError` (see :func:`explain`)."""

    def __init__(self, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise ConfigError(explain(exc, type(self))) from None


class RateLimit(_Config):
    """Keep learners' samples and actors' inserts in ratio (Reverb's ``SampleToInsertRatio``).

    ``samples_per_insert`` sampled rows per inserted row, within ``± tolerance``
    rows of ``samples_per_insert · min_size_to_sample``, or with ``diff = inserts ·
    samples_per_insert - samples`` kept in ``[min_diff, max_diff]`` (Reverb's
    ``error_buffer`` given as a pair; one process); ``block=False`` makes a push or
    pull that would break the ratio raise :class:`~conduit.errors.RateLimited` at
    once instead of waiting. :meth:`queue` is Reverb's ``Queue(size)``.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    samples_per_insert: Annotated[float, Field(gt=0.0)]
    tolerance: Annotated[float, Field(ge=0.0, allow_inf_nan=True)] | None = None  # inf: no band (min_size only)
    min_diff: float | None = None
    max_diff: float | None = None
    block: bool = True

    @model_validator(mode="after")
    def _one_band(self) -> RateLimit:
        edges = (self.min_diff is not None) + (self.max_diff is not None)
        if edges == 1 or (edges == 2) == (self.tolerance is not None):
            raise ValueError("give the band as tolerance, or as min_diff and max_diff (not both)")
        if edges == 2 and not self.min_diff < self.max_diff:  # type: ignore[operator]
            raise ValueError(f"min_diff={self.min_diff} must be below max_diff={self.max_diff}")
        return self

    @classmethod
    def queue(cls, size: int, *, block: bool = True) -> RateLimit:
        """Reverb's ``rate_limiters.Queue(size)``: with ``sampler="fifo", max_times_sampled=1`` a queue whose full
        state makes the writer wait (``block``) or raise, where without it the remover evicts rows nobody drew:
        at most ``size`` rows inserted and not yet sampled, and no sample of rows not yet inserted."""
        return cls(samples_per_insert=1.0, min_diff=0.0, max_diff=float(size), block=block)

    @property
    def width(self) -> float:
        """The band's width in rows sampled (``2 · tolerance``, or ``max_diff - min_diff``)."""
        if self.tolerance is not None:
            return 2 * self.tolerance
        return float(self.max_diff - self.min_diff)  # type: ignore[operator]


class PrioritizedReplay(_Config):
    """Prioritized experience replay (Schaul et al.): ``P(i) ∝ p_i^alpha``, IS weights with ``beta``."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    alpha: Annotated[float, Field(ge=0.0, description="priority exponent")] = 0.6
    beta: Annotated[float, Field(ge=0.0, le=1.0, description="importance-sampling exponent")] = 0.4
    eps: Annotated[float, Field(gt=0.0, description="added to |td error| so no priority is 0")] = 1e-6
    max_priority: Annotated[
        float, Field(gt=0.0, description="the running maximum priority new rows start at (raised by feedback)")
    ] = 1.0
