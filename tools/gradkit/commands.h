// How each operator plugs into the CLI: a Register function adds its command to the app and its
// entries under `gradkit plan` and `gradkit bench`.
#pragma once

#include <CLI/CLI.hpp>

namespace gk::cli {

struct CommandSet {
  CLI::App& app;    // gradkit <op-command>
  CLI::App& plan;   // gradkit plan <op>
  CLI::App& bench;  // gradkit bench <op>
};

void RegisterEluGradV2Commands(CommandSet& commands);
void RegisterMoeGradCommands(CommandSet& commands);
void RegisterMoeRoutingCommands(CommandSet& commands);
void RegisterGroupedMatmulCommands(CommandSet& commands);
void RegisterDemoAndInfoCommands(CommandSet& commands);

}  // namespace gk::cli
