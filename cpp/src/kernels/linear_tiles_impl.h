// linear_tiles_impl.h (internal) — linear.h's register tiles, written once over a Traits type.
//
// No include guard on purpose: linear_avx512.cpp and linear_avx512_bf16.cpp each define, inside
// namespace pagedllm::kernels and an anonymous namespace, a struct Traits with
//   using Elem = float or uint16_t (bfloat16 bits); using W = the weight vector type
//   static W load_w(const Elem* p)             one 16-column step of a packed panel (64 bytes)
//   static __m512i broadcast(const Elem* x, int64_t d)   x's depth step d in every lane
//   static __m512i broadcast_last(const Elem* x, int64_t d)  the same for a step that holds
//                                              only x[2 d] (bfloat16, odd K; the rest is 0)
//   static __m512 madd(__m512 acc, W w, __m512i xb)  acc += the products of w and xb
//   static __m512 load_bias(const Elem* b, __mmask16 m) and store(Elem* y, __m512 v, __mmask16 m)
//   static constexpr int kPair                 K elements per depth step (1 or 2)
// then include this file, which adds block() in the same namespaces. Internal linkage only:
// the two compilations never meet at link time.
//
// Loop structure: the block's rows in register tiles of up to 6 rows (balanced: 16 rows are
// 6 + 5 + 5), each against the block's up to 4 panels: per depth step 4 weight vectors are
// loaded once and each row's x element is broadcast into 4 multiply-adds (24 accumulators).
// A tile's weight vectors stream from memory once; the block's later tiles read them from L2.
// A block of 7-8 rows at K >= 1024 is one tile of all its rows per 2 panels instead (tall_tile).

template <int MR, int NR>
void tile(const LinearParams& p, int64_t row0, int64_t panel0) {
  using Elem = typename Traits::Elem;
  const int64_t depth = packed_depth(p.dtype, p.in_features);
  const int64_t per_panel = packed_panel_elements(p.dtype, p.in_features);
  const Elem* x = static_cast<const Elem*>(p.x) + row0 * p.x_row_stride;
  const Elem* w = static_cast<const Elem*>(p.packed) + panel0 * per_panel;
  __m512 acc[MR][NR];
  for (int m = 0; m < MR; ++m)
    for (int j = 0; j < NR; ++j) acc[m][j] = _mm512_setzero_ps();
  constexpr int kStep = kLinearPanel * Traits::kPair;  // elements of one depth step of a panel
  const int64_t full = p.in_features / Traits::kPair;  // depth steps with all K elements in x
  for (int64_t d = 0; d < full; ++d) {
    typename Traits::W wv[NR];
    for (int j = 0; j < NR; ++j) wv[j] = Traits::load_w(w + j * per_panel + d * kStep);
    for (int m = 0; m < MR; ++m) {
      const __m512i xb = Traits::broadcast(x + m * p.x_row_stride, d);
      for (int j = 0; j < NR; ++j) acc[m][j] = Traits::madd(acc[m][j], wv[j], xb);
    }
  }
  if (full < depth) {  // bfloat16 with an odd K: the last pair's second element is 0
    typename Traits::W wv[NR];
    for (int j = 0; j < NR; ++j) wv[j] = Traits::load_w(w + j * per_panel + full * kStep);
    for (int m = 0; m < MR; ++m) {
      const __m512i xb = Traits::broadcast_last(x + m * p.x_row_stride, full);
      for (int j = 0; j < NR; ++j) acc[m][j] = Traits::madd(acc[m][j], wv[j], xb);
    }
  }
  const Elem* bias = static_cast<const Elem*>(p.bias);
  Elem* y = static_cast<Elem*>(p.y) + row0 * p.y_row_stride;
  for (int j = 0; j < NR; ++j) {
    const int64_t n0 = (panel0 + j) * kLinearPanel;
    const int64_t cols = p.out_features - n0;
    const __mmask16 mask = cols >= 16 ? static_cast<__mmask16>(0xFFFF)
                                      : static_cast<__mmask16>((1u << cols) - 1);
    const __m512 b = bias ? Traits::load_bias(bias + n0, mask) : _mm512_setzero_ps();
    for (int m = 0; m < MR; ++m) {
      Traits::store(y + m * p.y_row_stride + n0, _mm512_add_ps(acc[m][j], b), mask);
    }
  }
}

template <int MR>
void tile_rows(const LinearParams& p, int64_t row0, int64_t panel0, int panels) {
  switch (panels) {
    case 1: tile<MR, 1>(p, row0, panel0); return;
    case 2: tile<MR, 2>(p, row0, panel0); return;
    case 3: tile<MR, 3>(p, row0, panel0); return;
    default: tile<MR, 4>(p, row0, panel0); return;
  }
}

// 7-8 rows at K >= 1024: one tile of all of them per 2 panels (at most 16 accumulators), so each
// weight vector is read once, by a single pass, where tiles of up to 6 rows would stream the
// block's weights from memory in the first tile and read them again from L2 in the second, one
// pass after the other. Measured in one process against the 6-row tiles (2-core Zen 4, weights
// in DRAM; docs/BENCHMARKS.md): 0.95-1.22x, median 1.08x, on the "small" and "1b" projections at
// 7-8 rows; at 10-12 rows the tall tile was slower (0.76-1.10x: bound by its broadcasts), and at
// K 256-688 ("tiny") 0.89-1.15x.
template <int NR>
void tall_tile(const LinearParams& p, int rows, int64_t row0, int64_t panel0) {
  if (rows == 7) {
    tile<7, NR>(p, row0, panel0);
  } else {
    tile<8, NR>(p, row0, panel0);
  }
}

void block(const LinearParams& p, int64_t row0, int rows, int64_t panel0, int panels) {
  if (rows > kLinearTileRows && rows <= kLinearTallRows && p.in_features >= kLinearTallMinK) {
    for (int j = 0; j < panels; j += 2) {
      if (panels - j >= 2) {
        tall_tile<2>(p, rows, row0, panel0 + j);
      } else {
        tall_tile<1>(p, rows, row0, panel0 + j);
      }
    }
    return;
  }
  const int tiles = (rows + kLinearTileRows - 1) / kLinearTileRows;
  int r = 0;
  for (int t = 0; t < tiles; ++t) {
    const int mr = (rows - r) / (tiles - t);  // balanced: the remaining rows over the tiles left
    switch (mr) {
      case 1: tile_rows<1>(p, row0 + r, panel0, panels); break;
      case 2: tile_rows<2>(p, row0 + r, panel0, panels); break;
      case 3: tile_rows<3>(p, row0 + r, panel0, panels); break;
      case 4: tile_rows<4>(p, row0 + r, panel0, panels); break;
      case 5: tile_rows<5>(p, row0 + r, panel0, panels); break;
      default: tile_rows<6>(p, row0 + r, panel0, panels); break;
    }
    r += mr;
  }
}
