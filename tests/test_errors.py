"""errors.py's docstring draws the tree of the scaler's exceptions: it names every one the package defines."""

from __future__ import annotations

import importlib
import pkgutil

import keda_llm_scaler
from keda_llm_scaler import errors
from keda_llm_scaler.errors import ScalerError


def _subclasses(cls: type) -> set[type]:
    return {sub for direct in cls.__subclasses__() for sub in (direct, *_subclasses(direct))}


def test_the_exception_tree_names_every_scaler_error() -> None:
    for module in pkgutil.walk_packages(keda_llm_scaler.__path__, "keda_llm_scaler."):
        # the simulator and the test harnesses raise none of their own; __main__ would run the CLI
        if not module.name.endswith("__main__") and not module.name.startswith(
            ("keda_llm_scaler._proto", "keda_llm_scaler.sim", "keda_llm_scaler.testing")
        ):
            importlib.import_module(module.name)
    names = {cls.__name__ for cls in _subclasses(ScalerError)}
    assert {"TooManyTargets", "DiscoveryError", "BadObjectName"} <= names
    assert errors.__doc__ is not None
    assert [name for name in sorted(names) if f"── {name} " not in errors.__doc__] == []
