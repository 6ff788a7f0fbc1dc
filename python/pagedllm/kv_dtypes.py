"""The KV cache storage type names (`kv_cache_dtype`), without torch: the engine options
(config.py) and the command line check them before anything heavy is imported;
model/kv_cache.py maps each to its torch storage type."""

KV_CACHE_DTYPES = ("auto", "fp32", "float32", "fp16", "float16", "half", "bf16", "bfloat16",
                   "fp8", "fp8_e4m3", "fp8_e5m2")
