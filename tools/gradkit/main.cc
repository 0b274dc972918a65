// gradkit: run, plan and benchmark the operators from the command line (in the spirit of
// oneDNN's benchdnn). User errors exit with status 2 and one line on stderr.
#include <fmt/format.h>

#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include <unistd.h>
#include <exception>

#include "core/cpu_info.h"
#include "core/error.h"
#include "tools/gradkit/cli_util.h"
#include "tools/gradkit/commands.h"

namespace {

std::string Lower(std::string text) {
  for (char& c : text) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return text;
}

// --isa in any case ("avx2", "AVX2"): the dispatch names it by Highway's spelling.
void SelectIsaOption(const std::string& isa) {
  for (const std::string& name : gk::AvailableIsas()) {
    if (Lower(name) == Lower(isa) && gk::SelectIsa(name)) return;
  }
  throw gk::cli::CliError(fmt::format("--isa is '{}', available here: {}", isa,
                                      fmt::join(gk::AvailableIsas(), ", ")));
}

// The library ignores a GRADKIT_NUM_THREADS it cannot read; a user should hear about it.
void WarnAboutThreadsVariable() {
  const char* env = std::getenv("GRADKIT_NUM_THREADS");
  if (env == nullptr) return;
  char* end = nullptr;
  const long value = std::strtol(env, &end, 10);
  if (end != env && *end == '\0' && value >= 1 && value <= gk::cli::kMaxThreads) return;
  std::fprintf(stderr,
               "gradkit: warning: GRADKIT_NUM_THREADS is '%s', not a thread count in [1, %d]; "
               "ignored, using the default, %d\n",
               env, gk::cli::kMaxThreads, gkGetNumThreads());
}

// The usage of a command by its full name ("gradkit plan moe-grad").
std::string Usage(const CLI::App& command, const std::string& path) {
  return command.get_formatter()->make_help(&command, path, CLI::AppFormatMode::Normal);
}

// `gradkit help [command...]`: the usage of the app or of the named (sub)command.
int PrintHelp(CLI::App& app, const std::vector<std::string>& topic) {
  CLI::App* at = &app;
  std::string path = "gradkit";
  for (const std::string& word : topic) {
    path += " " + word;
    CLI::App* next = nullptr;
    for (CLI::App* sub : at->get_subcommands({})) {
      if (sub->get_name() == word) next = sub;
    }
    if (next == nullptr) {
      std::fprintf(stderr, "gradkit: error: no command '%s'; `gradkit help` lists them\n",
                   fmt::format("{}", fmt::join(topic, " ")).c_str());
      return 2;
    }
    at = next;
  }
  std::printf("%s", Usage(*at, path).c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // OpenMP runtimes (libtorch's, oneDNN's) otherwise keep their threads spinning after each
  // parallel region, stealing the cores from whatever is measured next in the same rounds. The
  // runtime reads the policy when it is loaded, before main(): the timing commands restart
  // themselves once with it set (a caller's own setting is kept). The OpenBLAS behind the libtorch
  // peer is told the same where the peer is loaded (bench/torch_peer_loader.cc).
  bool timing = false;
  for (int i = 1; i < argc; ++i) {
    timing |= std::string_view(argv[i]) == "bench" || std::string_view(argv[i]) == "demo";
  }
  if (timing && std::getenv("OMP_WAIT_POLICY") == nullptr) {
    setenv("OMP_WAIT_POLICY", "PASSIVE", 1);
    execv("/proc/self/exe", argv);  // returns only on failure: then run as we are
  }
  CLI::App app{"gradkit: native backward operators for training (CPU backend). Run an operator on "
               ".npy files, print its plan, or benchmark it.",
               "gradkit"};
  // Options of the app (--isa) are accepted after the subcommand too.
  app.fallthrough();
  app.set_version_flag("--version", fmt::format("gradkit {}", gkGetVersion()));
  std::string isa;
  app.add_option("--isa", isa,
                 "Restrict SIMD dispatch to one target, any case (`gradkit info` lists them)");
  // Listed here, handled before parsing: the words after `help` name a command, not run it.
  app.add_subcommand("help", "This usage, or a command's: gradkit help plan moe-grad");
  auto* plan = app.add_subcommand("plan", "Print an operator's plan (tiling) as JSON");
  auto* bench = app.add_subcommand("bench", "Measure an operator beside its ceiling and peers");
  gk::cli::CommandSet commands{app, *plan, *bench};
  gk::cli::RegisterEluGradV2Commands(commands);
  gk::cli::RegisterMoeGradCommands(commands);
  gk::cli::RegisterMoeRoutingCommands(commands);
  gk::cli::RegisterGroupedMatmulCommands(commands);
  gk::cli::RegisterDemoAndInfoCommands(commands);
  app.parse_complete_callback([&] {
    if (!isa.empty()) SelectIsaOption(isa);
    WarnAboutThreadsVariable();
  });

  if (argc >= 2 && std::string_view(argv[1]) == "help") {
    return PrintHelp(app, std::vector<std::string>(argv + 2, argv + argc));
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "gradkit: error: %s\n", e.what());
    return 2;
  } catch (const gk::cli::CliError& e) {
    std::fprintf(stderr, "gradkit: error: %s\n", e.what());
    return 2;
  } catch (const gk::ConfigError& e) {
    std::fprintf(stderr, "gradkit: error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gradkit: internal error: %s\n", e.what());
    return 3;
  }
  // Nothing to run: the usage of what was named (gradkit, gradkit plan, gradkit help ...).
  for (CLI::App* group : {plan, bench}) {
    if (group->parsed() && group->get_subcommands().empty()) {
      return PrintHelp(app, {group->get_name()});
    }
  }
  if (app.get_subcommands().empty()) return PrintHelp(app, {});
  return 0;
}
