// rotary_embedding: RoPE applied in place to every head of every token (q and k of a fused qkv
// projection in one call), from per-token cos / sin rows, float32 and bfloat16.
#include <utility>

#include "fused_rows.h"
#include "pagedllm/error.h"
#include "pagedllm/kernels/fused_ops.h"
#include "pagedllm/kernels/kernels.h"

namespace pagedllm::kernels {
namespace {

constexpr int64_t kMinElementsPerGroup = 1 << 17;

// x's heads must not overlap, whatever the order of its token and head dims in memory (a
// [heads, tokens, head_dim] tensor transposed to [tokens, heads, head_dim] is as good as a
// token-major one): taking the dims of size > 1 by increasing stride, each stride must be at
// least the span of the rows inside it (head_dim, then that dim's whole extent). The kernel
// itself walks any such strides.
void check_x_layout(const RotaryParams& p) {
  struct Dim {
    int64_t stride, size;
    const char* name;
  };
  Dim dims[2] = {{p.x_token_stride, p.num_tokens, "token"}, {p.x_head_stride, p.num_heads, "head"}};
  if (dims[1].stride < dims[0].stride) std::swap(dims[0], dims[1]);
  int64_t span = p.head_dim;  // elements covered by the dims taken so far
  for (const Dim& d : dims) {
    if (d.size <= 1) continue;
    PAGEDLLM_CHECK_ARG(d.stride >= span,
                       "rotary_embedding: x's " << d.name << " stride " << d.stride
                           << " overlaps the " << span << " elements inside it (x is [num_tokens "
                           << p.num_tokens << ", num_heads " << p.num_heads << ", head_dim "
                           << p.head_dim << "] with token stride " << p.x_token_stride
                           << " and head stride " << p.x_head_stride
                           << "; any order of the token and head dims works if no two heads "
                              "overlap)");
    int64_t reach = 0;  // from this dim's first row to its last
    PAGEDLLM_CHECK_ARG(!__builtin_mul_overflow(d.stride, d.size - 1, &reach) &&
                           !__builtin_add_overflow(reach, span, &span),
                       "rotary_embedding: x's " << d.name << " stride " << d.stride
                                                << " times its size " << d.size << " overflows");
  }
}

void validate(const RotaryParams& p) {
  PAGEDLLM_CHECK_ARG(p.dtype == ScalarType::kFloat32 || p.dtype == ScalarType::kBFloat16,
                     "rotary_embedding: dtype must be float32 or bfloat16, got "
                         << scalar_type_name(p.dtype));
  PAGEDLLM_CHECK_ARG(p.num_tokens >= 0 && p.num_heads >= 0,
                     "rotary_embedding: num_tokens (" << p.num_tokens << ") and num_heads ("
                                                      << p.num_heads << ") must be >= 0");
  PAGEDLLM_CHECK_ARG(p.head_dim >= 2 && p.head_dim % 2 == 0,
                     "rotary_embedding: head_dim must be even and >= 2, got " << p.head_dim);
  check_x_layout(p);
  PAGEDLLM_CHECK_ARG(p.num_tokens <= 1 ||
                         (p.cos_token_stride >= p.head_dim && p.sin_token_stride >= p.head_dim),
                     "rotary_embedding: table token strides (cos " << p.cos_token_stride
                         << ", sin " << p.sin_token_stride << ") must be >= head_dim "
                         << p.head_dim);
  PAGEDLLM_CHECK_ARG(p.num_tokens == 0 || p.num_heads == 0 || (p.x && p.cos && p.sin),
                     "rotary_embedding: data is null");
}

template <class T>
void run_tokens(const RotaryParams& p,
                void (*token)(T*, int64_t, int32_t, const T*, const T*, int32_t)) {
  struct Ctx {
    const RotaryParams* p;
    void (*token)(T*, int64_t, int32_t, const T*, const T*, int32_t);
  } ctx{&p, token};
  const int64_t per_token = int64_t{p.num_heads} * p.head_dim;
  for_row_groups(p.num_tokens, per_token, kMinElementsPerGroup,
                 [](const void* c, int64_t b, int64_t e) {
    const Ctx& k = *static_cast<const Ctx*>(c);
    const RotaryParams& q = *k.p;
    for (int64_t t = b; t < e; ++t) {
      k.token(static_cast<T*>(q.x) + t * q.x_token_stride, q.x_head_stride, q.num_heads,
              static_cast<const T*>(q.cos) + t * q.cos_token_stride,
              static_cast<const T*>(q.sin) + t * q.sin_token_stride, q.head_dim / 2);
    }
  }, &ctx);
}

}  // namespace

void rotary_embedding(const RotaryParams& p) {
  validate(p);
  if (p.num_heads == 0) return;
  const FusedRowOps& ops = current_fused_rows();
  if (p.dtype == ScalarType::kFloat32) {
    run_tokens<float>(p, ops.rotary_f32);
  } else {
    run_tokens<uint16_t>(p, ops.rotary_bf16);
  }
}

}  // namespace pagedllm::kernels
