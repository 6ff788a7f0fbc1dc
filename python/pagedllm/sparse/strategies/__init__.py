"""One module per block-selection strategy (each registers itself: see pagedllm.sparse.registry)."""
