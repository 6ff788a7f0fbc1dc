// The portable attention engine: 8-lane vectors as plain float arrays (the compiler maps them
// to whatever SIMD the baseline target has). Runs on any CPU.
#include <cmath>
#include <cstdint>

#include "engine.h"
#include "pagedllm/kernels/convert.h"

#define PAGEDLLM_ENGINE_NS generic_engine_ns

namespace pagedllm::kernels::PAGEDLLM_ENGINE_NS {
namespace {

struct V8 {
  float x[8];
};

inline V8 vzero() { return V8{{0, 0, 0, 0, 0, 0, 0, 0}}; }
inline V8 vset1(float f) { return V8{{f, f, f, f, f, f, f, f}}; }
inline V8 vload(const float* p) {
  V8 v;
  for (int i = 0; i < 8; ++i) v.x[i] = p[i];
  return v;
}
inline void vstore(float* p, V8 v) {
  for (int i = 0; i < 8; ++i) p[i] = v.x[i];
}
// a * b + c (two roundings: std::fma would be a slow library call without hardware FMA).
inline V8 vfmadd(V8 a, V8 b, V8 c) {
  for (int i = 0; i < 8; ++i) c.x[i] += a.x[i] * b.x[i];
  return c;
}
inline V8 vadd(V8 a, V8 b) {
  for (int i = 0; i < 8; ++i) a.x[i] += b.x[i];
  return a;
}
inline V8 vmul(V8 a, V8 b) {
  for (int i = 0; i < 8; ++i) a.x[i] *= b.x[i];
  return a;
}
inline V8 vmax(V8 a, V8 b) {
  for (int i = 0; i < 8; ++i) a.x[i] = a.x[i] > b.x[i] ? a.x[i] : b.x[i];
  return a;
}
inline V8 vkeep_lt(V8 s, V8 pos, V8 lim) {
  for (int i = 0; i < 8; ++i) s.x[i] = pos.x[i] < lim.x[i] ? s.x[i] : -INFINITY;
  return s;
}
inline V8 vexp(V8 a) {
  for (int i = 0; i < 8; ++i) a.x[i] = std::exp(a.x[i]);
  return a;
}
inline V8 vexp2_tile(V8 a) {  // the prefill tile's 2^x (engine_prefill_impl.h)
  for (int i = 0; i < 8; ++i) a.x[i] = std::exp2(a.x[i]);
  return a;
}
inline float vhmax(V8 a) {
  float m = a.x[0];
  for (int i = 1; i < 8; ++i) m = a.x[i] > m ? a.x[i] : m;
  return m;
}
inline float vhsum(V8 a) {
  float s = 0;
  for (int i = 0; i < 8; ++i) s += a.x[i];
  return s;
}
inline V8 vsum8(const V8* a) {
  V8 v;
  for (int i = 0; i < 8; ++i) v.x[i] = vhsum(a[i]);
  return v;
}
template <CacheType CT>
inline V8 vload_cache(const uint8_t* p) {
  V8 v;
  for (int i = 0; i < 8; ++i) v.x[i] = load_cache_scalar(p, CT, i);
  return v;
}

template <CacheType CT>
inline void vload_cache2(const uint8_t* p, V8* lo, V8* hi) {
  *lo = vload_cache<CT>(p);
  constexpr int kBytes = CT == CacheType::kFloat32                                 ? 4
                         : (CT == CacheType::kFloat16 || CT == CacheType::kBFloat16) ? 2
                                                                                     : 1;
  *hi = vload_cache<CT>(p + 8 * kBytes);
}

constexpr float kE4M3ReadMul = 1.0f;  // exact table decode
constexpr bool kPrefillTile = false;  // see engine_prefill_impl.h

// The width engine_impl.h is written over, and its 8-element forms (the full ones here: a
// head_dim tail never occurs with 8 lanes).
constexpr int kW = 8;
constexpr int kAcc = 8;  // of 16 vector registers
using V = V8;
inline V vload8(const float* p) { return vload(p); }
inline void vstore8(float* p, V v) { vstore(p, v); }
template <CacheType CT>
inline V vload_cache8(const uint8_t* p) {
  return vload_cache<CT>(p);
}
inline void vsum_tile(const V* a, float* out) { vstore(out, vsum8(a)); }

}  // namespace
}  // namespace pagedllm::kernels::PAGEDLLM_ENGINE_NS

#include "engine_impl.h"
#include "engine_prefill_impl.h"

namespace pagedllm::kernels {

const EngineOps& generic_engine() {
  static const EngineOps ops{"generic", &PAGEDLLM_ENGINE_NS::attend_task,
                             PAGEDLLM_ENGINE_NS::kE4M3ReadMul, &PAGEDLLM_ENGINE_NS::score_bounds,
                             &PAGEDLLM_ENGINE_NS::prefill_task,
                             &PAGEDLLM_ENGINE_NS::prefill_work_floats,
                             &PAGEDLLM_ENGINE_NS::attend_heads};
  return ops;
}

}  // namespace pagedllm::kernels
