// gradkit grouped-matmul | grouped-matmul-weight-grad | plan ... | bench ...
#include "tools/gradkit/commands.h"

namespace gk::cli {
void RegisterGroupedMatmulCommands(CommandSet&) {}
}  // namespace gk::cli
