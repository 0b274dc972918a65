#include "ops/moe_init_routing_grouped_matmul_grad/cpu/moe_grad_gemm.h"

#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>

#include "core/thread_pool.h"
#include "ops/moe_init_routing_grouped_matmul_grad/cpu/moe_grad_kernels.h"

#if defined(GRADKIT_HAVE_DNNL)
#include <oneapi/dnnl/dnnl.hpp>
#if DNNL_CPU_THREADING_RUNTIME == DNNL_RUNTIME_OMP
#include <omp.h>
#define GK_DNNL_OMP 1
#endif
#endif

namespace gk {
namespace {

// ---- gradkit's own kernel ----------------------------------------------------------------------
class OwnTileGemm final : public MoeTileGemm {
 public:
  explicit OwnTileGemm(const MoeTileGemmShape& shape) : shape_(shape) {}
  std::string name() const override { return "gradkit highway"; }
  uint64_t scratchpad_bytes() const override { return 0; }
  void Run(int64_t rows, int64_t width, const void* a, const void* b, float* c,
           void*) const override {
    MoeGemmTileOwn(shape_.gemm_dtype, rows, width, shape_.reduce, a, b, c, shape_.ldc);
  }

 private:
  MoeTileGemmShape shape_;
};

class OwnDenseGemm final : public MoeDenseGemm {
 public:
  OwnDenseGemm(DType dtype, int64_t m, int64_t reduce, int64_t width, int32_t threads)
      : dtype_(dtype), m_(m), reduce_(reduce), width_(width), threads_(threads) {}
  std::string name() const override { return "gradkit highway"; }
  void Run(const void* a, const void* b, float* c, int64_t ldc) const override {
    constexpr int64_t kRows = 64;
    const int64_t elem = ElementBytes(dtype_);
    ParallelFor(threads_, (m_ + kRows - 1) / kRows, [&](int64_t block) {
      const int64_t r0 = block * kRows, rows = std::min(kRows, m_ - r0);
      MoeGemmTileOwn(dtype_, rows, width_, reduce_, static_cast<const char*>(a) + r0 * reduce_ * elem,
                     b, c + r0 * ldc, ldc);
    });
  }

 private:
  DType dtype_;
  int64_t m_, reduce_, width_;
  int32_t threads_;
};

#if defined(GRADKIT_HAVE_DNNL)
// ---- oneDNN --------------------------------------------------------------------------------------
dnnl::engine& Engine() {
  static dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}
dnnl::stream& ThreadStream() {
  thread_local dnnl::stream stream(Engine());
  return stream;
}
dnnl::memory::data_type DnnlType(DType dtype) {
  return dtype == DType::kBF16 ? dnnl::memory::data_type::bf16 : dnnl::memory::data_type::f32;
}

// C[rows, width] = A[rows, reduce] * B[width, reduce]^T: B is the matmul's [reduce, width] weights
// with strides {1, reduce}, read in place (oneDNN copies it into its scratchpad per call).
dnnl::matmul::primitive_desc MatmulDesc(DType dtype, int64_t rows, int64_t reduce, int64_t width,
                                        int64_t ldc, bool user_scratchpad) {
  using dnnl::memory;
  const memory::desc a({rows, reduce}, DnnlType(dtype), memory::dims{reduce, 1});
  const memory::desc b({reduce, width}, DnnlType(dtype), memory::dims{1, reduce});
  const memory::desc c({rows, width}, memory::data_type::f32, memory::dims{ldc, 1});
  dnnl::primitive_attr attr;
  if (user_scratchpad) attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  return dnnl::matmul::primitive_desc(dnnl::matmul::desc(a, b, c), attr, Engine());
}

class OneDnnTileGemm final : public MoeTileGemm {
 public:
  explicit OneDnnTileGemm(const MoeTileGemmShape& shape) : shape_(shape) {
    const int64_t steps = shape.max_rows / shape.row_granule;
    for (int64_t width : shape.widths) {
      for (int64_t s = 1; s <= steps; ++s) {
        auto pd = MatmulDesc(shape.gemm_dtype, s * shape.row_granule, shape.reduce, width,
                             shape.ldc, /*user_scratchpad=*/true);
        scratchpad_bytes_ = std::max<uint64_t>(scratchpad_bytes_, pd.scratchpad_desc().get_size());
        impl_ = pd.impl_info_str();
        primitives_.emplace_back(pd);
        descs_.push_back(pd);
      }
    }
  }
  std::string name() const override { return fmt::format("onednn {}", impl_); }
  uint64_t scratchpad_bytes() const override { return scratchpad_bytes_; }
  void Run(int64_t rows, int64_t width, const void* a, const void* b, float* c,
           void* scratchpad) const override {
    const int64_t steps = shape_.max_rows / shape_.row_granule;
    const size_t w = width == shape_.widths[0] ? 0 : 1;
    const size_t index = w * steps + static_cast<size_t>(rows / shape_.row_granule - 1);
    const auto& pd = descs_[index];
    dnnl::engine& engine = Engine();
    dnnl::memory a_mem(pd.src_desc(), engine, const_cast<void*>(a));
    dnnl::memory b_mem(pd.weights_desc(), engine, const_cast<void*>(b));
    dnnl::memory c_mem(pd.dst_desc(), engine, c);
    dnnl::memory s_mem(pd.scratchpad_desc(), engine, scratchpad);
    primitives_[index].execute(ThreadStream(), {{DNNL_ARG_SRC, a_mem},
                                                {DNNL_ARG_WEIGHTS, b_mem},
                                                {DNNL_ARG_DST, c_mem},
                                                {DNNL_ARG_SCRATCHPAD, s_mem}});
  }

 private:
  MoeTileGemmShape shape_;
  std::vector<dnnl::matmul> primitives_;
  std::vector<dnnl::matmul::primitive_desc> descs_;
  uint64_t scratchpad_bytes_ = 0;
  std::string impl_;
};

class OneDnnDenseGemm final : public MoeDenseGemm {
 public:
  OneDnnDenseGemm(DType dtype, int64_t m, int64_t reduce, int64_t width, int32_t threads)
      : threads_(threads),
        m_(m),
        reduce_(reduce),
        width_(width),
        dtype_(dtype),
        pd_(MatmulDesc(dtype, m, reduce, width, width, false)),
        primitive_(pd_) {}
  std::string name() const override { return fmt::format("onednn {}", pd_.impl_info_str()); }
  void Run(const void* a, const void* b, float* c, int64_t ldc) const override {
    using dnnl::memory;
    const memory::desc c_desc({m_, width_}, memory::data_type::f32, memory::dims{ldc, 1});
    dnnl::matmul::primitive_desc pd = pd_;
    dnnl::matmul primitive = primitive_;
    if (ldc != width_) {
      pd = dnnl::matmul::primitive_desc(
          dnnl::matmul::desc(pd_.src_desc(), pd_.weights_desc(), c_desc), Engine());
      primitive = dnnl::matmul(pd);
    }
#if defined(GK_DNNL_OMP)
    const int saved = omp_get_max_threads();
    omp_set_num_threads(threads_);
#endif
    dnnl::memory a_mem(pd.src_desc(), Engine(), const_cast<void*>(a));
    dnnl::memory b_mem(pd.weights_desc(), Engine(), const_cast<void*>(b));
    dnnl::memory c_mem(pd.dst_desc(), Engine(), c);
    primitive.execute(ThreadStream(),
                      {{DNNL_ARG_SRC, a_mem}, {DNNL_ARG_WEIGHTS, b_mem}, {DNNL_ARG_DST, c_mem}});
    ThreadStream().wait();
#if defined(GK_DNNL_OMP)
    omp_set_num_threads(saved);
#endif
  }

 private:
  int32_t threads_;
  int64_t m_, reduce_, width_;
  DType dtype_;
  dnnl::matmul::primitive_desc pd_;
  dnnl::matmul primitive_;
};
#endif  // GRADKIT_HAVE_DNNL

}  // namespace

std::unique_ptr<MoeTileGemm> MoeTileGemm::Create(const MoeTileGemmShape& shape) {
#if defined(GRADKIT_HAVE_DNNL)
  try {
    return std::make_unique<OneDnnTileGemm>(shape);
  } catch (const dnnl::error&) {
    // The library does not take this shape or dtype on this CPU: the own kernel does.
  }
#endif
  return std::make_unique<OwnTileGemm>(shape);
}

std::unique_ptr<MoeDenseGemm> MoeDenseGemm::Create(DType gemm_dtype, int64_t m, int64_t reduce,
                                                   int64_t width, int32_t threads) {
#if defined(GRADKIT_HAVE_DNNL)
  try {
    return std::make_unique<OneDnnDenseGemm>(gemm_dtype, m, reduce, width, threads);
  } catch (const dnnl::error&) {
  }
#endif
  return std::make_unique<OwnDenseGemm>(gemm_dtype, m, reduce, width, threads);
}

GemmSequentialScope::GemmSequentialScope() : saved_threads_(0) {
#if defined(GK_DNNL_OMP)
  saved_threads_ = omp_get_max_threads();
  if (saved_threads_ != 1) omp_set_num_threads(1);
#endif
}

GemmSequentialScope::~GemmSequentialScope() {
#if defined(GK_DNNL_OMP)
  if (saved_threads_ != 1) omp_set_num_threads(saved_threads_);
#endif
}

bool MoeGemmHasOneDnn() {
#if defined(GRADKIT_HAVE_DNNL)
  return true;
#else
  return false;
#endif
}

std::string MoeGemmLibraryName() {
#if defined(GRADKIT_HAVE_DNNL)
  const dnnl_version_t* v = dnnl_version();
  return fmt::format("oneDNN {}.{}.{}", v->major, v->minor, v->patch);
#else
  return "gradkit highway kernel";
#endif
}

}  // namespace gk
