// pagedllm/kernels/kernels.h — the CPU kernels of the paged KV cache (vLLM's conventions).
//
// Each entry point validates its params (ids inside the pool, lengths inside the tables,
// supported sizes) and throws pagedllm::Error before writing anything when they are wrong; it
// cannot check that the pointers cover the memory the sizes describe: that is the caller's
// contract (the Python binding derives both from the same tensors).
// Work runs on the kernel thread pool (thread_pool.h); the calls block until done.
// Limits: head_dim a multiple of 8 in [8, 512]; block_size in [1, 256]; num_heads a multiple
// of num_kv_heads. Accumulation is float32 whatever the storage type.
// Thread-safety: concurrent calls are safe when they write disjoint memory; the pool runs one
// call's work at a time.
#pragma once

#include <string>
#include <vector>

#include "pagedllm/kernels/params.h"

namespace pagedllm::kernels {

// Writes key/value token t into slot slot_mapping[t] of the caches (slot -1: skipped),
// converting to the cache's storage type (fp8: divided by k_scale / v_scale, saturated).
void reshape_and_cache(const ReshapeAndCacheParams& p);

// out[s] = softmax(scale * q[s] K^T) V over the context_lens[s] cached tokens of sequence s;
// one query token per sequence. A context length of 0 gives an output of zeros.
void paged_attention_decode(const AttentionParams& p);

// Causal attention of the packed new tokens of each sequence over all of its context (cached
// blocks plus its own new tokens, which must already be in the cache).
void paged_attention_prefill(const AttentionParams& p);

// Cross-attention (Mllama): non-causal attention of the packed query tokens of each sequence
// (p.cu_seqlens_q, any number per sequence) over a range of its p.context_lens[s] cached cross
// tokens: query token i attends the positions kv_ranges[2i] <= j < kv_ranges[2i + 1] of its
// sequence's table (0 <= lo <= hi <= context length; lo == hi gives an output row of zeros).
// kv_ranges: [num_tokens, 2] int32, contiguous. Throws before writing for a bad range.
void paged_cross_attention(const AttentionParams& p, const int32_t* kv_ranges);

// paged_attention_decode over only the logical blocks that `sparse` lists per sequence (or per
// (sequence, KV head)); on all blocks it computes what the dense call does, bit for bit.
// Throws for a list length, an unsorted list or a block outside the sequence's context; only
// the listed blocks' table entries are read (the rest may be anything, e.g. -1 when dropped).
void paged_attention_decode_sparse(const AttentionParams& p, const BlockSparseParams& sparse);

// paged_attention_prefill over the listed blocks only: query token i still sees only keys at
// positions <= its own, of the listed blocks (list the blocks holding the new tokens).
void paged_attention_prefill_sparse(const AttentionParams& p, const BlockSparseParams& sparse);

// Quest's choice: for each sequence with a budget and each KV head, its forced blocks plus the
// blocks of largest bound sum_d max(q_d min_d, q_d max_d) (maximised over the GQA group) up to
// budget blocks, sorted, into out_indices at out_indptr; budget 0 copies the forced list to
// every head. Throws (before writing) for inconsistent sizes, lists or ids.
void quest_select(const QuestSelectParams& p);

// Copies block src to block dst in every pool. Destinations must be distinct and must not also
// be sources (so the pairs can run in parallel).
void copy_blocks(const CopyBlocksParams& p);

// Copies block src of p.src to block dst of p.dst for every pair; blocks must be the same size.
void swap_blocks(const SwapBlocksParams& p);

// RMSNorm of every row (statistics in float32, transformers' LlamaRMSNorm arithmetic up to
// summation order); rows are split over the pool when there are enough of them.
void rms_norm(const RMSNormParams& p);

// Sums n floats reading them once with all pool threads (a memory read-bandwidth probe).
double stream_read_sum(const float* data, int64_t n);

// Parses a vLLM kv_cache_dtype name ("auto", "fp16", "bf16", "fp8", "fp8_e4m3", "fp8_e5m2",
// also "float16", "half", "bfloat16", "float32") into a storage type. "auto" returns false
// (the storage type is then the cache tensor's own); an unknown name throws.
bool parse_kv_cache_dtype(const std::string& name, CacheType* out);

// Names of a storage type and an activation type ("fp8_e4m3", "bfloat16", ...).
const char* cache_type_name(CacheType t);
const char* scalar_type_name(ScalarType t);

// The attention engine the calls dispatch to: "avx512", "avx2", "generic" or "avx512_bf16". By
// default ("auto") the best exact one compiled in that this CPU runs; avx512_bf16, which rounds
// the query and probabilities to bf16 for bf16 / fp8 K/V, only for decode of a bf16 query (exact
// in bf16 already) on a bf16 or fp8 cache, where the CPU runs it (and the avx512 engine's
// prefill of such a query rounds its probabilities to bf16 for p.v). The environment variable
// PAGEDLLM_CPU_ENGINE (read at the first call) or set_cpu_engine() choose another, used as named.
std::string active_cpu_kernel();

// Makes the calls use engine `name` ("generic", "avx2", "avx512", "avx512_bf16"; "auto" = the
// default above). Throws pagedllm::Error (invalid argument) for an unknown name, an engine not
// compiled in, or one whose instructions this CPU lacks; the choice is then unchanged.
void set_cpu_engine(const std::string& name);

// The engines compiled in that this CPU runs: the exact ones best first (ending with
// "generic"), then the opt-in avx512_bf16 where it runs.
std::vector<std::string> available_cpu_engines();

// Forces the portable engine (true) or the best one for this CPU (false): set_cpu_engine
// ("generic" / "auto"), kept for existing callers.
void force_generic_kernels(bool on);

}  // namespace pagedllm::kernels
