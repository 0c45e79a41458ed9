"""Topologies shipped with Conduit (package data), loaded by name.

``importlib.resources`` earns its place: it finds the files inside an installed
wheel, a zip or an editable checkout alike, without guessing paths.
"""

from __future__ import annotations

from importlib import resources

from conduit.errors import PlacementError
from conduit.placement.topology import Topology

__all__ = ["builtin_topology", "list_builtin_topologies"]

_PACKAGE = "conduit.placement"
_FOLDER = "topologies"


def list_builtin_topologies() -> tuple[str, ...]:
    """Names of the shipped topology files (without extension), sorted."""
    folder = resources.files(_PACKAGE).joinpath(_FOLDER)
    return tuple(sorted(p.name.rsplit(".", 1)[0] for p in folder.iterdir() if p.name.endswith(".yaml")))


def builtin_topology(name: str) -> Topology:
    """Load a shipped topology, e.g. ``builtin_topology("mi250x_8gcd")``."""
    names = list_builtin_topologies()
    stem = name.removesuffix(".yaml")
    if stem not in names:
        raise PlacementError(f"topology name: expected one of {', '.join(names)}; received {name!r}")
    resource = resources.files(_PACKAGE).joinpath(_FOLDER, f"{stem}.yaml")
    with resources.as_file(resource) as path:
        return Topology.load(path)
