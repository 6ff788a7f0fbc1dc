"""Runners of the peer engines (vLLM CPU, transformers) on a shared workload."""
