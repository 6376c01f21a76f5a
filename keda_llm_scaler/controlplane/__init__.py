"""A real Kubernetes control plane and KEDA for the end-to-end tests: ``scripts/controlplane build|run``."""
