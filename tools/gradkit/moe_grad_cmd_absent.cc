// Placeholder until the MoE backward lands: registers nothing.
#include "tools/gradkit/commands.h"
#include "tools/gradkit/demo.h"

namespace gk::cli {
void RegisterMoeGradCommands(CommandSet&) {}
void RunMoeGradDemo() {}
void PrintMoeGradInfo() {}
}  // namespace gk::cli
