# MoeInitRouting: adds its sources to the library (included from the top-level CMakeLists.txt).
# It reads index arrays with the fused op's helpers (moe_grad_routing.h), compiled there.
set(_moe_init_routing_dir ${CMAKE_SOURCE_DIR}/src/ops/moe_init_routing)
target_sources(gradkit PRIVATE
  ${_moe_init_routing_dir}/moe_init_routing_def.cc
  ${_moe_init_routing_dir}/moe_init_routing_table.cc
  ${_moe_init_routing_dir}/moe_init_routing_plan.cc
  ${_moe_init_routing_dir}/moe_init_routing_api.cc
)
# The CLI's commands and benchmark of the MoE layer's routing operators (both of them).
target_sources(gradkit_cli PRIVATE ${CMAKE_SOURCE_DIR}/tools/gradkit/moe_routing_cmd.cc)
target_sources(gradkit_bench PRIVATE ${CMAKE_SOURCE_DIR}/bench/moe_routing_bench.cc)
unset(_moe_init_routing_dir)
