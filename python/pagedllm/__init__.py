"""pagedllm: a PagedAttention inference runtime for Llama models.

The KV cache lives in fixed-size blocks managed by a C++ core (``pagedllm._core``); attention
reads K/V straight from those blocks. The high-level API mirrors vLLM::

    from pagedllm import LLM, SamplingParams
    llm = LLM()                       # the bundled default model
    out = llm.generate(["The list type"], SamplingParams(max_tokens=32))
"""

from pagedllm._version import __version__

__all__ = ["__version__", "LLM", "LLMEngine", "EngineConfig", "SamplingParams",
           "BeamSearchParams", "RequestOutput", "CompletionOutput"]

_LAZY = {
    "LLM": ("pagedllm.llm", "LLM"),
    "LLMEngine": ("pagedllm.engine.llm_engine", "LLMEngine"),
    "EngineConfig": ("pagedllm.config", "EngineConfig"),
    "SamplingParams": ("pagedllm.sampling_params", "SamplingParams"),
    "BeamSearchParams": ("pagedllm.sampling_params", "BeamSearchParams"),
    "RequestOutput": ("pagedllm.outputs", "RequestOutput"),
    "CompletionOutput": ("pagedllm.outputs", "CompletionOutput"),
}


def __getattr__(name: str):
    # Import torch-heavy modules only when they are used.
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        value = getattr(importlib.import_module(module), attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'pagedllm' has no attribute {name!r}")
