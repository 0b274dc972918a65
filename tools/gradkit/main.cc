// gradkit: run, plan and benchmark the operators from the command line (in the spirit of
// oneDNN's benchdnn). User errors exit with status 2 and one line on stderr.
#include <fmt/format.h>

#include <cstdio>
#include <cstdlib>
#include <string_view>

#include <unistd.h>
#include <exception>

#include "core/cpu_info.h"
#include "tools/gradkit/cli_util.h"
#include "tools/gradkit/commands.h"

int main(int argc, char** argv) {
  // OpenMP runtimes (libtorch's, oneDNN's) otherwise keep their threads spinning after each
  // parallel region, stealing the cores from whatever is measured next in the same rounds. The
  // runtime reads the policy when it is loaded, before main(): the timing commands restart
  // themselves once with it set (a caller's own setting is kept).
  bool timing = false;
  for (int i = 1; i < argc; ++i) {
    timing |= std::string_view(argv[i]) == "bench" || std::string_view(argv[i]) == "demo";
  }
  if (timing && std::getenv("OMP_WAIT_POLICY") == nullptr) {
    setenv("OMP_WAIT_POLICY", "PASSIVE", 1);
    execv("/proc/self/exe", argv);  // returns only on failure: then run as we are
  }
  CLI::App app{"gradkit: native backward operators for training (CPU backend)", "gradkit"};
  app.require_subcommand(1);
  std::string isa;
  app.add_option("--isa", isa, "Restrict SIMD dispatch to one target (see `gradkit info`)");
  auto* plan = app.add_subcommand("plan", "Print an operator's plan (tiling) as JSON");
  auto* bench = app.add_subcommand("bench", "Measure an operator beside its ceiling and peers");
  plan->require_subcommand(1);
  bench->require_subcommand(1);
  gk::cli::CommandSet commands{app, *plan, *bench};
  gk::cli::RegisterEluGradV2Commands(commands);
  gk::cli::RegisterMoeGradCommands(commands);
  gk::cli::RegisterDemoAndInfoCommands(commands);
  app.parse_complete_callback([&] {
    if (!isa.empty() && !gk::SelectIsa(isa)) {
      throw gk::cli::CliError(fmt::format("--isa is '{}', available here: {}", isa,
                                          fmt::join(gk::AvailableIsas(), ", ")));
    }
  });

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "gradkit: error: %s\n", e.what());
    return 2;
  } catch (const gk::cli::CliError& e) {
    std::fprintf(stderr, "gradkit: error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gradkit: internal error: %s\n", e.what());
    return 3;
  }
  return 0;
}
