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
