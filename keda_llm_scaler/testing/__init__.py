"""Test and benchmark harnesses that tests/ and benchmarks/ share: loopback replicas (``replicas``), vLLM and
SGLang /metrics payloads (``payloads``), a DNS server (``dnsserver``), the scaler in process (``scalerproc``) or
as a ``serve`` subprocess (``serveproc``), a cheap fleet of replicas behind nginx or one asyncio server
(``fleetserver``), and the independent reference fleet model the simulator is checked against (``refsim``).

Shipped with the package, as ``keda_llm_scaler.sim`` and ``keda_llm_scaler.controlplane`` are, so that both
import it without ``sys.path`` edits wherever the package is installed; it needs only the package's own
dependencies. The server never imports it: the import-linter contract in pyproject.toml keeps the server side
(``serve`` and everything it loads) away from it, and ``refsim`` away from the simulator it checks.
"""
