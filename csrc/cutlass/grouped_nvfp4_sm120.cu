// Grouped (ptr-array) NVFP4 x NVFP4 -> bf16 GEMM for sm_120a on CUTLASS C++'s SM120 block-scaled
// collective (CollectiveBuilder, OpClassBlockScaledTensorOp). ABI and operand conventions:
// tsct_cutlass.h. Header source and version: docs/decisions/0007-cutlass-headers.md (CUTLASS
// b46b16d0 "4.5.0", from the flashinfer-python 0.7.2.post1 wheel; never vendored here).
//
// Compile (one TU, sm_120a only): cmake/tsct_cutlass.cmake links it into libtsct_kernels.so
// (TSCT_CUTLASS=AUTO|ON); csrc/cutlass/build_check.sh builds it alone with a host-check library. Needs CUTLASS >= 4.5 for the 128x32
// tile (small-N block-scaled tiles, cutlass#3176); older headers get a clear #error.
#include <cuda_runtime_api.h>
#include <stdint.h>
#include <string.h>

#include "cutlass/cutlass.h"
#include "cutlass/version.h"
#include "cute/tensor.hpp"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/fusion/operations.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/group_array_problem_shape.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/util/packed_stride.hpp"

#include "common/host.h"
#include "cutlass/tsct_cutlass.h"

#if (CUTLASS_MAJOR * 100 + CUTLASS_MINOR) < 405
#error "tsct's CUTLASS sm_120 grouped GEMM needs CUTLASS >= 4.5 headers (128x32 block-scaled tiles); see docs/decisions/0007-cutlass-headers.md"
#endif

#ifndef TSCT_CUTLASS_TILE_N
#define TSCT_CUTLASS_TILE_N 32  // CUTLASS N = rows of one expert (~32 at b1); 64 and 128 also build
#endif

namespace tsct_cutlass_sm120 {
using namespace cute;

using ProblemShape = cutlass::gemm::GroupProblemShape<Shape<int, int, int>>;  // (M', N', K) per group

// CUTLASS A = the factor w_e [N, K] (K-major), CUTLASS B = the activation x_e [M_e, K] (K-major):
// block-scaled fp4 on SM120 is TN only, which is exactly tsct's storage for both.
using ElementA = cutlass::nv_float4_t<cutlass::float_e2m1_t>;  // e2m1 data + ue4m3 scale per 16
using ElementB = cutlass::nv_float4_t<cutlass::float_e2m1_t>;
using LayoutA = cutlass::layout::RowMajor;
using LayoutB = cutlass::layout::ColumnMajor;
constexpr int kAlignA = 32;  // elements: 16 bytes (TMA)
constexpr int kAlignB = 32;

// D = out_e^T, column-major [N, M_e] == row-major out_e [M_e, N]. No C operand (beta = 0).
using ElementC = void;
using ElementD = cutlass::bfloat16_t;
using LayoutC = cutlass::layout::ColumnMajor;
using LayoutD = cutlass::layout::ColumnMajor;
constexpr int kAlignD = 128 / cutlass::sizeof_bits<ElementD>::value;  // 8
constexpr int kAlignC = kAlignD;

using ElementAccumulator = float;
using ElementCompute = float;
using ArchTag = cutlass::arch::Sm120;
using OpClass = cutlass::arch::OpClassBlockScaledTensorOp;

using TileShape = Shape<_128, Int<TSCT_CUTLASS_TILE_N>, _128>;
using ClusterShape = Shape<_1, _1, _1>;  // SM120: no multicast

// D = alpha[group] * acc (LinearCombination; per-group alpha through alpha_ptr + dAlpha = {0, 0, 1}).
using FusionOp = cutlass::epilogue::fusion::LinearCombination<ElementD, ElementCompute, ElementC, ElementCompute>;

using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
    ArchTag, OpClass, TileShape, ClusterShape, cutlass::epilogue::collective::EpilogueTileAuto,
    ElementAccumulator, ElementCompute, ElementC, LayoutC*, kAlignC, ElementD, LayoutD*, kAlignD,
    cutlass::epilogue::collective::EpilogueScheduleAuto, FusionOp>::CollectiveOp;

// Ping-pong: each consumer warpgroup owns a whole 128x32 tile (the configuration CUTLASS's own
// SM120 grouped small-N test uses). Stages: carve-out of the epilogue's shared storage; the
// static_assert below guards the SM120 budget (cutlass#3096: the 4.2 builder over-counted stages).
using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
    ArchTag, OpClass, ElementA, LayoutA*, kAlignA, ElementB, LayoutB*, kAlignB, ElementAccumulator, TileShape,
    ClusterShape,
    cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
        sizeof(typename CollectiveEpilogue::SharedStorage))>,
    cutlass::gemm::KernelPtrArrayTmaWarpSpecializedPingpong>::CollectiveOp;

using GemmKernel = cutlass::gemm::kernel::GemmUniversal<ProblemShape, CollectiveMainloop, CollectiveEpilogue>;
using Gemm = cutlass::gemm::device::GemmUniversalAdapter<GemmKernel>;

using StrideA = typename GemmKernel::InternalStrideA;
using StrideB = typename GemmKernel::InternalStrideB;
using StrideC = typename GemmKernel::InternalStrideC;
using StrideD = typename GemmKernel::InternalStrideD;
using LayoutSFA = typename CollectiveMainloop::InternalLayoutSFA;
using LayoutSFB = typename CollectiveMainloop::InternalLayoutSFB;
using SfConfig = typename CollectiveMainloop::Sm1xxBlkScaledConfig;
using ElementSF = typename CollectiveMainloop::ElementSF;
using Shape3 = typename ProblemShape::UnderlyingProblemShape;

// SM120 (and SM121) opt-in shared memory per block is 99 KiB.
constexpr int kSmemLimit = 101376;
static_assert(GemmKernel::SharedStorageSize <= kSmemLimit, "CTA shared storage exceeds the SM120 99 KiB budget");
static_assert(sizeof(Shape3) == 3 * sizeof(int32_t), "problem shape is not three int32");
static_assert(cute::is_same_v<ElementSF, cutlass::float_ue4m3_t>, "NVFP4 scales must be UE4M3");
static_assert(CollectiveMainloop::SFVecSize == 16, "NVFP4 block is 16 elements");

constexpr uint64_t kAlign = 256;
constexpr uint64_t align_up(uint64_t x) { return (x + kAlign - 1) / kAlign * kAlign; }

// Prep workspace: per-group strides and scale layouts, filled on the device from problem_nmk.
struct PrepLayout {
  uint64_t stride_a, stride_b, stride_d, layout_sfa, layout_sfb, total;
};
inline PrepLayout prep_layout(int64_t groups) {
  PrepLayout p{};
  const uint64_t g = static_cast<uint64_t>(groups);
  p.stride_a = 0;
  p.stride_b = p.stride_a + align_up(g * sizeof(StrideA));
  p.stride_d = p.stride_b + align_up(g * sizeof(StrideB));
  p.layout_sfa = p.stride_d + align_up(g * sizeof(StrideD));
  p.layout_sfb = p.layout_sfa + align_up(g * sizeof(LayoutSFA));
  p.total = p.layout_sfb + align_up(g * sizeof(LayoutSFB));
  return p;
}

__global__ void prep_kernel(const Shape3* problems, int groups, StrideA* stride_a, StrideB* stride_b,
                            StrideD* stride_d, LayoutSFA* layout_sfa, LayoutSFB* layout_sfb) {
  const int g = blockIdx.x * blockDim.x + threadIdx.x;
  if (g >= groups) return;
  const Shape3 p = problems[g];
  const int m = get<0>(p), n = get<1>(p), k = get<2>(p);
  stride_a[g] = cutlass::make_cute_packed_stride(StrideA{}, make_shape(m, k, 1));
  stride_b[g] = cutlass::make_cute_packed_stride(StrideB{}, make_shape(n, k, 1));
  stride_d[g] = cutlass::make_cute_packed_stride(StrideD{}, make_shape(m, n, 1));
  layout_sfa[g] = SfConfig::tile_atom_to_shape_SFA(make_shape(m, n, k, 1));
  layout_sfb[g] = SfConfig::tile_atom_to_shape_SFB(make_shape(m, n, k, 1));
}

inline int resolve_sm_count(int sm_count, int* out) {
  if (sm_count > 0) {
    *out = sm_count;
    return 0;
  }
  int dev = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(out, cudaDevAttrMultiProcessorCount, dev);
  if (e != cudaSuccess) {
    return tsct::fail(static_cast<int>(e), "tsct_cutlass_nvfp4_grouped_sm120: no device to size for: %s",
                      cudaGetErrorName(e));
  }
  return 0;
}

// Arguments for `groups` groups; pointers may be null when only sizing the workspace.
inline typename Gemm::Arguments make_arguments(int groups, const Shape3* problems, const uint64_t* ptr_w,
                                               const uint64_t* ptr_w_sf, const uint64_t* ptr_x,
                                               const uint64_t* ptr_x_sf, const uint64_t* ptr_out,
                                               const float* alpha, char* prep, int sm_count) {
  const PrepLayout pl = prep_layout(groups);
  cutlass::KernelHardwareInfo hw;
  hw.device_id = 0;  // only sm_count is read by the grouped kernel's launch sizing
  hw.sm_count = sm_count;

  typename Gemm::Arguments args;
  decltype(args.epilogue.thread) fusion{};
  fusion.alpha = 1.0f;
  fusion.beta = 0.0f;
  fusion.alpha_ptr = alpha;             // alpha[l], l = group index
  fusion.dAlpha = {_0{}, _0{}, 1};
  fusion.alpha_ptr_array = nullptr;
  fusion.beta_ptr = nullptr;
  fusion.beta_ptr_array = nullptr;

  typename GemmKernel::TileSchedulerArguments scheduler;
  auto* sa = prep ? reinterpret_cast<StrideA*>(prep + pl.stride_a) : nullptr;
  auto* sb = prep ? reinterpret_cast<StrideB*>(prep + pl.stride_b) : nullptr;
  auto* sd = prep ? reinterpret_cast<StrideD*>(prep + pl.stride_d) : nullptr;
  auto* lsa = prep ? reinterpret_cast<LayoutSFA*>(prep + pl.layout_sfa) : nullptr;
  auto* lsb = prep ? reinterpret_cast<LayoutSFB*>(prep + pl.layout_sfb) : nullptr;

  args = typename Gemm::Arguments{
      cutlass::gemm::GemmUniversalMode::kGrouped,
      {groups, const_cast<Shape3*>(problems), nullptr},  // device shapes only: no host read
      {reinterpret_cast<typename Gemm::ElementA const**>(const_cast<uint64_t*>(ptr_w)), sa,
       reinterpret_cast<typename Gemm::ElementB const**>(const_cast<uint64_t*>(ptr_x)), sb,
       reinterpret_cast<ElementSF const**>(const_cast<uint64_t*>(ptr_w_sf)), lsa,
       reinterpret_cast<ElementSF const**>(const_cast<uint64_t*>(ptr_x_sf)), lsb},
      {fusion, nullptr, reinterpret_cast<StrideC*>(sd),
       reinterpret_cast<typename Gemm::EpilogueOutputOp::ElementOutput**>(const_cast<uint64_t*>(ptr_out)), sd},
      hw,
      scheduler};
  return args;
}

// The cubin is sm_120a: it loads on compute capability 12.0 only. Checked before any launch so that a
// wrong device gets a clean error naming it instead of a failed launch (or a crash in CUTLASS's setup).
inline int require_sm120(const char* fn) {
  int dev = 0, major = 0, minor = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
  if (e != cudaSuccess) {
    cudaGetLastError();  // do not leave the query's error for the caller's next launch check
    return tsct::fail(static_cast<int>(e), "%s: querying the current device failed: %s (%s)", fn, cudaGetErrorName(e),
                      cudaGetErrorString(e));
  }
  if (major != 12 || minor != 0) {
    return tsct::fail(static_cast<int>(cudaErrorNoKernelImageForDevice),
                      "%s: device %d is compute capability %d.%d; the CUTLASS NVFP4 kernel is built for sm_120a "
                      "(12.0) only", fn, dev, major, minor);
  }
  return 0;
}

inline int status_to_code(cutlass::Status s, const char* what) {
  if (s == cutlass::Status::kSuccess) return 0;
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) {
    return tsct::fail(static_cast<int>(e), "tsct_cutlass_nvfp4_grouped_sm120: %s: %s (%s)", what,
                      cutlassGetStatusString(s), cudaGetErrorName(e));
  }
  const int code = (s == cutlass::Status::kErrorInternal) ? static_cast<int>(cudaErrorUnknown) : TSCT_ERR_BAD_ARGUMENT;
  return tsct::fail(code, "tsct_cutlass_nvfp4_grouped_sm120: %s: %s", what, cutlassGetStatusString(s));
}

}  // namespace tsct_cutlass_sm120

using namespace tsct_cutlass_sm120;

extern "C" {

int tsct_cutlass_nvfp4_grouped_sm120_workspace(int64_t num_groups, int sm_count, uint64_t* bytes) {
  tsct::clear_error_detail();
  if (!bytes) return tsct::fail(TSCT_ERR_BAD_ARGUMENT, "tsct_cutlass_nvfp4_grouped_sm120_workspace: null bytes");
  if (num_groups < 0 || num_groups > INT32_MAX) {
    return tsct::fail(TSCT_ERR_BAD_ARGUMENT, "tsct_cutlass_nvfp4_grouped_sm120_workspace: num_groups=%lld",
                      static_cast<long long>(num_groups));
  }
  *bytes = 0;
  if (num_groups == 0) return 0;
  int sms = 0;
  if (int rc = resolve_sm_count(sm_count, &sms)) return rc;
  auto args = make_arguments(static_cast<int>(num_groups), nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
                             nullptr, nullptr, sms);
  *bytes = prep_layout(num_groups).total + align_up(Gemm::get_workspace_size(args));
  return 0;
}

int tsct_cutlass_nvfp4_grouped_sm120_bf16(int64_t num_groups, const int32_t* problem_nmk, const uint64_t* ptr_w,
                                          const uint64_t* ptr_w_sf, const uint64_t* ptr_x,
                                          const uint64_t* ptr_x_sf, const uint64_t* ptr_out, const float* alpha,
                                          void* workspace, uint64_t workspace_bytes, int sm_count, void* stream) {
  static const char* fn = "tsct_cutlass_nvfp4_grouped_sm120_bf16";
  tsct::clear_error_detail();
  if (num_groups < 0 || num_groups > INT32_MAX) {
    return tsct::fail(TSCT_ERR_BAD_ARGUMENT, "%s: num_groups=%lld", fn, static_cast<long long>(num_groups));
  }
  if (int rc = require_sm120(fn)) return rc;
  if (num_groups == 0) return 0;
  if (!problem_nmk || !ptr_w || !ptr_w_sf || !ptr_x || !ptr_x_sf || !ptr_out || !alpha || !workspace) {
    return tsct::fail(TSCT_ERR_BAD_ARGUMENT, "%s: null pointer argument", fn);
  }
  if (reinterpret_cast<uintptr_t>(workspace) % kAlign) {
    return tsct::fail(TSCT_ERR_BAD_ARGUMENT, "%s: workspace is not %llu-byte aligned", fn,
                      static_cast<unsigned long long>(kAlign));
  }
  int sms = 0;
  if (int rc = resolve_sm_count(sm_count, &sms)) return rc;
  const int groups = static_cast<int>(num_groups);
  char* prep = static_cast<char*>(workspace);
  const PrepLayout pl = prep_layout(groups);
  auto args = make_arguments(groups, reinterpret_cast<const Shape3*>(problem_nmk), ptr_w, ptr_w_sf, ptr_x,
                             ptr_x_sf, ptr_out, alpha, prep, sms);
  const uint64_t need = pl.total + align_up(Gemm::get_workspace_size(args));
  if (workspace_bytes < need) {
    return tsct::fail(TSCT_ERR_BAD_ARGUMENT, "%s: workspace_bytes=%llu < %llu", fn,
                      static_cast<unsigned long long>(workspace_bytes), static_cast<unsigned long long>(need));
  }
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  const int threads = 128;
  prep_kernel<<<(groups + threads - 1) / threads, threads, 0, s>>>(
      reinterpret_cast<const Shape3*>(problem_nmk), groups, reinterpret_cast<StrideA*>(prep + pl.stride_a),
      reinterpret_cast<StrideB*>(prep + pl.stride_b), reinterpret_cast<StrideD*>(prep + pl.stride_d),
      reinterpret_cast<LayoutSFA*>(prep + pl.layout_sfa), reinterpret_cast<LayoutSFB*>(prep + pl.layout_sfb));
  if (int rc = tsct::check_launch(fn)) return rc;

  Gemm gemm;
  if (int rc = status_to_code(gemm.can_implement(args), "can_implement")) return rc;
  if (int rc = status_to_code(gemm.initialize(args, prep + pl.total, s), "initialize")) return rc;
  if (int rc = status_to_code(gemm.run(s), "run")) return rc;
  return tsct::check_launch(fn);
}

int tsct_cutlass_nvfp4_grouped_sm120_config(int64_t* out, int n) {
  tsct::clear_error_detail();
  if (!out || n < 0) return tsct::fail(TSCT_ERR_BAD_ARGUMENT, "tsct_cutlass_nvfp4_grouped_sm120_config: out=%p n=%d", static_cast<void*>(out), n);
  const Shape3 probe = make_shape(11, 22, 33);
  int32_t raw[3];
  memcpy(raw, &probe, sizeof(raw));
  const int64_t vals[] = {
      size<0>(TileShape{}),
      size<1>(TileShape{}),
      size<2>(TileShape{}),
      CollectiveMainloop::DispatchPolicy::Stages,
      GemmKernel::SharedStorageSize,
      static_cast<int64_t>(sizeof(Shape3)),
      (raw[0] == 11 && raw[1] == 22 && raw[2] == 33) ? 1 : 0,
      CUTLASS_MAJOR * 100 + CUTLASS_MINOR,
      static_cast<int64_t>(GemmKernel::MaxThreadsPerBlock),
      static_cast<int64_t>(prep_layout(1).total),
  };
  const int count = static_cast<int>(sizeof(vals) / sizeof(vals[0]));
  for (int i = 0; i < n && i < count; ++i) out[i] = vals[i];
  return 0;
}

int tsct_cutlass_nvfp4_sf_offsets_sm120(int which, int m, int n, int k, int64_t* out) {
  tsct::clear_error_detail();
  if (!out || (which != 0 && which != 1) || m < 0 || n < 0 || k < 0 || k % 16) {
    return tsct::fail(TSCT_ERR_BAD_ARGUMENT,
                      "tsct_cutlass_nvfp4_sf_offsets_sm120: need out != NULL, which in {0, 1}, m, n, k >= 0 and "
                      "k %% 16 == 0; got which=%d m=%d n=%d k=%d", which, m, n, k);
  }
  const int rows = which == 0 ? m : n;
  const int kb = k / 16;
  if (which == 0) {
    auto layout = SfConfig::tile_atom_to_shape_SFA(make_shape(m, n, k, 1));
    for (int r = 0; r < rows; ++r)
      for (int b = 0; b < kb; ++b) out[int64_t(r) * kb + b] = layout(r, b * 16, 0);
  } else {
    auto layout = SfConfig::tile_atom_to_shape_SFB(make_shape(m, n, k, 1));
    for (int r = 0; r < rows; ++r)
      for (int b = 0; b < kb; ++b) out[int64_t(r) * kb + b] = layout(r, b * 16, 0);
  }
  return 0;
}

}  // extern "C"
