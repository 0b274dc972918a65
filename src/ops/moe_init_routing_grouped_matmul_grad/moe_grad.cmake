# MoeInitRoutingGroupedMatmulGrad: adds its sources to the library, the benchmarks, the torch peer
# and the CLI (included from the top-level CMakeLists.txt).
set(_moe_dir ${CMAKE_SOURCE_DIR}/src/ops/moe_init_routing_grouped_matmul_grad)

target_sources(gradkit PRIVATE
  ${_moe_dir}/moe_grad_def.cc
  ${_moe_dir}/moe_grad_routing.cc
  ${_moe_dir}/moe_grad_plan.cc
  ${_moe_dir}/moe_grad_api.cc
  ${_moe_dir}/cpu/moe_grad_kernels.cc
  ${_moe_dir}/cpu/moe_grad_gemm.cc
)

# oneDNN does the matrix work when installed (Debian libdnnl-dev); without it the operator runs
# on gradkit's own Highway tile kernel (correct and deterministic, several times slower).
set(GRADKIT_HAVE_DNNL OFF)
if(GRADKIT_WITH_DNNL)
  find_package(dnnl CONFIG QUIET)
  if(dnnl_FOUND)
    set(GRADKIT_HAVE_DNNL ON)
  endif()
endif()
message(STATUS "gradkit: oneDNN for MoE GEMMs: ${GRADKIT_HAVE_DNNL}")
if(GRADKIT_HAVE_DNNL)
  # Only moe_grad_gemm.cc sees oneDNN (and, for its OpenMP runtime, omp.h).
  set_source_files_properties(${_moe_dir}/cpu/moe_grad_gemm.cc PROPERTIES
    COMPILE_DEFINITIONS GRADKIT_HAVE_DNNL=1)
  target_link_libraries(gradkit PRIVATE DNNL::dnnl)
  if(DNNL_CPU_THREADING_RUNTIME STREQUAL "OMP")
    find_package(OpenMP REQUIRED COMPONENTS CXX)
    target_link_libraries(gradkit PRIVATE OpenMP::OpenMP_CXX)
  endif()
endif()

target_sources(gradkit_bench PRIVATE ${CMAKE_SOURCE_DIR}/bench/moe_grad_bench.cc)
if(GRADKIT_HAVE_TORCH)
  target_sources(gradkit_torch_peer PRIVATE ${CMAKE_SOURCE_DIR}/bench/torch_peer_moe.cc)
else()
  target_sources(gradkit_bench PRIVATE ${CMAKE_SOURCE_DIR}/bench/torch_peer_moe_absent.cc)
endif()

target_sources(gradkit_cli PRIVATE ${CMAKE_SOURCE_DIR}/tools/gradkit/moe_grad_cmd.cc)
unset(_moe_dir)
