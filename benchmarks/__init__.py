"""pagedllm benchmarks: `python -m benchmarks` regenerates the figures of docs/BENCHMARKS.md."""
