"""Real vLLM engines for the lab (``scripts/engine``): build, run under CPU quotas, test. Never imported by
the server."""
