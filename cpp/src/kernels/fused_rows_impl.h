// fused_rows_impl.h (internal) — the row loops of fused_ops.h written once over float vectors,
// included by each fused_rows_<isa>.cpp inside an anonymous namespace after it defines:
//   kW (lanes), V (a vector of kW floats), vzero, vset1, vadd, vsub, vmul, vdiv, vneg,
//   vfmadd(a, b, c) = a * b + c (accumulations only), vexp (the SIMD files: fused_rows_vexp.h),
//   vsum (horizontal sum),
//   ld / st for float and for uint16_t (bfloat16 bits; st rounds to nearest even, NaN quiet),
//   vround_bf16 (the float a bfloat16 rounding of each lane gives), scalar_sqrt, and
//   argmax_row (FusedRowOps::argmax_f32: written per instruction set, it needs masks).
// Tails shorter than kW go through zero-padded stack buffers, so every element of a row gets
// the same arithmetic wherever it sits. No includes here: an ISA translation unit must not
// instantiate inline library code that a portable caller could later be linked against.

// The value as an element of type T holds it: float itself, or rounded to bfloat16.
template <class T> inline V rnd(V v);
template <> inline V rnd<float>(V v) { return v; }
template <> inline V rnd<uint16_t>(V v) { return vround_bf16(v); }

// Copies n (< kW) elements to a zeroed buffer of kW, or back.
template <class T> inline void pad_in(T* buf, const T* src, int32_t n) {
  for (int32_t i = 0; i < kW; ++i) buf[i] = i < n ? src[i] : T(0);
}
template <class T> inline void pad_out(T* dst, const T* buf, int32_t n) {
  for (int32_t i = 0; i < n; ++i) dst[i] = buf[i];
}

// Pass 1 of one row: x += delta (rounded to T) and the sum of squares of the new x.
template <class T> inline V add_square(T* x, const T* delta, V acc) {
  V s = ld(x);
  if (delta != nullptr) {
    s = rnd<T>(vadd(s, ld(delta)));
    st(x, s);
  }
  return vfmadd(s, s, acc);
}

template <class T> float add_and_sum_squares(T* x, const T* delta, int32_t cols) {
  V a0 = vzero(), a1 = vzero(), a2 = vzero(), a3 = vzero();
  const bool add = delta != nullptr;
  int32_t c = 0;
  for (; c + 4 * kW <= cols; c += 4 * kW) {
    a0 = add_square(x + c, add ? delta + c : nullptr, a0);
    a1 = add_square(x + c + kW, add ? delta + c + kW : nullptr, a1);
    a2 = add_square(x + c + 2 * kW, add ? delta + c + 2 * kW : nullptr, a2);
    a3 = add_square(x + c + 3 * kW, add ? delta + c + 3 * kW : nullptr, a3);
  }
  for (; c + kW <= cols; c += kW) a0 = add_square(x + c, add ? delta + c : nullptr, a0);
  if (c < cols) {
    T xb[kW], db[kW];
    pad_in(xb, x + c, cols - c);
    if (add) pad_in(db, delta + c, cols - c);
    a1 = add_square(xb, add ? db : nullptr, a1);
    if (add) pad_out(x + c, xb, cols - c);
  }
  return vsum(vadd(vadd(a0, a1), vadd(a2, a3)));
}

template <class T>
void add_rms_norm_row(T* x, const T* delta, T* out, const T* weight, int32_t cols, float eps) {
  const float sum = add_and_sum_squares(x, delta, cols);
  const V inv = vset1(1.0f / scalar_sqrt(sum / static_cast<float>(cols) + eps));
  int32_t c = 0;
  // out = weight * T(x * inv): the normalised row rounded to T before the weight (transformers)
  for (; c + kW <= cols; c += kW) st(out + c, vmul(ld(weight + c), rnd<T>(vmul(ld(x + c), inv))));
  if (c < cols) {
    T xb[kW], wb[kW], ob[kW];
    pad_in(xb, x + c, cols - c);
    pad_in(wb, weight + c, cols - c);
    st(ob, vmul(ld(wb), rnd<T>(vmul(ld(xb), inv))));
    pad_out(out + c, ob, cols - c);
  }
}

// silu(g) * u for one vector: silu rounded to T first (torch's silu, then mul).
template <class T> inline V silu_mul(V g, V u) {
  const V silu = rnd<T>(vdiv(g, vadd(vset1(1.0f), vexp(vneg(g)))));
  return vmul(silu, u);
}

template <class T> void silu_and_mul_row(const T* x, T* out, int32_t cols) {
  int32_t c = 0;
  for (; c + kW <= cols; c += kW) st(out + c, silu_mul<T>(ld(x + c), ld(x + cols + c)));
  if (c < cols) {
    T gb[kW], ub[kW], ob[kW];
    pad_in(gb, x + c, cols - c);
    pad_in(ub, x + cols + c, cols - c);
    st(ob, silu_mul<T>(ld(gb), ld(ub)));
    pad_out(out + c, ob, cols - c);
  }
}

// One vector of both halves: (x1, x2) <- (x1 c1 + x2 s1, x2 c2 + x1 s2), each product rounded.
template <class T>
inline void rotate(T* p1, T* p2, const T* c1, const T* c2, const T* s1, const T* s2) {
  const V x1 = ld(p1), x2 = ld(p2);
  const V o1 = vadd(rnd<T>(vmul(x1, ld(c1))), rnd<T>(vmul(x2, ld(s1))));
  const V o2 = vadd(rnd<T>(vmul(x2, ld(c2))), rnd<T>(vmul(x1, ld(s2))));
  st(p1, o1);
  st(p2, o2);
}

template <class T>
void rotary_token(T* x, int64_t head_stride, int32_t num_heads, const T* cos, const T* sin,
                  int32_t half) {
  const int32_t vec_end = half - half % kW;
  for (int32_t h = 0; h < num_heads; ++h) {
    T* p = x + h * head_stride;
    for (int32_t c = 0; c < vec_end; c += kW) {
      rotate(p + c, p + half + c, cos + c, cos + half + c, sin + c, sin + half + c);
    }
    if (vec_end < half) {
      const int32_t n = half - vec_end;
      T b1[kW], b2[kW], c1[kW], c2[kW], s1[kW], s2[kW];
      pad_in(b1, p + vec_end, n);
      pad_in(b2, p + half + vec_end, n);
      pad_in(c1, cos + vec_end, n);
      pad_in(c2, cos + half + vec_end, n);
      pad_in(s1, sin + vec_end, n);
      pad_in(s2, sin + half + vec_end, n);
      rotate(b1, b2, c1, c2, s1, s2);
      pad_out(p + vec_end, b1, n);
      pad_out(p + half + vec_end, b2, n);
    }
  }
}

// The table of this instruction set's loops.
const FusedRowOps kFusedRows = {
    kFusedRowsName,
    add_rms_norm_row<float>,
    add_rms_norm_row<uint16_t>,
    silu_and_mul_row<float>,
    silu_and_mul_row<uint16_t>,
    rotary_token<float>,
    rotary_token<uint16_t>,
    argmax_row,
};
