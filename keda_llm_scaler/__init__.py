"""keda-llm-scaler: a KEDA external scaler for vLLM and SGLang fleets."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("keda-llm-scaler")  # one source: pyproject.toml, through the installed metadata
except PackageNotFoundError:  # a source tree on sys.path without an install
    __version__ = "0+unknown"
