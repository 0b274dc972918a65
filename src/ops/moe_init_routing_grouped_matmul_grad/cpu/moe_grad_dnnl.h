// The one place where gradkit's use of oneDNN differs between its major versions (Debian 12
// ships 2.x, Debian 13 ships 3.x). Included by moe_grad_gemm.cc only.
//
// oneDNN 3 removed the operation descriptors (dnnl::matmul::desc): a primitive descriptor is
// made from the memory descriptors directly. Everything else gradkit calls (memory, stream,
// primitive_attr, post_ops::append_sum, scratchpad_desc, impl_info_str) is the same in both.
#pragma once

#include <oneapi/dnnl/dnnl.hpp>
#include <oneapi/dnnl/dnnl_version.h>

#if DNNL_VERSION_MAJOR != 2 && DNNL_VERSION_MAJOR != 3
#error "gradkit's MoE GEMM supports oneDNN 2.x and 3.x"
#endif

namespace gk::dnnl_compat {

// A matmul primitive descriptor for dst = src * weights (no bias), with attributes.
inline dnnl::matmul::primitive_desc MakeMatmulPd(const dnnl::memory::desc& src,
                                                 const dnnl::memory::desc& weights,
                                                 const dnnl::memory::desc& dst,
                                                 const dnnl::primitive_attr& attr,
                                                 const dnnl::engine& engine) {
#if DNNL_VERSION_MAJOR >= 3
  return dnnl::matmul::primitive_desc(engine, src, weights, dst, attr);
#else
  return dnnl::matmul::primitive_desc(dnnl::matmul::desc(src, weights, dst), attr, engine);
#endif
}

}  // namespace gk::dnnl_compat
