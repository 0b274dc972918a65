# MoeFinalizeRouting and MoeFinalizeRoutingGrad: add their sources to the library (included from
# the top-level CMakeLists.txt). Index checks come from the fused op's moe_grad_routing.cc.
set(_moe_finalize_dir ${CMAKE_SOURCE_DIR}/src/ops/moe_finalize_routing)
target_sources(gradkit PRIVATE
  ${_moe_finalize_dir}/moe_finalize_routing_def.cc
  ${_moe_finalize_dir}/moe_finalize_routing_plan.cc
  ${_moe_finalize_dir}/moe_finalize_routing_api.cc
  ${_moe_finalize_dir}/cpu/moe_finalize_routing_kernels.cc
)
unset(_moe_finalize_dir)
# The kernels' arithmetic is documented as a product rounded to float32, then the sum: GCC's
# default for C++ (-ffp-contract=fast) would fuse them into FMAs where it sees fit, differently
# in a vector body, a scalar tail or one inlining, so that the bits would depend on the compiler.
if(CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
  set_source_files_properties(${CMAKE_SOURCE_DIR}/src/ops/moe_finalize_routing/cpu/moe_finalize_routing_kernels.cc
                              PROPERTIES COMPILE_OPTIONS "-ffp-contract=off")
endif()
