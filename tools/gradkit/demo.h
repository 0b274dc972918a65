// Each operator's part of `gradkit demo`.
#pragma once

namespace gk::cli {
void RunMoeGradDemo();    // prints nothing until the operator exists
void PrintMoeGradInfo();  // `gradkit info`: the GEMM library and what each dtype runs on
}  // namespace gk::cli
