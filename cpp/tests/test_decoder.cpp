// decoder_stack (decoder.h) on every CPU engine this machine runs, against a double-precision
// Llama reference written out here (RMSNorm, projections with biases, RoPE, causal GQA attention
// over each sequence's own tokens, SiLU-and-mul): two steps over a paged float32 cache, a whole
// prefill of two sequences and then a mixed step (one decode row, one new prompt); and the
// argument checks, which refuse before anything is written.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <vector>

#include "cpu_engine_test.h"
#include "pagedllm/error.h"
#include "pagedllm/kernels/decoder.h"
#include "pagedllm/kernels/linear.h"
#include "test_data.h"

namespace pk = pagedllm::kernels;

namespace {

using pagedllm_test::randn;

constexpr int kHidden = 32, kHeads = 4, kKvHeads = 2, kHeadDim = 8, kInter = 48, kLayers = 2;
constexpr int kBlock = 4, kBlocks = 8;
constexpr int kQ = kHeads * kHeadDim, kKv = kKvHeads * kHeadDim, kQkv = kQ + 2 * kKv;
constexpr double kEps = 1e-5, kTheta = 10000.0;

struct Weights {  // row-major [out, in] as a checkpoint holds them
  std::vector<float> in_norm, post_norm, qkv, qkv_b, o, o_b, gate_up, gu_b, down, down_b;
  std::vector<float> qkv_p, o_p, gate_up_p, down_p;  // packed
};

std::vector<float> pack(const std::vector<float>& w, int out, int in) {
  std::vector<float> p(pk::packed_linear_elements(pk::ScalarType::kFloat32, out, in));
  pk::PackLinearParams pp;
  pp.weight = w.data();
  pp.weight_row_stride = in;
  pp.out_features = out;
  pp.in_features = in;
  pp.packed = p.data();
  pk::pack_linear_weight(pp);
  return p;
}

Weights make_layer(unsigned seed) {
  Weights w;
  w.in_norm = randn(kHidden, seed + 1, 0.1f);
  w.post_norm = randn(kHidden, seed + 2, 0.1f);
  for (float& v : w.in_norm) v += 1.0f;
  for (float& v : w.post_norm) v += 1.0f;
  w.qkv = randn(size_t(kQkv) * kHidden, seed + 3, 0.2f);
  w.qkv_b = randn(kQkv, seed + 4, 0.1f);
  w.o = randn(size_t(kHidden) * kQ, seed + 5, 0.2f);
  w.o_b = randn(kHidden, seed + 6, 0.1f);
  w.gate_up = randn(size_t(2 * kInter) * kHidden, seed + 7, 0.2f);
  w.gu_b = randn(2 * kInter, seed + 8, 0.1f);
  w.down = randn(size_t(kHidden) * kInter, seed + 9, 0.2f);
  w.down_b = randn(kHidden, seed + 10, 0.1f);
  w.qkv_p = pack(w.qkv, kQkv, kHidden);
  w.o_p = pack(w.o, kHidden, kQ);
  w.gate_up_p = pack(w.gate_up, 2 * kInter, kHidden);
  w.down_p = pack(w.down, kHidden, kInter);
  return w;
}

// ---- the double-precision reference, one token at a time ----------------------------------
using Vec = std::vector<double>;

Vec rms(const Vec& x, const std::vector<float>& w) {
  double ss = 0;
  for (double v : x) ss += v * v;
  const double r = 1.0 / std::sqrt(ss / x.size() + kEps);
  Vec out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = x[i] * r * w[i];
  return out;
}

Vec matvec(const std::vector<float>& w, const std::vector<float>& b, const Vec& x, int out) {
  Vec y(out);
  for (int o = 0; o < out; ++o) {
    double s = b[o];
    for (size_t i = 0; i < x.size(); ++i) s += double(w[o * x.size() + i]) * x[i];
    y[o] = s;
  }
  return y;
}

void rope(double* head, int pos) {
  for (int i = 0; i < kHeadDim / 2; ++i) {
    const double f = pos * std::pow(kTheta, -2.0 * i / kHeadDim);
    const double a = head[i], b = head[i + kHeadDim / 2];
    head[i] = a * std::cos(f) - b * std::sin(f);
    head[i + kHeadDim / 2] = b * std::cos(f) + a * std::sin(f);
  }
}

struct RefSeq {  // per layer, the keys and values of every token so far
  std::vector<std::vector<Vec>> k, v;
  RefSeq() : k(kLayers), v(kLayers) {}
};

// The final-norm output of one token at position pos of `seq` (its K/V appended).
Vec reference_token(const std::vector<Weights>& ws, const std::vector<float>& final_norm,
                    RefSeq& seq, const std::vector<float>& embedding, int pos) {
  Vec x(embedding.begin(), embedding.end());
  for (int l = 0; l < kLayers; ++l) {
    const Weights& w = ws[l];
    Vec qkv = matvec(w.qkv, w.qkv_b, rms(x, w.in_norm), kQkv);
    for (int h = 0; h < kHeads + kKvHeads; ++h) rope(&qkv[h * kHeadDim], pos);
    seq.k[l].emplace_back(qkv.begin() + kQ, qkv.begin() + kQ + kKv);
    seq.v[l].emplace_back(qkv.begin() + kQ + kKv, qkv.end());
    Vec attn(kQ, 0.0);
    for (int h = 0; h < kHeads; ++h) {
      const int g = h / (kHeads / kKvHeads);
      std::vector<double> s(seq.k[l].size());
      double m = -1e300, total = 0;
      for (size_t t = 0; t < s.size(); ++t) {
        double d = 0;
        for (int i = 0; i < kHeadDim; ++i) d += qkv[h * kHeadDim + i] * seq.k[l][t][g * kHeadDim + i];
        s[t] = d / std::sqrt(double(kHeadDim));
        m = std::max(m, s[t]);
      }
      for (double& e : s) total += (e = std::exp(e - m));
      for (size_t t = 0; t < s.size(); ++t) {
        for (int i = 0; i < kHeadDim; ++i) {
          attn[h * kHeadDim + i] += s[t] / total * seq.v[l][t][g * kHeadDim + i];
        }
      }
    }
    const Vec o = matvec(w.o, w.o_b, attn, kHidden);
    for (int i = 0; i < kHidden; ++i) x[i] += o[i];
    const Vec gu = matvec(w.gate_up, w.gu_b, rms(x, w.post_norm), 2 * kInter);
    Vec act(kInter);
    for (int i = 0; i < kInter; ++i) act[i] = gu[i] / (1.0 + std::exp(-gu[i])) * gu[kInter + i];
    const Vec d = matvec(w.down, w.down_b, act, kHidden);
    for (int i = 0; i < kHidden; ++i) x[i] += d[i];
  }
  return rms(x, final_norm);
}

// ---- the stack under test ----------------------------------------------------------------
struct Model {
  std::vector<Weights> layers;
  std::vector<float> final_norm = randn(kHidden, 99, 0.1f);
  std::vector<pk::DecoderLayerParams> params;
  std::vector<float> key_cache, value_cache;  // [layers][blocks, kv heads, block, head_dim]

  Model() {
    for (float& v : final_norm) v += 1.0f;
    const size_t per_layer = size_t(kBlocks) * kKvHeads * kBlock * kHeadDim;
    key_cache.assign(per_layer * kLayers, 0.0f);
    value_cache.assign(per_layer * kLayers, 0.0f);
    for (int l = 0; l < kLayers; ++l) layers.push_back(make_layer(100 * (l + 1)));
    for (int l = 0; l < kLayers; ++l) {
      const Weights& w = layers[l];
      pk::DecoderLayerParams p;
      p.input_norm = w.in_norm.data();
      p.post_norm = w.post_norm.data();
      p.qkv = w.qkv_p.data();
      p.qkv_bias = w.qkv_b.data();
      p.o = w.o_p.data();
      p.o_bias = w.o_b.data();
      p.gate_up = w.gate_up_p.data();
      p.gate_up_bias = w.gu_b.data();
      p.down = w.down_p.data();
      p.down_bias = w.down_b.data();
      p.cache.key_cache = key_cache.data() + l * per_layer;
      p.cache.value_cache = value_cache.data() + l * per_layer;
      p.cache.key_block_stride = p.cache.value_block_stride = kKvHeads * kBlock * kHeadDim;
      p.cache.num_blocks = kBlocks;
      p.cache.num_kv_heads = kKvHeads;
      p.cache.block_size = kBlock;
      p.cache.head_dim = kHeadDim;
      params.push_back(p);
    }
  }
};

// One step: seqs (id, first position, new tokens) with the decode rows first.
struct StepSeq {
  int id, start, count;
};

struct Step {
  std::vector<float> x, out, cos, sin, workspace_store;
  std::vector<int64_t> slots;
  std::vector<int32_t> tables, lens, cu;
  pk::DecoderStackParams p;
};

const int kTable[3][3] = {{0, 1, 2}, {3, 4, 7}, {5, 6, 7}};  // each sequence's blocks

void build_step(Model& m, const std::vector<StepSeq>& seqs, int num_decode,
                const std::vector<std::vector<float>>& emb, Step* s) {
  int n = 0;
  for (const StepSeq& q : seqs) n += q.count;
  s->x.clear();
  for (const auto& e : emb) s->x.insert(s->x.end(), e.begin(), e.end());
  s->out.assign(size_t(n) * kHidden, 0.0f);
  s->cu = {0};
  for (const StepSeq& q : seqs) {
    for (int t = 0; t < q.count; ++t) {
      const int pos = q.start + t;
      s->slots.push_back(int64_t{kTable[q.id][pos / kBlock]} * kBlock + pos % kBlock);
      for (int half = 0; half < 2; ++half) {
        for (int i = 0; i < kHeadDim / 2; ++i) {
          const double f = pos * std::pow(kTheta, -2.0 * i / kHeadDim);
          s->cos.push_back(static_cast<float>(std::cos(f)));
          s->sin.push_back(static_cast<float>(half ? std::sin(f) : -std::sin(f)));
        }
      }
    }
    s->tables.insert(s->tables.end(), kTable[q.id], kTable[q.id] + 3);
    s->lens.push_back(q.start + q.count);
    s->cu.push_back(s->cu.back() + q.count);
  }
  pk::DecoderStackParams& p = s->p;
  p.num_tokens = n;
  p.hidden = kHidden;
  p.num_heads = kHeads;
  p.num_kv_heads = kKvHeads;
  p.head_dim = kHeadDim;
  p.intermediate = kInter;
  p.eps = static_cast<float>(kEps);
  p.scale = static_cast<float>(1.0 / std::sqrt(double(kHeadDim)));
  p.x = s->x.data();
  p.out = s->out.data();
  p.final_norm = m.final_norm.data();
  p.cos = s->cos.data();
  p.sin = s->sin.data();
  p.slot_mapping = s->slots.data();
  p.slot_mapping_int64 = true;
  p.block_tables = s->tables.data();
  p.block_table_stride = 3;
  p.max_blocks_per_seq = 3;
  p.context_lens = s->lens.data();
  p.cu_seqlens_q = s->cu.data();
  p.num_seqs = static_cast<int32_t>(seqs.size());
  p.num_decode_seqs = num_decode;
  p.layers = m.params.data();
  p.num_layers = kLayers;
  p.workspace_bytes = pk::decoder_workspace_bytes(p);
  s->workspace_store.assign(size_t(p.workspace_bytes) / 4 + 16, 0.0f);
  p.workspace = reinterpret_cast<void*>(
      (reinterpret_cast<uintptr_t>(s->workspace_store.data()) + 63) / 64 * 64);
}

class DecoderStackTest : public pagedllm_test::CpuEngineTest {};

TEST_P(DecoderStackTest, MatchesTheDoubleReferenceOverAPrefillAndAMixedStep) {
  Model m;
  std::map<int, RefSeq> ref;
  // step 1: sequence 0 prefills 5 tokens, sequence 1 prefills 3; step 2: sequence 0 decodes
  // one token, sequence 2 prefills 6 (crossing a block boundary).
  const std::vector<std::vector<StepSeq>> steps = {{{0, 0, 5}, {1, 0, 3}}, {{0, 5, 1}, {2, 0, 6}}};
  const int decodes[] = {0, 1};
  unsigned seed = 7;
  for (size_t k = 0; k < steps.size(); ++k) {
    std::vector<std::vector<float>> emb;
    for (const StepSeq& q : steps[k]) {
      for (int t = 0; t < q.count; ++t) emb.push_back(randn(kHidden, seed++, 1.0f));
    }
    Step s;
    build_step(m, steps[k], decodes[k], emb, &s);
    pk::decoder_stack(s.p);
    int row = 0;
    for (const StepSeq& q : steps[k]) {
      for (int t = 0; t < q.count; ++t, ++row) {
        const Vec want = reference_token(m.layers, m.final_norm, ref[q.id], emb[row], q.start + t);
        for (int i = 0; i < kHidden; ++i) {
          ASSERT_NEAR(s.out[row * kHidden + i], want[i], 2e-4 * (1.0 + std::fabs(want[i])))
              << "step " << k << " row " << row << " element " << i;
        }
      }
    }
  }
}

TEST_P(DecoderStackTest, RefusesBadParamsBeforeWriting) {
  Model m;
  std::vector<std::vector<float>> emb = {randn(kHidden, 1), randn(kHidden, 2)};
  Step s;
  build_step(m, {{0, 0, 2}}, 0, emb, &s);
  const std::vector<float> x0 = s.x;
  auto refused = [&](pk::DecoderStackParams p) {
    EXPECT_THROW(pk::decoder_stack(p), pagedllm::Error);
    EXPECT_EQ(s.x, x0);
    for (float v : m.key_cache) ASSERT_EQ(v, 0.0f);
  };
  pk::DecoderStackParams p = s.p;
  p.workspace_bytes = 64;
  refused(p);
  p = s.p;
  p.num_decode_seqs = 1;  // cu[1] = 2, not 1
  refused(p);
  p = s.p;
  p.num_heads = 3;  // not a multiple of the KV heads
  refused(p);
  p = s.p;
  p.head_dim = 7;
  refused(p);
  p = s.p;
  p.dtype = pk::ScalarType::kFloat16;
  refused(p);
  std::vector<pk::DecoderLayerParams> layers = m.params;
  layers[1].cache.num_kv_heads = 1;
  p = s.p;
  p.layers = layers.data();
  refused(p);
  layers = m.params;
  layers[0].down = nullptr;
  p.layers = layers.data();
  refused(p);
  s.p.workspace = static_cast<char*>(s.p.workspace) + 4;  // misaligned
  refused(s.p);
}

INSTANTIATE_TEST_SUITE_P(Engines, DecoderStackTest,
                         ::testing::Values("generic", "avx2", "avx512", "avx512_bf16"));

}  // namespace
