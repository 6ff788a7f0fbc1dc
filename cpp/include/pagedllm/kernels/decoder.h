// pagedllm/kernels/decoder.h — a stack of Llama decoder layers over the paged KV cache in one
// call: the CPU step's layers without a return to Python between their kernels.
//
// Each layer runs the kernels the Python model (pagedllm/model/llama.py) calls, on the same
// buffers in the same order, so its outputs are the Python path's bit for bit:
//   h = RMSNorm(x) (layer 0) or x += pending, h = RMSNorm(x) (add_rms_norm)
//   qkv = h Wqkv^T (+ b); RoPE on q and k in place; k, v -> cache (reshape_and_cache)
//   a = attention: the first num_decode_seqs sequences by the decode kernel, the rest prefill
//   x += a Wo^T (+ b), h = RMSNorm(x); pending = (silu(h Wg^T) * (h Wu^T)) Wd^T
// and after the last layer out = RMSNorm(x += pending) with the final norm weight.
// Every projection weight is packed by pack_linear_weight (linear.h). Intermediate rows live in a
// caller-owned workspace of decoder_workspace_bytes() bytes, so a step allocates nothing here.
// Validation: the shapes of the step and of each layer are checked before the first layer runs;
// the kernels check their values (block ids, lengths) as they do when called one by one, so a bad
// block id throws before that layer writes (earlier layers' cache writes stay: the caller drops
// the step, as it does when a single kernel throws).
// Thread-safety: concurrent calls are safe when they write disjoint memory.
#pragma once

#include <cstdint>

#include "pagedllm/kernels/dtypes.h"
#include "pagedllm/kernels/params.h"

namespace pagedllm::kernels {

// One decoder layer: norm weights, packed projections (biases optional) and its KV cache.
struct DecoderLayerParams {
  const void* input_norm = nullptr;    // [hidden]
  const void* post_norm = nullptr;     // [hidden]
  const void* qkv = nullptr;           // packed [q_size + 2 kv_size, hidden]
  const void* qkv_bias = nullptr;      // [q_size + 2 kv_size] or null
  const void* o = nullptr;             // packed [hidden, q_size]
  const void* o_bias = nullptr;        // [hidden] or null
  const void* gate_up = nullptr;       // packed [2 intermediate, hidden]: gate rows, then up
  const void* gate_up_bias = nullptr;  // [2 intermediate] or null
  const void* down = nullptr;          // packed [hidden, intermediate]
  const void* down_bias = nullptr;     // [hidden] or null
  KVCacheParams cache;                 // this layer's caches (num_kv_heads, head_dim as below)
};

// One step of packed tokens through num_layers layers (see the file comment).
struct DecoderStackParams {
  ScalarType dtype = ScalarType::kFloat32;  // float32 or bfloat16: activations and weights
  int64_t num_tokens = 0;        // >= 1
  int32_t hidden = 0;            // >= 1
  int32_t num_heads = 0;         // a multiple of num_kv_heads
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;          // even; the caches' head_dim
  int32_t intermediate = 0;      // >= 1
  float eps = 0.0f;              // RMSNorm epsilon
  float scale = 1.0f;            // softmax scale
  void* x = nullptr;             // [num_tokens, hidden] contiguous: the residual stream, updated
  void* out = nullptr;           // [num_tokens, hidden] contiguous: the final norm's output
  const void* final_norm = nullptr;  // [hidden]
  const void* cos = nullptr;     // [num_tokens, head_dim] contiguous (pagedllm.model.rope tables)
  const void* sin = nullptr;     // [num_tokens, head_dim] contiguous, first half negated
  const void* slot_mapping = nullptr;  // [num_tokens] int32 or int64; -1 skips the write
  bool slot_mapping_int64 = false;
  const int32_t* block_tables = nullptr;  // [num_seqs, max_blocks_per_seq]
  int64_t block_table_stride = 0;
  int32_t max_blocks_per_seq = 0;
  const int32_t* context_lens = nullptr;  // [num_seqs], new tokens included
  const int32_t* cu_seqlens_q = nullptr;  // [num_seqs + 1], 0 .. num_tokens
  int32_t num_seqs = 0;
  int32_t num_decode_seqs = 0;   // the first ones, one new token each
  const DecoderLayerParams* layers = nullptr;
  int32_t num_layers = 0;        // >= 1
  void* workspace = nullptr;     // decoder_workspace_bytes(*this) bytes, 64-byte aligned
  int64_t workspace_bytes = 0;
};

// Bytes of workspace decoder_stack needs for p's sizes (throws on sizes out of range).
int64_t decoder_workspace_bytes(const DecoderStackParams& p);

// Runs the layers and the final norm (see the file comment); throws pagedllm::Error on bad
// params before the first layer runs, or as the kernels do on bad values.
void decoder_stack(const DecoderStackParams& p);

}  // namespace pagedllm::kernels
