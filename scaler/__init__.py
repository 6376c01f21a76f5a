"""keda-llm-scaler: a KEDA external scaler for vLLM and SGLang fleets."""

__version__ = "0.1.0"
