# GroupedMatmul and GroupedMatmulWeightGrad: adds their sources to the library, the benchmarks and
# the CLI (included from the top-level CMakeLists.txt, after the fused op's moe_grad.cmake, whose
# tile GEMM, kernels and routing checks they use).
set(_gmm_dir ${CMAKE_SOURCE_DIR}/src/ops/grouped_matmul)

target_sources(gradkit PRIVATE
  ${_gmm_dir}/grouped_matmul_def.cc
  ${_gmm_dir}/grouped_matmul_plan.cc
  ${_gmm_dir}/grouped_matmul_api.cc
  ${_gmm_dir}/cpu/grouped_matmul_kernels.cc
)

if(EXISTS ${CMAKE_SOURCE_DIR}/bench/grouped_matmul_bench.cc)
  target_sources(gradkit_bench PRIVATE ${CMAKE_SOURCE_DIR}/bench/grouped_matmul_bench.cc)
endif()
target_sources(gradkit_cli PRIVATE ${CMAKE_SOURCE_DIR}/tools/gradkit/grouped_matmul_cmd.cc)
unset(_gmm_dir)
