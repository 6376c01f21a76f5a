"""Fleet simulator: vLLM replicas on a calibrated step-time model, an HPA emulation, peer policies."""
