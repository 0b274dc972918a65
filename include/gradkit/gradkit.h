/* gradkit: the whole public C API. */
#ifndef GRADKIT_GRADKIT_H_
#define GRADKIT_GRADKIT_H_

#include "gradkit/base.h"
#include "gradkit/elu_grad_v2.h"
#include "gradkit/moe_finalize_routing.h"
#include "gradkit/moe_init_routing.h"
#include "gradkit/moe_init_routing_grouped_matmul_grad.h"
#include "gradkit/grouped_matmul.h"

#endif /* GRADKIT_GRADKIT_H_ */
