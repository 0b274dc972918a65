# MoeInitRoutingGroupedMatmulGrad: adds its sources to the library, the benchmarks, the torch peer
# and the CLI (included from the top-level CMakeLists.txt).
set(_moe_dir ${CMAKE_SOURCE_DIR}/src/ops/moe_init_routing_grouped_matmul_grad)

target_sources(gradkit PRIVATE
  ${_moe_dir}/moe_grad_def.cc
  ${_moe_dir}/moe_grad_routing.cc
  ${_moe_dir}/moe_grad_plan.cc
  ${_moe_dir}/moe_grad_api.cc
  ${_moe_dir}/cpu/moe_grad_kernels.cc
  ${_moe_dir}/cpu/moe_grad_microkernel.cc
  ${_moe_dir}/cpu/moe_grad_bf16dot.cc
  ${_moe_dir}/cpu/moe_grad_bf16amx.cc
  ${_moe_dir}/cpu/moe_grad_f32bcast.cc
  ${_moe_dir}/cpu/moe_grad_gemm.cc
)

# oneDNN does the matrix work when installed (Debian libdnnl-dev); without it the operator runs
# on gradkit's own micro-kernel (correct and deterministic; below oneDNN's brgemm on AVX-512).
set(GRADKIT_HAVE_DNNL OFF)
if(GRADKIT_WITH_DNNL)
  include(${CMAKE_SOURCE_DIR}/cmake/gradkit_find_dnnl.cmake)
  set(GRADKIT_HAVE_DNNL ${GRADKIT_DNNL_FOUND})
  if(GRADKIT_DNNL_FOUND)
    message(STATUS "gradkit: oneDNN ${GRADKIT_DNNL_VERSION} (${GRADKIT_DNNL_CPU_RUNTIME} runtime) for MoE GEMMs")
  else()
    message(STATUS "gradkit: oneDNN not used (${GRADKIT_DNNL_WHY_NOT}); MoE GEMMs run on gradkit's own kernel")
  endif()
else()
  message(STATUS "gradkit: oneDNN off (GRADKIT_WITH_DNNL=OFF); MoE GEMMs run on gradkit's own kernel")
endif()
if(GRADKIT_HAVE_DNNL)
  # Only moe_grad_gemm.cc sees oneDNN (and, for its OpenMP runtime, omp.h).
  set_source_files_properties(${_moe_dir}/cpu/moe_grad_gemm.cc PROPERTIES
    COMPILE_DEFINITIONS GRADKIT_HAVE_DNNL=1)
  target_link_libraries(gradkit PRIVATE gradkit::dnnl)
endif()

target_sources(gradkit_bench PRIVATE ${CMAKE_SOURCE_DIR}/bench/moe_grad_bench.cc)
if(GRADKIT_HAVE_TORCH)
  target_sources(gradkit_torch_peer PRIVATE ${CMAKE_SOURCE_DIR}/bench/torch_peer_moe.cc)
endif()

target_sources(gradkit_cli PRIVATE ${CMAKE_SOURCE_DIR}/tools/gradkit/moe_grad_cmd.cc)
unset(_moe_dir)
