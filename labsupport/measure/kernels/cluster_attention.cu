// One decode step's attention for one token, in one kernel whose stretches combine on chip.
//
// decode_attention_one (decode_attention.py) splits each query head's cached positions into stretches,
// one program each, and the last program of a head to finish combines the stretches' softmax
// partials: it has to store them, count itself in with an atomic, and load the others' back. Those
// are three dependent trips through L2 after the QKV GEMV's output is there. Here the stretches of a
// head are one thread-block cluster (Hopper, sm_90): each block writes its partial straight into the
// shared memory of the cluster's first block (distributed shared memory), the cluster waits at one
// hardware barrier, and that block combines them. Triton has no way to name a cluster's shared
// memory, hence CUDA C++.
//
// Layout: block (stretch, head) of WARPS warps; each warp owns 16 positions of the stretch, each lane
// 4 of the head's 128 dimensions (8 bytes of every k and v row). Before griddepcontrol.wait (the kernel
// is launched with programmatic dependent launch) each lane loads what the QKV GEMV does not write:
// its cached k and v (positions before the new token), the rotary row and both norms' weights. After
// it: q, the new k and v, their RMSNorm and rotary embedding (sums across the warp by shuffles), the
// scores, the warp's softmax, the block's, the cluster's.
//
// The kernel lets the next one (o_proj) launch as soon as it starts rather than at its wait, so that o_proj's
// programs may take the SM slots the QKV GEMV frees and issue their first weight loads during its tail rather
// than among this kernel's own reads after the wait. On an H100 this made the whole step about 0.03 ms faster
// (rung 14, folded-norms, timed as CUDA-graph replays). o_proj still waits for this kernel to end before it
// reads its output.
//
// The QKV GEMV's output is read through L2 (ld.global.cg), never through the read-only path that nvcc picks
// for a `const __restrict__` pointer (ld.global.nc). That path is correct only for memory that nothing writes
// while the kernel lives, and with PDL this kernel lives while the QKV GEMV still writes its output. With the
// read-only form, rung 13's error against float32 changed from run to run with the same tilings (0.32 to 0.64
// on an H100, twice eager's at worst) while rung 12's, the same GEMVs with Triton's attention, did not; read
// through L2, its 31 calls in closing-the-gap 20261207T044556Z gave one set of logits, with rung 11's error.
//
// The arithmetic follows the Triton kernels: Qwen3's per-head RMSNorm with its statistic in float32,
// rounded to bfloat16 before and after the weight, the rotary embedding rounded to bfloat16, scores,
// softmax and the weighted sum in float32, the output rounded to bfloat16.

#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

namespace cg = cooperative_groups;

constexpr int D = 128;          // head dimension
constexpr int ROWS_PER_WARP = 16;  // positions a warp owns
constexpr int MAX_CLUSTER = 8;  // the portable cluster size

__device__ __forceinline__ float warp_sum(float x) {
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

__device__ __forceinline__ float round_bf16(float x) { return __bfloat162float(__float2bfloat16(x)); }

__device__ __forceinline__ void unpack4(uint2 raw, float out[4]) {
  // four bfloat16 packed in 8 bytes, as float
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&raw);
  float2 a = __bfloat1622float2(h[0]), b = __bfloat1622float2(h[1]);
  out[0] = a.x; out[1] = a.y; out[2] = b.x; out[3] = b.y;
}

__device__ __forceinline__ void load4(const __nv_bfloat16* p, float out[4]) {
  // four consecutive bfloat16 (8 bytes, aligned) as float
  unpack4(*reinterpret_cast<const uint2*>(p), out);
}

__device__ __forceinline__ void load4_l2(const __nv_bfloat16* p, float out[4]) {
  // the same from L2 (ld.global.cg): for what the kernel before writes while this one runs (the header says why)
  unpack4(__ldcg(reinterpret_cast<const uint2*>(p)), out);
}

__device__ __forceinline__ void store4(__nv_bfloat16* p, const float v[4]) {
  __nv_bfloat162 h[2] = {__floats2bfloat162_rn(v[0], v[1]), __floats2bfloat162_rn(v[2], v[3])};
  *reinterpret_cast<uint2*>(p) = *reinterpret_cast<uint2*>(h);
}

// Qwen3's RMSNorm over one head (x at the lane's dims, xr at their rotated partners), then the rotary
// embedding x * cos + rotate_half(x) * sin; rounded as the Triton kernels round.
__device__ __forceinline__ void norm_rope(const float x[4], const float xr[4], const float w[4], const float wr[4],
                                          const float cs[4], const float sn[4], float sign, float eps, float out[4]) {
  float ss = 0.f;
  for (int i = 0; i < 4; ++i) ss += x[i] * x[i];
  float r = 1.f / sqrtf(warp_sum(ss) / D + eps);
  for (int i = 0; i < 4; ++i) {
    float n = round_bf16(round_bf16(x[i] * r) * w[i]);
    float nr = round_bf16(round_bf16(xr[i] * r) * wr[i]);
    out[i] = round_bf16(n * cs[i] + sign * nr * sn[i]);
  }
}

struct Partial {  // one stretch's softmax partial: its maximum score, the sum, the weighted values
  float m, l;
  float acc[D];
};

template <int WARPS>
__global__ void __launch_bounds__(WARPS * 32) cluster_attention_kernel(
    const __nv_bfloat16* qkv, const __nv_bfloat16* __restrict__ q_norm,
    const __nv_bfloat16* __restrict__ k_norm, const __nv_bfloat16* __restrict__ cos_t,
    const __nv_bfloat16* __restrict__ sin_t, __nv_bfloat16* k_cache, __nv_bfloat16* v_cache,
    const int64_t* __restrict__ pos_p, __nv_bfloat16* __restrict__ out, float eps, float scale, int heads,
    int kv_heads, int slots, int pdl) {
  constexpr int BLOCK_S = WARPS * ROWS_PER_WARP;
  __shared__ float warp_m[WARPS], warp_l[WARPS];
  __shared__ float warp_acc[WARPS][D];
  __shared__ Partial parts[MAX_CLUSTER];  // the cluster's first block's: one per stretch

  cg::cluster_group cluster = cg::this_cluster();
  const int part = blockIdx.x, h = blockIdx.y;
  const int group = heads / kv_heads, kvh = h / group;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int d0 = lane * 4, dr0 = (d0 + D / 2) % D;  // the lane's dims and their rotated partners
  const float sign = d0 < D / 2 ? -1.f : 1.f;
  const int pos = static_cast<int>(*pos_p);
  const int first = part * BLOCK_S + warp * ROWS_PER_WARP;  // the warp's first position

  if (pdl) asm volatile("griddepcontrol.launch_dependents;");  // the next kernel may launch (the header says why)

  // Before the wait: what no kernel of this step writes.
  const size_t head_at = static_cast<size_t>(kvh) * slots * D;
  uint2 k_raw[ROWS_PER_WARP], v_raw[ROWS_PER_WARP];  // kept as bfloat16 until used
#pragma unroll
  for (int j = 0; j < ROWS_PER_WARP; ++j) {
    int p = first + j;
    k_raw[j] = v_raw[j] = make_uint2(0u, 0u);
    if (p < pos) {
      k_raw[j] = *reinterpret_cast<const uint2*>(k_cache + head_at + static_cast<size_t>(p) * D + d0);
      v_raw[j] = *reinterpret_cast<const uint2*>(v_cache + head_at + static_cast<size_t>(p) * D + d0);
    }
  }
  float cs[4], sn[4], qw[4], qwr[4], kw[4], kwr[4];
  load4(cos_t + static_cast<size_t>(pos) * D + d0, cs);
  load4(sin_t + static_cast<size_t>(pos) * D + d0, sn);
  load4(q_norm + d0, qw);
  load4(q_norm + dr0, qwr);
  load4(k_norm + d0, kw);
  load4(k_norm + dr0, kwr);

  // Every block of the cluster has started once this barrier completes (waited on before writing into
  // another block's shared memory); arrived at here, so that the wait costs nothing later.
  asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
  if (pdl) asm volatile("griddepcontrol.wait;" ::: "memory");  // the QKV GEMV's output is read from here on
  float qx[4], qr[4], kx[4], kr[4], vn[4];
  load4_l2(qkv + static_cast<size_t>(h) * D + d0, qx);
  load4_l2(qkv + static_cast<size_t>(h) * D + dr0, qr);
  load4_l2(qkv + static_cast<size_t>(heads + kvh) * D + d0, kx);
  load4_l2(qkv + static_cast<size_t>(heads + kvh) * D + dr0, kr);
  load4_l2(qkv + static_cast<size_t>(heads + kv_heads + kvh) * D + d0, vn);
  float q[4], kn[4];
  norm_rope(qx, qr, qw, qwr, cs, sn, sign, eps, q);
  norm_rope(kx, kr, kw, kwr, cs, sn, sign, eps, kn);
  if (h % group == 0 && part == 0 && warp == 0) {  // one block per K/V head writes the new position
    store4(k_cache + head_at + static_cast<size_t>(pos) * D + d0, kn);
    store4(v_cache + head_at + static_cast<size_t>(pos) * D + d0, vn);
  }

  // The warp's 16 scores (the new position's k and v from registers), its softmax, its weighted values.
  float s[ROWS_PER_WARP];
  float m = -INFINITY;
#pragma unroll
  for (int j = 0; j < ROWS_PER_WARP; ++j) {
    int p = first + j;
    float k[4];
    unpack4(k_raw[j], k);
    float dot = 0.f;
    for (int i = 0; i < 4; ++i) dot += (p == pos ? kn[i] : k[i]) * q[i];
    dot = warp_sum(dot) * scale;
    s[j] = p <= pos ? dot : -INFINITY;
    m = fmaxf(m, s[j]);
  }
  float l = 0.f, acc[4] = {0.f, 0.f, 0.f, 0.f};
  const float shift = m == -INFINITY ? 0.f : m;
#pragma unroll
  for (int j = 0; j < ROWS_PER_WARP; ++j) {
    float e = __expf(s[j] - shift), vv[4];
    unpack4(v_raw[j], vv);
    l += e;
    for (int i = 0; i < 4; ++i) acc[i] += e * (first + j == pos ? vn[i] : vv[i]);
  }
  if (lane == 0) warp_m[warp] = m, warp_l[warp] = l;
  for (int i = 0; i < 4; ++i) warp_acc[warp][d0 + i] = acc[i];
  __syncthreads();

  // The block's partial (thread t holds dimension t, and t + 64 with 64 threads), written into the first
  // block's shared memory.
  asm volatile("barrier.cluster.wait.aligned;" ::: "memory");
  Partial* mine = cluster.map_shared_rank(&parts[part], 0);
  {
    float top = -INFINITY;
    for (int w = 0; w < WARPS; ++w) top = fmaxf(top, warp_m[w]);
    const float base = top == -INFINITY ? 0.f : top;
    for (int t = threadIdx.x; t < D; t += blockDim.x) {  // 32 positions a block: 64 threads for 128 dims
      float a = 0.f, total = 0.f;
      for (int w = 0; w < WARPS; ++w) {
        float c = __expf(warp_m[w] - base);
        a += c * warp_acc[w][t];
        total += c * warp_l[w];
      }
      mine->acc[t] = a;
      if (t == 0) mine->m = top, mine->l = total;
    }
  }
  cluster.sync();  // every stretch's partial is in the first block's shared memory

  if (part == 0) {
    const int n = cluster.num_blocks();
    float top = -INFINITY;
    for (int r = 0; r < n; ++r) top = fmaxf(top, parts[r].m);
    for (int t = threadIdx.x; t < D; t += blockDim.x) {
      float num = 0.f, den = 0.f;
      for (int r = 0; r < n; ++r) {
        float c = __expf(parts[r].m - top);
        num += c * parts[r].acc[t];
        den += c * parts[r].l;
      }
      out[static_cast<size_t>(h) * D + t] = __float2bfloat16(num / den);
    }
  }
}

// Launch on `stream`: grid (stretches, heads), one cluster per head, with programmatic dependent
// launch where `pdl`. Returns a CUDA error code (0: launched).
extern "C" int launch_cluster_attention(const void* qkv, const void* q_norm, const void* k_norm, const void* cos_t,
                                        const void* sin_t, void* k_cache, void* v_cache, const int64_t* pos,
                                        void* out, float eps, float scale, int heads, int kv_heads, int slots,
                                        int block_s, int pdl, cudaStream_t stream) {
  const int stretches = (slots + block_s - 1) / block_s;
  if (stretches > MAX_CLUSTER) return static_cast<int>(cudaErrorInvalidValue);
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(stretches, heads, 1);
  cfg.blockDim = dim3(block_s / ROWS_PER_WARP * 32, 1, 1);
  cfg.stream = stream;
  cudaLaunchAttribute attrs[2];
  attrs[0].id = cudaLaunchAttributeClusterDimension;
  attrs[0].val.clusterDim.x = stretches;
  attrs[0].val.clusterDim.y = 1;
  attrs[0].val.clusterDim.z = 1;
  attrs[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attrs[1].val.programmaticStreamSerializationAllowed = pdl ? 1 : 0;
  cfg.attrs = attrs;
  cfg.numAttrs = 2;
  auto q = static_cast<const __nv_bfloat16*>(qkv);
  auto qn = static_cast<const __nv_bfloat16*>(q_norm);
  auto kn = static_cast<const __nv_bfloat16*>(k_norm);
  auto c = static_cast<const __nv_bfloat16*>(cos_t);
  auto s = static_cast<const __nv_bfloat16*>(sin_t);
  auto kc = static_cast<__nv_bfloat16*>(k_cache);
  auto vc = static_cast<__nv_bfloat16*>(v_cache);
  auto o = static_cast<__nv_bfloat16*>(out);
  cudaError_t err;
  switch (block_s) {
    case 32:
      err = cudaLaunchKernelEx(&cfg, cluster_attention_kernel<2>, q, qn, kn, c, s, kc, vc, pos, o, eps, scale, heads,
                               kv_heads, slots, pdl);
      break;
    case 64:
      err = cudaLaunchKernelEx(&cfg, cluster_attention_kernel<4>, q, qn, kn, c, s, kc, vc, pos, o, eps, scale, heads,
                               kv_heads, slots, pdl);
      break;
    case 128:
      err = cudaLaunchKernelEx(&cfg, cluster_attention_kernel<8>, q, qn, kn, c, s, kc, vc, pos, o, eps, scale, heads,
                               kv_heads, slots, pdl);
      break;
    default:
      return static_cast<int>(cudaErrorInvalidValue);
  }
  return static_cast<int>(err);
}
