// fp8 decode tables (computed at compile time) and the names of the kernel dtypes.
#include <string>

#include "pagedllm/error.h"
#include "pagedllm/kernels/convert.h"
#include "pagedllm/kernels/kernels.h"

namespace pagedllm::kernels {
namespace {

constexpr float pow2(int e) {
  float r = 1.0f;
  for (; e > 0; --e) r *= 2.0f;
  for (; e < 0; ++e) r *= 0.5f;
  return r;
}

// Exact value of an fp8 byte with `man_bits` mantissa bits and exponent bias `bias`.
// `ieee_specials`: the all-ones exponent encodes inf/NaN (e5m2); otherwise only the all-ones
// byte (sign aside) is NaN (e4m3fn, which has no infinities).
constexpr float fp8_value(int byte, int man_bits, int bias, bool ieee_specials) {
  const int exp_bits = 7 - man_bits;
  const int exp = (byte >> man_bits) & ((1 << exp_bits) - 1);
  const int man = byte & ((1 << man_bits) - 1);
  const int exp_max = (1 << exp_bits) - 1;
  float mag = 0.0f;
  if (ieee_specials && exp == exp_max) {
    mag = man == 0 ? __builtin_inff() : __builtin_nanf("");
  } else if (!ieee_specials && exp == exp_max && man == (1 << man_bits) - 1) {
    mag = __builtin_nanf("");
  } else if (exp == 0) {
    mag = static_cast<float>(man) * pow2(1 - bias - man_bits);
  } else {
    mag = static_cast<float>((1 << man_bits) + man) * pow2(exp - bias - man_bits);
  }
  return (byte & 0x80) ? -mag : mag;
}

struct Fp8Tables {
  float e4m3[256];
  float e5m2[256];
};

constexpr Fp8Tables make_fp8_tables() {
  Fp8Tables t{};
  for (int i = 0; i < 256; ++i) {
    t.e4m3[i] = fp8_value(i, 3, 7, false);
    t.e5m2[i] = fp8_value(i, 2, 15, true);
  }
  return t;
}

constexpr Fp8Tables kFp8Tables = make_fp8_tables();

}  // namespace

const float (&kFp8E4M3ToFloat)[256] = kFp8Tables.e4m3;
const float (&kFp8E5M2ToFloat)[256] = kFp8Tables.e5m2;

bool parse_kv_cache_dtype(const std::string& name, CacheType* out) {
  if (name == "auto") return false;
  if (name == "fp16" || name == "float16" || name == "half") {
    *out = CacheType::kFloat16;
  } else if (name == "bf16" || name == "bfloat16") {
    *out = CacheType::kBFloat16;
  } else if (name == "fp32" || name == "float32" || name == "float") {
    *out = CacheType::kFloat32;
  } else if (name == "fp8" || name == "fp8_e4m3") {
    *out = CacheType::kFp8E4M3;
  } else if (name == "fp8_e5m2") {
    *out = CacheType::kFp8E5M2;
  } else {
    PAGEDLLM_CHECK_ARG(false, "unknown kv_cache_dtype '"
                                  << name
                                  << "', expected one of auto, fp16, bf16, fp32, fp8, fp8_e4m3, "
                                     "fp8_e5m2");
  }
  return true;
}

const char* cache_type_name(CacheType t) {
  switch (t) {
    case CacheType::kFloat32: return "float32";
    case CacheType::kFloat16: return "float16";
    case CacheType::kBFloat16: return "bfloat16";
    case CacheType::kFp8E4M3: return "fp8_e4m3";
    case CacheType::kFp8E5M2: return "fp8_e5m2";
  }
  return "?";
}

const char* scalar_type_name(ScalarType t) {
  switch (t) {
    case ScalarType::kFloat32: return "float32";
    case ScalarType::kFloat16: return "float16";
    case ScalarType::kBFloat16: return "bfloat16";
  }
  return "?";
}

}  // namespace pagedllm::kernels
