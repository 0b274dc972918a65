// Each operator's part of `gradkit demo`.
#pragma once

namespace gk::cli {
void RunMoeGradDemo();  // prints nothing until the operator exists
}  // namespace gk::cli
