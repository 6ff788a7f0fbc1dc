// gather_token_rows: a step's embedding rows and RoPE rows in one call (the Python it replaces
// was two to six small torch ops a step: an embedding lookup, a max, two index_selects).
#include <cstring>

#include "pagedllm/error.h"
#include "pagedllm/kernels/fused_ops.h"
#include "pagedllm/kernels/linear.h"

namespace pagedllm::kernels {
namespace {

void validate(const TokenRowsParams& p) {
  PAGEDLLM_CHECK_ARG(p.dtype == ScalarType::kFloat32 || p.dtype == ScalarType::kBFloat16,
                     "gather_token_rows: dtype must be float32 or bfloat16");
  PAGEDLLM_CHECK_ARG(p.num_tokens >= 0, "gather_token_rows: num_tokens must be >= 0, got "
                                            << p.num_tokens);
  PAGEDLLM_CHECK_ARG(p.vocab >= 1 && p.hidden >= 1 && p.head_dim >= 1 && p.table_rows >= 0,
                     "gather_token_rows: vocab " << p.vocab << ", hidden " << p.hidden
                                                 << ", head_dim " << p.head_dim << ", table rows "
                                                 << p.table_rows << ": expected positive sizes");
  PAGEDLLM_CHECK_ARG(p.embedding_packed || p.embedding_row_stride >= p.hidden,
                     "gather_token_rows: embedding row stride " << p.embedding_row_stride
                                                                << " must be >= hidden "
                                                                << p.hidden);
  if (p.num_tokens == 0) return;
  PAGEDLLM_CHECK_ARG(p.ids && p.positions && p.embedding && p.x && p.cos && p.sin &&
                         (p.table_rows == 0 || (p.cos_table && p.sin_table)),
                     "gather_token_rows: data is null");
  for (int64_t i = 0; i < p.num_tokens; ++i) {
    PAGEDLLM_CHECK_INDEX(p.ids[i] >= 0 && p.ids[i] < p.vocab,
                         "embedding id " << p.ids[i] << " at token " << i
                                         << ": expected ids in [0, " << p.vocab << ")");
    PAGEDLLM_CHECK_INDEX(p.positions[i] >= 0, "position " << p.positions[i] << " at token " << i
                                                          << ": expected positions >= 0");
  }
}

}  // namespace

int64_t gather_token_rows(const TokenRowsParams& p) {
  validate(p);
  if (p.num_tokens == 0) return 0;
  int64_t last = 0;
  for (int64_t i = 0; i < p.num_tokens; ++i) last = p.positions[i] > last ? p.positions[i] : last;
  if (last >= p.table_rows) return last + 1;
  const size_t es = p.dtype == ScalarType::kFloat32 ? 4 : 2;
  if (p.embedding_packed) {
    PackedRowsParams r;
    r.dtype = p.dtype;
    r.packed = p.embedding;
    r.out_features = p.vocab;
    r.in_features = p.hidden;
    r.ids = p.ids;
    r.rows = p.num_tokens;
    r.out = p.x;
    r.out_row_stride = p.hidden;
    packed_linear_rows(r);
  } else {
    for (int64_t i = 0; i < p.num_tokens; ++i) {
      std::memcpy(static_cast<char*>(p.x) + i * p.hidden * es,
                  static_cast<const char*>(p.embedding) + p.ids[i] * p.embedding_row_stride * es,
                  p.hidden * es);
    }
  }
  const size_t row = p.head_dim * es;
  for (int64_t i = 0; i < p.num_tokens; ++i) {
    const size_t src = p.positions[i] * row;
    std::memcpy(static_cast<char*>(p.cos) + i * row, static_cast<const char*>(p.cos_table) + src, row);
    std::memcpy(static_cast<char*>(p.sin) + i * row, static_cast<const char*>(p.sin_table) + src, row);
  }
  return 0;
}

}  // namespace pagedllm::kernels
