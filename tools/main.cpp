// kiln: the command-line tool. See ../shared/spec/cli.md for the contract:
// human-readable output on stdout, `kiln: error: <what and where>` on stderr,
// exit codes 0 (ok), 1 (invalid input), 2 (usage), 3 (compile or device
// failure), 4 (check failed).
#include <fmt/format.h>

#include <cstdio>
#include <map>

#include "compiler/error.h"
#include "kiln/options.h"
#include "tools/commands.h"

namespace kiln::cli {

int report(const Error& error) {
  std::fprintf(stderr, "kiln: error: %s\n", detail::printable(error.message).c_str());
  // cli.md has no code of its own for out of memory: a device failure.
  return error.code == ErrorCode::OutOfMemory ? static_cast<int>(ErrorCode::CompileOrDevice) : static_cast<int>(error.code);
}

}  // namespace kiln::cli

int main(int argc, char** argv) {
  using namespace kiln::cli;
  // The CLI is the one user of the library that prints its diagnostics.
  kiln::set_options(kiln::Options::from_environment([](kiln::LogLevel level, std::string_view message) {
    std::fprintf(stderr, "kiln: %s%s\n", level == kiln::LogLevel::warning ? "warning: " : "",
                 kiln::detail::printable(message).c_str());
  }));
  CLI::App app{"kiln: a runtime kernel-generation fusion compiler for NVIDIA GPUs", "kiln"};
  app.require_subcommand(1);
  app.fallthrough();  // common options may follow the command
  CommonOptions common;
  app.add_option("--cache-dir", common.cache_dir,
                 "kernel cache folder (default $KILN_CACHE_DIR, else $XDG_CACHE_HOME/kiln, else ~/.cache/kiln)");
  app.add_flag("--no-cache", common.no_cache, "neither read nor write the kernel cache");
  app.add_option("--remote-cache", common.remote_cache,
                 "a Redis server behind the disk cache: redis://[user:password@]host[:port][/db] (default $KILN_REMOTE_CACHE)");
  app.add_flag("-v,--verbose", common.verbose, "say more on stderr");

  std::map<CLI::App*, Runner> runners;
  auto add = [&](auto adder) {
    const size_t before = app.get_subcommands({}).size();
    Runner r = adder(app, common);
    runners[app.get_subcommands({})[before]] = std::move(r);
  };
  add(add_validate);
  add(add_run);
  add(add_plan);
  add(add_dump);
  add(add_compile);
  add(add_warm);
  add(add_cache);
  add(add_bench);

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ValidationError& e) {  // a value of the wrong form: invalid input
    return report({kiln::ErrorCode::InvalidInput, e.what()});
  } catch (const CLI::ParseError& e) {  // unknown command or flag, missing argument
    std::fprintf(stderr, "kiln: error: %s\n(run 'kiln --help' for usage)\n", e.what());
    return static_cast<int>(kiln::ErrorCode::Usage);
  }
  // The common options are the library's settings for this run.
  if (!common.remote_cache.empty() || !common.cache_dir.empty()) {
    kiln::Options o = *kiln::current_options();
    if (!common.remote_cache.empty()) o.remote_cache = common.remote_cache;
    if (!common.cache_dir.empty()) o.cache_dir = common.cache_dir;
    kiln::set_options(std::move(o));
  }
  for (auto& [sub, run] : runners)
    if (sub->parsed()) return run();
  return static_cast<int>(kiln::ErrorCode::Usage);
}
