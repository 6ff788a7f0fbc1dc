// decoder_stack: Llama decoder layers over the paged KV cache in one call (decoder.h), composed
// of the kernels the Python model calls one by one: linear, add_rms_norm, rotary_embedding,
// reshape_and_cache, paged_attention_decode / _prefill, silu_and_mul.
#include "pagedllm/kernels/decoder.h"

#include <cstdint>
#include <vector>

#include "pagedllm/error.h"
#include "pagedllm/kernels/fused_ops.h"
#include "pagedllm/kernels/kernels.h"
#include "pagedllm/kernels/linear.h"

namespace pagedllm::kernels {
namespace {

constexpr int64_t kAlign = 64;  // bytes: each workspace buffer starts on a cache line

int64_t element_bytes(ScalarType t) { return t == ScalarType::kBFloat16 ? 2 : 4; }

int64_t aligned(int64_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

// The workspace's buffers, as byte offsets. h and delta live through a layer; the attention
// buffers (qkv, attn) and the MLP ones (gate_up, act) never do at the same time, so they share.
struct Layout {
  int64_t h = 0, delta = 0, qkv = 0, attn = 0, gate_up = 0, act = 0, total = 0;
};

Layout layout(const DecoderStackParams& p) {
  const int64_t e = element_bytes(p.dtype), n = p.num_tokens;
  const int64_t q = int64_t{p.num_heads} * p.head_dim, kv = int64_t{p.num_kv_heads} * p.head_dim;
  Layout l;
  l.h = 0;
  l.delta = l.h + aligned(n * p.hidden * e);
  const int64_t shared = l.delta + aligned(n * p.hidden * e);
  l.qkv = shared;
  l.attn = l.qkv + aligned(n * (q + 2 * kv) * e);
  const int64_t attention_end = l.attn + aligned(n * q * e);
  l.gate_up = shared;
  l.act = l.gate_up + aligned(n * 2 * int64_t{p.intermediate} * e);
  const int64_t mlp_end = l.act + aligned(n * int64_t{p.intermediate} * e);
  l.total = attention_end > mlp_end ? attention_end : mlp_end;
  return l;
}

void validate(const DecoderStackParams& p) {
  PAGEDLLM_CHECK_ARG(p.dtype == ScalarType::kFloat32 || p.dtype == ScalarType::kBFloat16,
                     "decoder_stack: dtype must be float32 or bfloat16, got "
                         << scalar_type_name(p.dtype));
  PAGEDLLM_CHECK_ARG(p.num_tokens >= 1 && p.num_tokens < (int64_t{1} << 31),
                     "decoder_stack: num_tokens must be in [1, 2^31), got " << p.num_tokens);
  PAGEDLLM_CHECK_ARG(p.hidden >= 1 && p.intermediate >= 1 && p.num_kv_heads >= 1 &&
                         p.num_heads >= 1 && p.num_heads % p.num_kv_heads == 0,
                     "decoder_stack: hidden " << p.hidden << ", intermediate " << p.intermediate
                         << ", num_heads " << p.num_heads << ", num_kv_heads " << p.num_kv_heads
                         << ": expected sizes >= 1 and num_heads a multiple of num_kv_heads");
  PAGEDLLM_CHECK_ARG(p.head_dim >= 2 && p.head_dim % 2 == 0,
                     "decoder_stack: head_dim must be even and >= 2, got " << p.head_dim);
  PAGEDLLM_CHECK_ARG(p.num_layers >= 1 && p.layers != nullptr,
                     "decoder_stack: expected at least one layer, got " << p.num_layers);
  PAGEDLLM_CHECK_ARG(p.x && p.out && p.final_norm && p.cos && p.sin && p.slot_mapping &&
                         p.block_tables && p.context_lens && p.cu_seqlens_q,
                     "decoder_stack: x, out, final_norm, cos, sin, slot_mapping, block_tables, "
                     "context_lens and cu_seqlens_q must all be set");
  PAGEDLLM_CHECK_ARG(p.num_seqs >= 1 && p.num_decode_seqs >= 0 && p.num_decode_seqs <= p.num_seqs,
                     "decoder_stack: num_seqs " << p.num_seqs << ", num_decode_seqs "
                                                << p.num_decode_seqs
                                                << ": expected 0 <= num_decode_seqs <= num_seqs");
  const int32_t* cu = p.cu_seqlens_q;
  PAGEDLLM_CHECK_ARG(cu[0] == 0 && cu[p.num_decode_seqs] == p.num_decode_seqs &&
                         cu[p.num_seqs] == p.num_tokens,
                     "decoder_stack: cu_seqlens_q must start at 0, reach num_decode_seqs = "
                         << p.num_decode_seqs << " after the decode sequences and end at "
                         << "num_tokens = " << p.num_tokens << "; got cu[0] = " << cu[0]
                         << ", cu[" << p.num_decode_seqs << "] = " << cu[p.num_decode_seqs]
                         << ", cu[" << p.num_seqs << "] = " << cu[p.num_seqs]);
  PAGEDLLM_CHECK_ARG(p.workspace != nullptr && p.workspace_bytes >= layout(p).total &&
                         reinterpret_cast<uintptr_t>(p.workspace) % kAlign == 0,
                     "decoder_stack: the workspace must be " << layout(p).total
                         << " bytes (decoder_workspace_bytes), 64-byte aligned; got "
                         << p.workspace_bytes << " bytes");
  for (int32_t i = 0; i < p.num_layers; ++i) {
    const DecoderLayerParams& l = p.layers[i];
    PAGEDLLM_CHECK_ARG(l.input_norm && l.post_norm && l.qkv && l.o && l.gate_up && l.down,
                       "decoder_stack: layer " << i << " lacks a norm weight or a projection");
    PAGEDLLM_CHECK_ARG(l.cache.num_kv_heads == p.num_kv_heads && l.cache.head_dim == p.head_dim,
                       "decoder_stack: layer " << i << "'s cache has " << l.cache.num_kv_heads
                           << " KV heads of " << l.cache.head_dim << ", the model "
                           << p.num_kv_heads << " of " << p.head_dim);
  }
}

// y [n, out] = x [n, in] W^T (+ bias), rows contiguous.
void project(const DecoderStackParams& p, const void* x, int32_t in, const void* w,
             const void* bias, void* y, int32_t out) {
  LinearParams l;
  l.dtype = p.dtype;
  l.x = x;
  l.x_row_stride = in;
  l.rows = p.num_tokens;
  l.in_features = in;
  l.out_features = out;
  l.packed = w;
  l.bias = bias;
  l.y = y;
  l.y_row_stride = out;
  linear(l);
}

// x += delta (when set), out = RMSNorm(x) * weight.
void norm(const DecoderStackParams& p, const void* delta, const void* weight, void* out) {
  AddRMSNormParams a;
  a.dtype = p.dtype;
  a.x = p.x;
  a.x_row_stride = p.hidden;
  a.delta = delta;
  a.delta_row_stride = p.hidden;
  a.out = out;
  a.out_row_stride = p.hidden;
  a.weight = weight;
  a.rows = p.num_tokens;
  a.cols = p.hidden;
  a.eps = p.eps;
  add_rms_norm(a);
}

// RoPE on q and k, the new K/V into the cache, then attention into `attn` [n, heads, head_dim].
void attend(const DecoderStackParams& p, const DecoderLayerParams& layer, char* qkv, char* attn,
            const std::vector<int32_t>& prefill_cu) {
  const int64_t e = element_bytes(p.dtype), d = p.head_dim;
  const int64_t q_size = int64_t{p.num_heads} * d, kv_size = int64_t{p.num_kv_heads} * d;
  const int64_t row = q_size + 2 * kv_size;  // qkv's token stride (elements)

  RotaryParams r;
  r.dtype = p.dtype;
  r.x = qkv;
  r.x_token_stride = row;
  r.x_head_stride = d;
  r.cos = p.cos;
  r.cos_token_stride = d;
  r.sin = p.sin;
  r.sin_token_stride = d;
  r.num_tokens = p.num_tokens;
  r.num_heads = p.num_heads + p.num_kv_heads;
  r.head_dim = p.head_dim;
  rotary_embedding(r);

  ReshapeAndCacheParams c;
  c.key = qkv + q_size * e;
  c.value = qkv + (q_size + kv_size) * e;
  c.dtype = p.dtype;
  c.key_token_stride = c.value_token_stride = row;
  c.key_head_stride = c.value_head_stride = d;
  c.slot_mapping = p.slot_mapping;
  c.slot_mapping_int64 = p.slot_mapping_int64;
  c.num_tokens = static_cast<int32_t>(p.num_tokens);
  c.cache = layer.cache;
  reshape_and_cache(c);

  AttentionParams a;
  a.out = attn;
  a.out_token_stride = q_size;
  a.out_head_stride = d;
  a.query = qkv;
  a.query_token_stride = row;
  a.query_head_stride = d;
  a.dtype = p.dtype;
  a.num_heads = p.num_heads;
  a.cache = layer.cache;
  a.block_table_stride = p.block_table_stride;
  a.max_blocks_per_seq = p.max_blocks_per_seq;
  a.scale = p.scale;
  const int32_t nd = p.num_decode_seqs;
  if (nd > 0) {
    a.num_tokens = a.num_seqs = nd;
    a.block_tables = p.block_tables;
    a.context_lens = p.context_lens;
    a.cu_seqlens_q = nullptr;
    paged_attention_decode(a);
  }
  if (nd < p.num_seqs) {
    a.out = attn + nd * q_size * e;
    a.query = qkv + nd * row * e;
    a.num_tokens = static_cast<int32_t>(p.num_tokens - nd);
    a.num_seqs = p.num_seqs - nd;
    a.block_tables = p.block_tables + nd * p.block_table_stride;
    a.context_lens = p.context_lens + nd;
    a.cu_seqlens_q = prefill_cu.data();
    paged_attention_prefill(a);
  }
}

}  // namespace

int64_t decoder_workspace_bytes(const DecoderStackParams& p) {
  PAGEDLLM_CHECK_ARG(p.num_tokens >= 0 && p.hidden >= 0 && p.num_heads >= 0 &&
                         p.num_kv_heads >= 0 && p.head_dim >= 0 && p.intermediate >= 0,
                     "decoder_workspace_bytes: sizes must be >= 0");
  return layout(p).total;
}

void decoder_stack(const DecoderStackParams& p) {
  validate(p);
  const Layout l = layout(p);
  char* ws = static_cast<char*>(p.workspace);
  char *h = ws + l.h, *delta = ws + l.delta, *qkv = ws + l.qkv, *attn = ws + l.attn;
  char *gate_up = ws + l.gate_up, *act = ws + l.act;
  const int32_t q_size = p.num_heads * p.head_dim, kv_size = p.num_kv_heads * p.head_dim;
  // The prefill sequences' cu_seqlens_q, counted from their first token.
  std::vector<int32_t> prefill_cu(p.num_seqs - p.num_decode_seqs + 1);
  for (size_t i = 0; i < prefill_cu.size(); ++i) {
    prefill_cu[i] = p.cu_seqlens_q[p.num_decode_seqs + i] - p.num_decode_seqs;
  }
  for (int32_t i = 0; i < p.num_layers; ++i) {
    const DecoderLayerParams& layer = p.layers[i];
    norm(p, i == 0 ? nullptr : delta, layer.input_norm, h);  // delta: the last layer's MLP out
    project(p, h, p.hidden, layer.qkv, layer.qkv_bias, qkv, q_size + 2 * kv_size);
    attend(p, layer, qkv, attn, prefill_cu);
    project(p, attn, q_size, layer.o, layer.o_bias, delta, p.hidden);
    norm(p, delta, layer.post_norm, h);
    project(p, h, p.hidden, layer.gate_up, layer.gate_up_bias, gate_up, 2 * p.intermediate);
    SiluAndMulParams s;
    s.dtype = p.dtype;
    s.x = gate_up;
    s.x_row_stride = 2 * int64_t{p.intermediate};
    s.out = act;
    s.out_row_stride = p.intermediate;
    s.rows = p.num_tokens;
    s.cols = p.intermediate;
    silu_and_mul(s);
    project(p, act, p.intermediate, layer.down, layer.down_bias, delta, p.hidden);
  }
  norm(p, delta, p.final_norm, p.out);
}

}  // namespace pagedllm::kernels
