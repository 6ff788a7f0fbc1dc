// fused_rows_vexp.h (internal) — the float vexp of the SIMD row loops (fused_rows_avx2.cpp,
// fused_rows_avx512.cpp), written once over their vector ops; each includes it inside its
// anonymous namespace, before fused_rows_impl.h, after it defines:
//   V, vset1, vadd, vmul, vfmadd, vmin, vmax, vround (to the nearest integer),
//   vfnmadd(a, b, c) = c - a * b, vldexp(y, n) = y * 2^n (n integral, in [-150, 128]) and
//   vkeep_nan(e, x) (x in the lanes where x is NaN, e elsewhere).
// No includes, for the reason fused_rows_impl.h gives.

// exp(x) to about 1 ulp: x = n ln2 + r (Cody-Waite), Cephes' degree-6 polynomial for e^r, and
// 2^n applied as two factors (vldexp) so that n in [-150, 128] neither overflows the exponent
// field nor flushes early (results below 2^-126 come out denormal, above 88.72 infinite). NaN
// stays NaN.
inline V vexp(V x) {
  const V xc = vmin(vmax(x, vset1(-104.0f)), vset1(89.0f));
  const V n = vround(vmul(xc, vset1(1.44269504088896341f)));
  V r = vfnmadd(n, vset1(0.693359375f), xc);
  r = vfnmadd(n, vset1(-2.12194440e-4f), r);
  V p = vset1(1.9875691500e-4f);
  p = vfmadd(p, r, vset1(1.3981999507e-3f));
  p = vfmadd(p, r, vset1(8.3334519073e-3f));
  p = vfmadd(p, r, vset1(4.1665795894e-2f));
  p = vfmadd(p, r, vset1(1.6666665459e-1f));
  p = vfmadd(p, r, vset1(5.0000001201e-1f));
  const V y = vfmadd(p, vmul(r, r), vadd(r, vset1(1.0f)));
  return vkeep_nan(vldexp(y, n), x);
}
