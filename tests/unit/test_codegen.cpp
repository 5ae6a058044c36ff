// Codegen and NVRTC (no GPU needed): every example compiles for sm_80 and
// sm_90; the kernel cache hits, proves it, and survives bad entries.
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <atomic>
#include <chrono>
#include <csignal>
#include <future>
#include <thread>

#include "compiler/graph_internal.h"
#include "codegen/kernel_codegen.h"
#include "compiler/error.h"
#include "compiler/plan_verifier.h"
#include "tests/unit/random_graph.h"
#include "compiler/planner/planner.h"
#include "kiln/executable.h"
#include "kiln/options.h"
#include "runtime/cache_dir.h"
#include "runtime/kernel_cache.h"
#include "runtime/program_cache.h"
#include "tests/unit/test_helpers.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;

std::vector<fs::path> examples() {
  std::vector<fs::path> out;
  for (const auto& e : fs::recursive_directory_iterator(KILN_SOURCE_DIR "/examples"))
    if (e.path().extension() == ".json") out.push_back(e.path());
  std::sort(out.begin(), out.end());
  return out;
}

// Every example planned, generated and NVRTC-compiled for both arches (in
// sanitizer builds a sample compiled: kNvrtcEvery).
TEST(Codegen, EveryExampleCompilesForSm80AndSm90) {
  std::vector<std::future<std::string>> jobs;
  const std::vector<fs::path> paths = examples();
  for (size_t i = 0; i < paths.size(); ++i)
    for (const char* arch : {"sm_80", "sm_90"})
      jobs.push_back(std::async(std::launch::async, [path = paths[i], arch, nvrtc = i % testing::kNvrtcEvery == 0] {
        Expected<Graph> g = Graph::load(path.string());
        return g ? testing::compiles(*g, arch, nvrtc, path.string()) : g.error().message;
      }));
  int passed = 0;
  for (auto& job : jobs) {
    const std::string error = job.get();
    EXPECT_EQ(error, "");
    passed += error.empty();
  }
  EXPECT_GE(passed, 76);
}

// The op table names each op's device functor; each must exist in the
// templates, so a new op without one fails here, not in NVRTC.
TEST(Codegen, EveryDeviceFunctorOfTheOpTableIsInTheTemplates) {
  std::ifstream in(KILN_SOURCE_DIR "/templates/kiln/common.cuh");
  const std::string templates((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_FALSE(templates.empty());
  int named = 0;
  for (int k = 0; k < ir::kOpKindCount; ++k) {
    const ir::OpInfo& op = ir::op_info(static_cast<ir::OpKind>(k));
    if (ir::is_pointwise(op.kind) && op.kind != ir::OpKind::Cast && op.kind != ir::OpKind::Clamp) {
      EXPECT_FALSE(op.device.empty()) << op.name << " is pointwise but names no device functor";
    }
    if (op.device.empty()) continue;
    ASSERT_EQ(op.device.substr(0, 6), "kiln::") << op.name;
    const std::string_view name = op.device.substr(6);
    const bool functor = templates.find(fmt::format(" {}(", name)) != std::string::npos;  // a function
    const bool combine = templates.find(fmt::format("struct {} ", name)) != std::string::npos;  // a reduction's op
    EXPECT_TRUE(functor || combine) << op.name << ": " << op.device << " is not in templates/kiln/common.cuh";
    ++named;
  }
  EXPECT_GE(named, 30);
}

TEST(Codegen, SourceHasNoUserTextOutsideComments) {
  Graph g = testing::must_parse(R"({"kiln": 1, "name": "evil\"); asm(\"trap;\"); //",
    "inputs": {"weird_input.name": {"shape": [4], "dtype": "f32"}},
    "ops": [{"op": "relu", "in": ["weird_input.name"], "out": "also_weird"}], "outputs": ["also_weird"]})");
  const codegen::GeneratedProgram p = codegen::generate_program(ir_of(g), ir::plan_fusion(ir_of(g)), 90);
  ASSERT_EQ(p.kernels.size(), 1u);
  EXPECT_EQ(p.kernels[0].source.find("evil"), std::string::npos);
  EXPECT_EQ(p.kernels[0].canonical.find("weird"), std::string::npos);
  // Renaming tensors does not change what is compiled (cache sharing).
  Graph renamed = testing::must_parse(R"({"kiln": 1, "inputs": {"x": {"shape": [4], "dtype": "f32"}},
    "ops": [{"op": "relu", "in": ["x"], "out": "y"}], "outputs": ["y"]})");
  const codegen::GeneratedProgram q = codegen::generate_program(ir_of(renamed), ir::plan_fusion(ir_of(renamed)), 90);
  EXPECT_EQ(p.kernels[0].canonical, q.kernels[0].canonical);
}

TEST(Codegen, IdenticalLayersAreOneKernelText) {
  // Two equal blocks (RMS norm, matmul + GELU + residual): the first reads the graph's input x,
  // the second the first's result y1, an intermediate with a larger id than its own weights. Their
  // kernels are one text each (compiled once): registers are named after their pointers and
  // parameters numbered by the order of use, not by the tensors' ids.
  Graph g = testing::must_parse(R"({"kiln": 1, "inputs": {"x": {"shape": [256, 512], "dtype": "bf16"},
    "g1": {"shape": [512], "dtype": "bf16"}, "w1": {"shape": [512, 512], "dtype": "bf16"},
    "g2": {"shape": [512], "dtype": "bf16"}, "w2": {"shape": [512, 512], "dtype": "bf16"}},
    "ops": [{"op": "rms_norm", "in": ["x", "g1"], "out": "n1", "dtype": "bf16"},
            {"op": "matmul", "in": ["n1", "w1"], "out": "m1", "dtype": "bf16"},
            {"op": "gelu", "in": ["m1"], "out": "a1", "dtype": "bf16"},
            {"op": "add", "in": ["x", "a1"], "out": "y1", "dtype": "bf16"},
            {"op": "rms_norm", "in": ["y1", "g2"], "out": "n2", "dtype": "bf16"},
            {"op": "matmul", "in": ["n2", "w2"], "out": "m2", "dtype": "bf16"},
            {"op": "gelu", "in": ["m2"], "out": "a2", "dtype": "bf16"},
            {"op": "add", "in": ["y1", "a2"], "out": "y2", "dtype": "bf16"}],
    "outputs": ["y2"]})");
  for (int sm : {80, 90}) {
    const codegen::GeneratedProgram p = codegen::generate_program(ir_of(g), ir::plan_fusion(ir_of(g), {.sm = sm}), sm);
    ASSERT_EQ(p.kernels.size(), 4u) << sm;
    EXPECT_EQ(p.kernels[0].canonical, p.kernels[2].canonical) << sm << ": the norms";
    EXPECT_EQ(p.kernels[1].canonical, p.kernels[3].canonical) << sm << ": the matmuls";
    EXPECT_NE(p.kernels[0].canonical, p.kernels[1].canonical);
  }
}

TEST(KernelCache, MissThenHitWithNothingCompiled) {
  const fs::path dir = testing::fresh_cache("hit");
  // A graph no other test compiles (the in-memory cache is process-wide).
  Graph g = testing::must_parse(R"({"kiln": 1, "inputs": {"x": {"shape": [7, 333], "dtype": "bf16"}},
    "ops": [{"op": "log_softmax", "in": ["x"], "out": "y"}], "outputs": ["y"]})");
  Expected<Executable> forbidden = Executable::compile(g, {.arch = "sm_90", .cache_dir = dir, .fail_if_compiling = true});
  ASSERT_FALSE(forbidden.ok());
  EXPECT_THAT(forbidden.error().message, ::testing::HasSubstr("compiling is forbidden"));
  Expected<Executable> cold = Executable::compile(g, {.arch = "sm_90", .cache_dir = dir});
  ASSERT_TRUE(cold.ok()) << cold.error().message;
  EXPECT_FALSE(cold->report()[0].cache_hit);
  Expected<Executable> warm = Executable::compile(g, {.arch = "sm_90", .cache_dir = dir, .fail_if_compiling = true});
  ASSERT_TRUE(warm.ok()) << warm.error().message;
  EXPECT_TRUE(warm->report()[0].cache_hit);
  fs::remove_all(dir);
}

TEST(KernelCache, BadEntriesAreDroppedAndRecompiled) {
  const fs::path dir = testing::fresh_cache("bad");
  const runtime::KernelCache cache(dir.string());
  const runtime::KeyParts parts = runtime::key_parts("// some kernel\n", "sm_90");
  const ir::Hash128 key = parts.key();
  const std::string cubin(1000, 'x');
  ASSERT_TRUE(cache.store(parts, "pointwise", cubin).ok());
  ASSERT_EQ(cache.load(key).value_or(""), cubin);
  const std::string path = cache.path_of(key);
  auto rewrite = [&](auto change) {
    ASSERT_TRUE(cache.store(parts, "pointwise", cubin).ok());
    std::string bytes;
    {
      std::ifstream in(path, std::ios::binary);
      bytes.assign(std::istreambuf_iterator<char>(in), {});
    }
    change(bytes);
    std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
    EXPECT_FALSE(cache.load(key).has_value());
    EXPECT_FALSE(fs::exists(path));  // deleted, not left to fail again
  };
  rewrite([](std::string& b) { b[100] ^= 0x40; });          // a flipped bit in the payload
  rewrite([](std::string& b) { b.resize(b.size() / 2); });  // truncated
  rewrite([](std::string& b) { b[8] = 9; });                // another format version
  rewrite([](std::string& b) { b[20] ^= 1; });              // another key (a foreign entry)
  // A file without kiln's header at an entry's name is not kiln's: not
  // loaded and not deleted (kiln deletes only what it wrote); the next store
  // replaces it.
  std::ofstream(path, std::ios::binary | std::ios::trunc) << "garbage";
  EXPECT_FALSE(cache.load(key).has_value());
  EXPECT_TRUE(fs::exists(path));
  ASSERT_TRUE(cache.store(parts, "pointwise", cubin).ok());
  EXPECT_EQ(cache.load(key).value_or(""), cubin);
  fs::remove_all(dir);
}

TEST(KernelCache, EightProcessesFillOneCacheConcurrently) {
  const fs::path dir = testing::fresh_cache("procs");
  // Graphs no other test compiles (the in-memory cache is process-wide).
  std::vector<Graph> graphs;
  for (int rows : {13, 17, 19})
    graphs.push_back(testing::must_parse(fmt::format(R"({{"kiln": 1, "inputs": {{"x": {{"shape": [{}, 77], "dtype": "f16"}}}},
      "ops": [{{"op": "exp", "in": ["x"], "out": "e"}}, {{"op": "reduce_sum", "in": ["e"], "out": "y", "axes": [1]}}],
      "outputs": ["y"]}})", rows)));
  std::vector<pid_t> children;
  for (int p = 0; p < 8; ++p) {  // overlapping work, each process in its own order
    const pid_t pid = fork();
    if (pid == 0) {
      int failures = 0;
      for (size_t i = 0; i < graphs.size(); ++i)
        failures += !Executable::compile(graphs[(i + static_cast<size_t>(p)) % graphs.size()], {.arch = "sm_90", .cache_dir = dir}).ok();
      _exit(failures);
    }
    children.push_back(pid);
  }
  for (pid_t pid : children) {
    int status = 0;
    waitpid(pid, &status, 0);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  // Every entry on disk is complete and valid (the parent never compiled these).
  int entries = 0;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.path().extension() == ".cubin") {
      ++entries;
      const std::string hex = e.path().stem().string();
      ir::Hash128 key{std::stoull(hex.substr(0, 16), nullptr, 16), std::stoull(hex.substr(16), nullptr, 16)};
      EXPECT_TRUE(runtime::KernelCache(dir.string()).load(key).has_value()) << e.path();
    }
  EXPECT_EQ(entries, 3);
  for (const auto& e : fs::recursive_directory_iterator(dir)) EXPECT_EQ(e.path().string().find(".tmp."), std::string::npos);
  fs::remove_all(dir);
}

// ---- the cache directory as an attack surface, and faults while writing ----

TEST(CacheDirectory, CreatedPrivate) {
  const fs::path dir = testing::fresh_cache("private") / "nested";
  ASSERT_TRUE(runtime::secure_cache_dir(dir.string()).ok());
  EXPECT_EQ(fs::status(dir).permissions() & fs::perms::all, fs::perms::owner_all);
  fs::remove_all(dir.parent_path());
}

TEST(CacheDirectory, OnlyANewOrEmptyFolderIsAdopted) {
  const fs::path root = testing::fresh_cache("adopt");
  // A user's folder holding only folders named like kiln's own is refused,
  // unmarked and untouched.
  const fs::path user = root / "user";
  fs::create_directories(user / "graphs");
  fs::create_directories(user / "tuning");
  std::ofstream(user / "graphs" / "my_model.json") << R"({"ops": []})";
  std::ofstream(user / "tuning" / "notes.txt") << "mine";
  const Status refused = runtime::secure_cache_dir(user.string());
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.error().message.find("holds 'graphs', 'tuning' and no CACHEDIR.TAG written by kiln"), std::string::npos)
      << refused.error().message;
  EXPECT_FALSE(fs::exists(user / "CACHEDIR.TAG"));
  EXPECT_TRUE(fs::exists(user / "graphs" / "my_model.json") && fs::exists(user / "tuning" / "notes.txt"));
  // An empty folder is adopted (marked), and then accepted with anything in it.
  const fs::path empty = root / "empty";
  fs::create_directories(empty);
  ASSERT_TRUE(runtime::secure_cache_dir(empty.string()).ok());
  EXPECT_TRUE(fs::exists(empty / "CACHEDIR.TAG"));
  std::ofstream(empty / "notes.txt") << "mine";
  EXPECT_TRUE(runtime::secure_cache_dir(empty.string()).ok());
  fs::remove_all(root);
}

TEST(CacheDirectory, OnlyFilesWithKilnsHeaderAreDeleted) {
  const fs::path dir = testing::fresh_cache("header");
  ASSERT_TRUE(runtime::secure_cache_dir(dir.string()).ok());
  fs::create_directories(dir / "graphs");
  const auto parse = [](const std::string& text) { return runtime::checked_body(text); };
  // A damaged document of kiln's is deleted when loaded; a file without
  // kiln's header under the same kind of name is left, and listed as foreign.
  const fs::path damaged = dir / "graphs" / "00000000000000000000000000000001.json";
  const fs::path mine = dir / "graphs" / "00000000000000000000000000000002.json";
  std::string text = runtime::with_checksum("{}");
  text.back() = ']';
  std::ofstream(damaged) << text;
  std::ofstream(mine) << "{}";
  EXPECT_FALSE(runtime::load_document<std::string>(damaged.string(), parse).has_value());
  EXPECT_FALSE(fs::exists(damaged));
  EXPECT_FALSE(runtime::load_document<std::string>(mine.string(), parse).has_value());
  EXPECT_TRUE(fs::exists(mine));
  std::ofstream(damaged) << text;
  std::vector<std::string> problems, foreign;
  runtime::list_documents<std::string>(dir.string(), "graphs", "graph recipe", parse, &problems, /*remove_bad=*/true, &foreign);
  EXPECT_EQ(problems, std::vector<std::string>{damaged.string() + ": damaged graph recipe"});
  EXPECT_EQ(foreign, std::vector<std::string>{mine.string()});
  EXPECT_FALSE(fs::exists(damaged));
  EXPECT_TRUE(fs::exists(mine));
  fs::remove_all(dir);
}

TEST(CacheDirectory, WritableByOthersIsRefusedAndKilnCompilesInMemory) {
  const fs::path dir = testing::fresh_cache("open");
  fs::create_directories(dir);
  fs::permissions(dir, fs::perms::all);
  const Status s = runtime::secure_cache_dir(dir.string());
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("group or others may write to it (mode 0777)"), std::string::npos) << s.error().message;
  EXPECT_NE(s.error().message.find("chmod 700"), std::string::npos);
  const Graph g = testing::must_parse(R"({"kiln": 1, "inputs": {"x": {"shape": [29], "dtype": "f32"}},
    "ops": [{"op": "sin", "in": ["x"], "out": "y"}], "outputs": ["y"]})");
  Expected<Executable> exe = Executable::compile(g, {.arch = "sm_90", .cache_dir = dir.string()});
  ASSERT_TRUE(exe.ok()) << exe.error().message;
  EXPECT_TRUE(fs::is_empty(dir));  // nothing written to, or read from, a directory others control
  fs::remove_all(dir);
}

TEST(CacheDirectory, OwnedByAnotherUserIsRefused) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to give a directory to another user";
  const fs::path dir = testing::fresh_cache("theirs");
  fs::create_directories(dir);
  fs::permissions(dir, fs::perms::owner_all, fs::perm_options::replace);
  ASSERT_EQ(::chown(dir.c_str(), 65534, 65534), 0);
  const Status s = runtime::secure_cache_dir(dir.string());
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("belongs to uid 65534"), std::string::npos) << s.error().message;
  fs::remove_all(dir);
}

// A NUL inside a path would cut it short there: "cache\0b" made and used
// the folder "cache". Such a path is refused, in CompileOptions and Options.
TEST(CacheDirectory, APathHoldingANulIsRefusedAndNothingIsCreated) {
  const fs::path dir = testing::fresh_cache("nul");
  fs::create_directories(dir);
  const std::string cut = (dir / "cache").string();
  const std::string with_nul = cut + std::string("\0b", 2);
  const Graph g = testing::must_parse(R"({"kiln": 1, "inputs": {"x": {"shape": [29], "dtype": "f32"}},
    "ops": [{"op": "sin", "in": ["x"], "out": "y"}], "outputs": ["y"]})");
  Expected<Executable> exe = Executable::compile(g, {.arch = "sm_90", .cache_dir = with_nul});
  ASSERT_FALSE(exe.ok());
  EXPECT_EQ(exe.error().code, ErrorCode::InvalidInput);
  EXPECT_NE(exe.error().message.find("cache_dir '" + cut + "\\x00b' holds a NUL character"), std::string::npos)
      << exe.error().message;

  const std::shared_ptr<const Options> saved = current_options();
  for (std::string Options::*field : {&Options::cache_dir, &Options::dump_dir}) {
    Options o = *saved;
    o.*field = with_nul;
    set_options(o);
    Expected<Executable> again = Executable::compile(g, {.arch = "sm_90"});
    set_options(*saved);
    ASSERT_FALSE(again.ok());
    EXPECT_NE(again.error().message.find("holds a NUL character"), std::string::npos) << again.error().message;
  }
  EXPECT_FALSE(fs::exists(cut));
  fs::remove_all(dir);
}

// Compiles into a cache folder its owner cannot write: a warning, and the
// kernel compiled in memory. Root writes through permission bits, so as
// root the check runs in a child process that becomes the unprivileged
// user 65534 (nobody) and owns the folder.
TEST(KernelCache, AReadOnlyCacheDirectoryStillCompiles) {
  const fs::path dir = testing::fresh_cache("readonly");
  ASSERT_TRUE(runtime::secure_cache_dir(dir.string()).ok());
  const Graph g = testing::must_parse(R"({"kiln": 1, "inputs": {"x": {"shape": [31], "dtype": "f32"}},
    "ops": [{"op": "tanh", "in": ["x"], "out": "y"}], "outputs": ["y"]})");
  auto compile_read_only = [&]() -> bool {
    fs::permissions(dir, fs::perms::owner_read | fs::perms::owner_exec, fs::perm_options::replace);
    Expected<Executable> exe = Executable::compile(g, {.arch = "sm_90", .cache_dir = dir.string()});
    if (!exe.ok()) std::fprintf(stderr, "compile in a read-only cache folder: %s\n", exe.error().message.c_str());
    std::vector<std::string> written;  // nothing but the marker secure_cache_dir wrote
    for (const fs::directory_entry& e : fs::directory_iterator(dir))
      if (e.path().filename() != "CACHEDIR.TAG") written.push_back(e.path().filename().string());
    return exe.ok() && written.empty();
  };
  if (::geteuid() != 0) {
    EXPECT_TRUE(compile_read_only());
  } else {
    constexpr uid_t kNobody = 65534;
    // NVRTC's builtins library is loaded on its first compile from beside
    // libnvrtc, which may lie where user 65534 cannot read (a wheel under
    // /root): load it here with another graph, so the child's compile of `g`
    // still goes through the cache folder.
    ASSERT_TRUE(Executable::compile(testing::must_parse(R"({"kiln": 1, "inputs": {"x": {"shape": [7], "dtype": "f32"}},
      "ops": [{"op": "relu", "in": ["x"], "out": "y"}], "outputs": ["y"]})"), {.arch = "sm_90", .use_cache = false}).ok());
    for (const fs::directory_entry& e : fs::recursive_directory_iterator(dir))  // the child owns the cache
      ASSERT_EQ(::lchown(e.path().c_str(), kNobody, kNobody), 0);
    ASSERT_EQ(::chown(dir.c_str(), kNobody, kNobody), 0);
    const pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      const bool ok = ::setgid(kNobody) == 0 && ::setuid(kNobody) == 0 && ::geteuid() == kNobody && compile_read_only();
      ::_exit(ok ? 0 : 1);
    }
    int status = 0;
    ASSERT_EQ(::waitpid(child, &status, 0), child);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "the unprivileged child failed (status " << status << ")";
  }
  fs::permissions(dir, fs::perms::owner_all, fs::perm_options::replace);
  fs::remove_all(dir);
}

TEST(KernelCache, SymlinksAreNeverFollowed) {
  const fs::path dir = testing::fresh_cache("links");
  ASSERT_TRUE(runtime::secure_cache_dir(dir.string()).ok());
  const runtime::KernelCache cache(dir.string());
  const runtime::KeyParts parts = runtime::key_parts("// linked kernel\n", "sm_90");
  ASSERT_TRUE(cache.store(parts, "pointwise", std::string(500, 'c')).ok());
  const fs::path entry = cache.path_of(parts.key());
  const fs::path elsewhere = dir / "elsewhere.cubin";
  fs::rename(entry, elsewhere);
  fs::create_symlink(elsewhere, entry);
  EXPECT_FALSE(cache.load(parts.key()).has_value());  // a valid entry, but reached through a link
  EXPECT_TRUE(fs::is_symlink(entry));                   // not kiln's to delete
  EXPECT_TRUE(fs::exists(elsewhere));                   // its target untouched
  ASSERT_TRUE(cache.store(parts, "pointwise", std::string(500, 'c')).ok());  // replaces the link, not its target
  EXPECT_FALSE(fs::is_symlink(entry));
  EXPECT_TRUE(cache.load(parts.key()).has_value());
  EXPECT_TRUE(fs::exists(elsewhere));
  // A linked folder makes the whole directory untrusted.
  fs::remove_all(dir / "kernels");
  fs::create_directory_symlink(fs::temp_directory_path(), dir / "kernels");
  EXPECT_FALSE(runtime::secure_cache_dir(dir.string()).ok());
  fs::remove_all(dir);
}

TEST(KernelCache, AnEntryOfAnotherArchIsNotLoaded) {
  const fs::path dir = testing::fresh_cache("arch");
  const runtime::KernelCache cache(dir.string());
  const runtime::KeyParts sm80 = runtime::key_parts("// arch kernel\n", "sm_80");
  const runtime::KeyParts sm90 = runtime::key_parts("// arch kernel\n", "sm_90");
  ASSERT_TRUE(cache.store(sm80, "pointwise", std::string(300, 'a')).ok());
  fs::create_directories(fs::path(cache.path_of(sm90.key())).parent_path());
  fs::copy_file(cache.path_of(sm80.key()), cache.path_of(sm90.key()));
  EXPECT_FALSE(cache.load(sm90.key()).has_value());
  EXPECT_FALSE(fs::exists(cache.path_of(sm90.key())));
  EXPECT_TRUE(cache.load(sm80.key()).has_value());
  fs::remove_all(dir);
}

TEST(KernelCache, ADiskFullMidWriteLeavesNoEntry) {
  const fs::path dir = testing::fresh_cache("full");
  const runtime::KernelCache cache(dir.string());
  const runtime::KeyParts parts = runtime::key_parts("// big kernel\n", "sm_90");
  const pid_t pid = fork();
  if (pid == 0) {  // a file-size limit: write() fails part-way, as on a full disk
    std::signal(SIGXFSZ, SIG_IGN);
    rlimit limit{4096, 4096};
    ::setrlimit(RLIMIT_FSIZE, &limit);
    _exit(cache.store(parts, "pointwise", std::string(100000, 'z')).ok() ? 1 : 0);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "the store must report the failure";
  EXPECT_FALSE(cache.load(parts.key()).has_value());
  for (const auto& e : fs::recursive_directory_iterator(dir)) EXPECT_FALSE(e.is_regular_file()) << e.path();
  fs::remove_all(dir);
}

TEST(KernelCache, AWriterKilledMidWriteLeavesNoEntryAndVerifyClearsItsLitter) {
  const fs::path dir = testing::fresh_cache("killed");
  const runtime::KernelCache cache(dir.string());
  const pid_t pid = fork();
  if (pid == 0) {
    for (int i = 0;; ++i) (void)cache.store(runtime::key_parts(fmt::format("// k{}\n", i), "sm_90"), "pointwise", std::string(1 << 20, 'k'));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  ::kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
  // What a killed writer can leave: complete entries and, at most, its temporary file.
  std::vector<std::string> problems;
  const auto entries = cache.list(&problems);
  EXPECT_TRUE(problems.empty()) << problems.front();
  for (const auto& e : entries) EXPECT_TRUE(cache.load(e.key).has_value()) << e.path;
  // A temporary file of kiln's (its name, the first bytes of an entry) a
  // minute old is litter: verify (list with remove_bad) deletes it. A file
  // named like one but without kiln's header is not kiln's: reported, left.
  const fs::path litter = fs::path(cache.path_of(ir::Hash128{1, 2})).parent_path() / "x.cubin.tmp.1.deadbeef";
  const fs::path foreign = litter.parent_path() / "y.cubin.tmp.1.deadbeef";
  fs::create_directories(litter.parent_path());
  std::ofstream(litter) << "KILN";
  std::ofstream(foreign) << "half";
  const timespec old[2] = {{::time(nullptr) - 120, 0}, {::time(nullptr) - 120, 0}};
  ::utimensat(AT_FDCWD, litter.c_str(), old, 0);
  ::utimensat(AT_FDCWD, foreign.c_str(), old, 0);
  problems.clear();
  std::vector<std::string> left;
  cache.list(&problems, /*remove_bad=*/true, &left);
  EXPECT_FALSE(fs::exists(litter));
  EXPECT_TRUE(fs::exists(foreign));
  EXPECT_EQ(left, std::vector<std::string>{foreign.string()});
  fs::remove_all(dir);
}

}  // namespace
}  // namespace kiln

namespace kiln {
namespace {

TEST(Codegen, RandomGraphsGenerateAndASampleCompiles) {
  // 3000 graphs planned and generated; every twentieth (150) NVRTC-compiled
  // for sm_90, a few at a time (each NVRTC instance takes a few hundred MB;
  // the 150 take about 75 s of CI's two cores; on the GPU machine
  // Gpu.RandomGraphsMatchTheReference compiles and runs seeds 1-200).
  // Sanitizer builds plan and generate 1500 and compile every fiftieth (30):
  // the generation is theirs to check (fuzz_plan_codegen fuzzes it too),
  // NVRTC's compile time the same in every build.
#ifdef KILN_SANITIZED_BUILD
  constexpr uint64_t kGraphs = 1500, kEvery = 50;
#else
  constexpr uint64_t kGraphs = 3000, kEvery = 20;
#endif
  std::vector<Graph> sample;
  for (uint64_t seed = 1; seed <= kGraphs; ++seed) {
    Graph g = testing::random_graph(seed);
    Expected<codegen::GeneratedProgram> p =
        detail::catch_errors([&] { return codegen::generate_program(ir_of(g), ir::plan_fusion(ir_of(g)), 90); });
    ASSERT_TRUE(p.ok()) << "seed " << seed << ": " << p.error().message << "\n" << g.to_json();
    if (seed % kEvery == 0) sample.push_back(std::move(g));
  }
  const size_t workers = std::max(2u, std::thread::hardware_concurrency());
  std::atomic<size_t> next{0};
  std::vector<std::string> failures(sample.size());
  std::vector<std::thread> pool;
  for (size_t w = 0; w < workers; ++w)
    pool.emplace_back([&] {
      for (size_t i = next++; i < sample.size(); i = next++) {
        Expected<Executable> exe = Executable::compile(sample[i], {.arch = "sm_90", .use_cache = false});
        if (!exe) failures[i] = fmt::format("graph {}: {}", (i + 1) * kEvery, exe.error().message);
      }
    });
  for (std::thread& t : pool) t.join();
  for (const std::string& f : failures) EXPECT_EQ(f, "");
}

}  // namespace
}  // namespace kiln

namespace kiln {
namespace {

TEST(ProgramCache, RecipeRoundTripsAndRejectsDamage) {
  Graph g = Graph::load(KILN_SOURCE_DIR "/examples/matmul/rmsnorm_matmul.json").value();
  runtime::ProgramRecipe r;
  r.program = codegen::generate_program(ir_of(g), ir::plan_fusion(ir_of(g), {.sm = 80}), 80);  // a norm prologue
  for (size_t i = 0; i < r.program.kernels.size(); ++i) {
    r.kernel_keys.push_back(std::string(32, 'a'));
    r.kernel_kinds.push_back("x");
  }
  const std::string text = runtime::recipe_to_text(r);
  std::optional<runtime::ProgramRecipe> back = runtime::recipe_from_text(text, ir_of(g).tensors.size());
  ASSERT_TRUE(back.has_value());
  ASSERT_EQ(back->program.kernels.size(), r.program.kernels.size());
  EXPECT_EQ(back->program.kernels[1].grid, r.program.kernels[1].grid);
  EXPECT_EQ(back->program.workspaces.size(), 1u);  // the row statistics
  std::string damaged = text;
  damaged[text.size() / 2] ^= 1;
  EXPECT_FALSE(runtime::recipe_from_text(damaged, ir_of(g).tensors.size()).has_value());
  EXPECT_FALSE(runtime::recipe_from_text(text, 2).has_value());  // tensor ids out of range: a foreign entry
}

// A cuBLASLt call's recipe keeps the call, and one whose pointers are not
// its kernel's arguments in their roles is refused (a damaged or foreign
// entry never reaches the library).
TEST(ProgramCache, VendorCallRoundTripsAndIsCheckedOnTheWayBack) {
  const Graph g = testing::must_parse(R"({"kiln": 1, "inputs": {"x": {"shape": [4, 64, 32], "dtype": "f32"},
    "w": {"shape": [32, 48], "dtype": "f32"}}, "ops": [{"op": "matmul", "in": ["x", "w"], "out": "y"}], "outputs": ["y"]})");
  runtime::ProgramRecipe r;
  r.program = codegen::generate_program(ir_of(g), ir::plan_fusion(ir_of(g)), 90, {}, nullptr, {.cublaslt = true});
  ASSERT_EQ(r.program.kernels.size(), 1u);
  ASSERT_TRUE(r.program.kernels[0].library.has_value());
  r.kernel_keys.push_back("");
  r.kernel_kinds.push_back("matmul");
  const std::string text = runtime::recipe_to_text(r);
  std::optional<runtime::ProgramRecipe> back = runtime::recipe_from_text(text, ir_of(g).tensors.size());
  ASSERT_TRUE(back.has_value());
  ASSERT_TRUE(back->program.kernels[0].library.has_value());
  EXPECT_EQ(*back->program.kernels[0].library, *r.program.kernels[0].library);
  EXPECT_EQ(back->program.workspaces.at(0).name, "cublasLt.workspace");
  // The result's pointer swapped for an operand's, and an argument past the end: refused.
  for (int bad : {r.program.kernels[0].library->a.arg, 99}) {
    runtime::ProgramRecipe broken = r;
    broken.program.kernels[0].library->d.arg = bad;
    EXPECT_FALSE(runtime::recipe_from_text(runtime::recipe_to_text(broken), ir_of(g).tensors.size()).has_value()) << bad;
  }
  // Strides that would read past a row: refused.
  runtime::ProgramRecipe strided = r;
  strided.program.kernels[0].library->a.row_stride = 8;
  EXPECT_FALSE(runtime::recipe_from_text(runtime::recipe_to_text(strided), ir_of(g).tensors.size()).has_value());
}

// sm_90's matmul kernel: tensor maps of both operands (a 2-d map of x, B
// read n-contiguous) and of the result (bulk stores of 64 x 64 boxes from
// shared memory), a persistent grid of 2-block clusters (the tuning asks
// for them); its recipe keeps all of it. sm_80 keeps the mma.sync kernel.
TEST(ProgramCache, HopperMatmulKeepsItsTensorMapsAndPersistentGrid) {
  Graph g = Graph::load(KILN_SOURCE_DIR "/examples/matmul/hopper_matmul_bias_gelu.json").value();
  runtime::ProgramRecipe r;
  r.program = codegen::generate_program(ir_of(g), ir::plan_fusion(ir_of(g)), 90, {{0, codegen::Tuning{128, 2, 8, 0, codegen::Tuning::kRolled}}});
  ASSERT_EQ(r.program.kernels.at(0).tuning, (codegen::Tuning{128, 2, 8, 0, codegen::Tuning::kRolled}));
  ASSERT_EQ(r.program.kernels.size(), 1u);
  const codegen::GeneratedKernel& k = r.program.kernels[0];
  EXPECT_EQ(k.persistent_group, 2u);
  EXPECT_EQ(k.grid[0], 2u * 6 * 12);  // 12 x 12 tiles of 128 x 128 (128 x 256 would not fill an H100), pairs along M
  EXPECT_EQ(k.block[0], 384u);
  std::vector<codegen::TensorMapSpec> maps;
  for (const codegen::KernelArg& a : k.args)
    if (a.role == codegen::KernelArg::Role::TensorMap) maps.push_back(a.map);
  ASSERT_EQ(maps.size(), 3u);
  EXPECT_EQ(maps[0].rank, 2);
  EXPECT_EQ(maps[0].dims[0], 256u);   // x: k contiguous
  EXPECT_EQ(maps[0].strides[0], 512u);
  EXPECT_EQ(maps[0].box[1], 128u);
  EXPECT_EQ(maps[1].dims[0], 1536u);  // w: n contiguous, 64-column boxes
  EXPECT_EQ(maps[1].box[0], 64u);
  EXPECT_EQ(maps[2].dims[0], 1536u);  // y: rows of 1536 bf16, 128-byte x 64-row boxes
  EXPECT_EQ(maps[2].dims[1], 1536u);
  EXPECT_EQ(maps[2].strides[0], 3072u);
  EXPECT_EQ(maps[2].box[0], 64u);
  EXPECT_EQ(maps[2].box[1], 64u);
  r.kernel_keys.push_back(std::string(32, 'a'));
  r.kernel_kinds.push_back("matmul");
  std::optional<runtime::ProgramRecipe> back = runtime::recipe_from_text(runtime::recipe_to_text(r), ir_of(g).tensors.size());
  ASSERT_TRUE(back.has_value());
  const codegen::GeneratedKernel& b = back->program.kernels[0];
  EXPECT_EQ(b.persistent_group, 2u);
  ASSERT_EQ(b.args.size(), k.args.size());
  for (size_t i = 0; i < k.args.size(); ++i) {
    EXPECT_EQ(b.args[i].role, k.args[i].role);
    EXPECT_EQ(b.args[i].map.dims, k.args[i].map.dims);
    EXPECT_EQ(b.args[i].map.strides, k.args[i].map.strides);
    EXPECT_EQ(b.args[i].map.box, k.args[i].map.box);
    EXPECT_EQ(b.args[i].map.dtype, k.args[i].map.dtype);
  }
  const codegen::GeneratedProgram ampere = codegen::generate_program(ir_of(g), ir::plan_fusion(ir_of(g), {.sm = 80}), 80);
  EXPECT_EQ(ampere.kernels[0].persistent_group, 0u);
  EXPECT_NE(ampere.kernels[0].source.find("kiln::tc::Gemm<"), std::string::npos);
}

// q, k and v sliced from one fused projection [B, S, 3 x H x D] (GPT-2,
// ViT): each tensor map starts at its slice (k 256 elements, 512 bytes, past
// qkv's pointer; v 1024 bytes), so the Hopper kernel keeps its TMA loads;
// the recipe keeps the offsets.
TEST(ProgramCache, HopperAttentionMapsStartAtTheSlicesOfAFusedProjection) {
  Graph g = Graph::load(KILN_SOURCE_DIR "/examples/attention/sdpa_split_heads.json").value();
  runtime::ProgramRecipe r;
  r.program = codegen::generate_program(ir_of(g), ir::plan_fusion(ir_of(g)), 90);
  const codegen::GeneratedKernel& k = r.program.kernels.at(0);
  std::vector<uint64_t> offsets;
  for (const codegen::KernelArg& a : k.args)
    if (a.role == codegen::KernelArg::Role::TensorMap) offsets.push_back(a.map.offset_bytes);
  EXPECT_EQ(offsets, (std::vector<uint64_t>{0, 512, 1024}));
  for (size_t i = 0; i < r.program.kernels.size(); ++i) {
    r.kernel_keys.push_back(std::string(32, 'a'));
    r.kernel_kinds.push_back("attention");
  }
  std::optional<runtime::ProgramRecipe> back = runtime::recipe_from_text(runtime::recipe_to_text(r), ir_of(g).tensors.size());
  ASSERT_TRUE(back.has_value());
  for (size_t i = 0; i < k.args.size(); ++i) EXPECT_EQ(back->program.kernels[0].args[i].map.offset_bytes, k.args[i].map.offset_bytes);
}

// sm_90's attention kernel: blocks loop over query tiles, a persistent
// grid without a causal mask and a block per tile under one (the hardware
// starts the next as one ends: the triangle's tiles differ in work); the
// scale goes into the softmax's exponent unless an additive mask needs it
// in the score; outputs are stored a column pair at a time.
TEST(Codegen, HopperAttentionLoopsOverQueryTiles) {
  auto kernel = [](bool causal, const std::string& mask_dtype) {
    const std::string mask = mask_dtype.empty() ? "" : fmt::format(R"(, "m": {{"shape": [300, 200], "dtype": "{}"}})", mask_dtype);
    const Graph g = testing::must_parse(fmt::format(
        R"({{"kiln": 1, "inputs": {{"q": {{"shape": [2, 8, 300, 128], "dtype": "bf16"}}, "k": {{"shape": [2, 8, 200, 128], "dtype": "bf16"}},
            "v": {{"shape": [2, 8, 200, 128], "dtype": "bf16"}}{}}},
            "ops": [{{"op": "sdpa", "in": ["q", "k", "v"{}], "out": "o", "causal": {}}}], "outputs": ["o"]}})",
        mask, mask.empty() ? "" : R"(, "m")", causal ? "true" : "false"));
    codegen::GeneratedProgram p = codegen::generate_program(ir_of(g), ir::plan_fusion(ir_of(g)), 90);
    EXPECT_EQ(p.kernels.size(), 1u);
    return p.kernels.at(0);
  };
  const codegen::GeneratedKernel plain = kernel(false, ""), causal = kernel(true, ""), additive = kernel(false, "f32"),
                                 hidden = kernel(false, "bool");
  EXPECT_EQ(plain.persistent_group, 1u);
  EXPECT_EQ(causal.persistent_group, 0u);
  for (const codegen::GeneratedKernel* k : {&plain, &causal, &additive, &hidden}) {
    EXPECT_EQ(k->grid[0], 2u * 8 * 3);  // query tiles of 128 rows
    EXPECT_NE(k->source.find("for (kiln::i64 tile = blockIdx.x; tile < 48LL; tile += gridDim.x, ++n)"), std::string::npos);
    EXPECT_TRUE(k->source.find("kiln::store_pair_") != std::string::npos ||
                k->source.find("kiln::store_rounded_pair_") != std::string::npos);
  }
  EXPECT_NE(plain.source.find("return dot;"), std::string::npos);
  EXPECT_NE(plain.source.find("kv_tiles, -100, 0.0883883461f, score);"), std::string::npos);
  EXPECT_NE(hidden.source.find("kv_tiles, -100, 0.0883883461f, score);"), std::string::npos);
  EXPECT_NE(additive.source.find("dot * 0.0883883461f"), std::string::npos);
  EXPECT_NE(additive.source.find("kv_tiles, -100, 1.0f, score);"), std::string::npos);
}

// The heuristic's key tile at head dim 128 without a causal mask: 176 from
// 2048 keys, but 128 with a mask, whose addresses beside 176 keys' S and P
// spill (H100, B4 H32 S4096: bool mask 4.959 ms at 176 against 3.632 at 128).
TEST(Codegen, HopperAttentionKeyTilesStayAt128WithAMask) {
  auto kernel = [](int64_t skv, const std::string& mask_dtype) {
    const std::string mask =
        mask_dtype.empty() ? "" : fmt::format(R"(, "m": {{"shape": [300, {}], "dtype": "{}"}})", skv, mask_dtype);
    const Graph g = testing::must_parse(fmt::format(
        R"({{"kiln": 1, "inputs": {{"q": {{"shape": [1, 4, 300, 128], "dtype": "f16"}}, "k": {{"shape": [1, 4, {0}, 128], "dtype": "f16"}},
            "v": {{"shape": [1, 4, {0}, 128], "dtype": "f16"}}{1}}},
            "ops": [{{"op": "sdpa", "in": ["q", "k", "v"{2}], "out": "o"}}], "outputs": ["o"]}})",
        skv, mask, mask.empty() ? "" : R"(, "m")"));
    return codegen::generate_program(ir_of(g), ir::plan_fusion(ir_of(g)), 90).kernels.at(0).source;
  };
  auto key_tile = [](const std::string& source) {
    const size_t at = source.find("kiln::wg::FlashAttention<128, ");
    return at == std::string::npos ? std::string("none") : source.substr(at + 30, 3);
  };
  EXPECT_EQ(key_tile(kernel(2048, "")), "176");
  EXPECT_EQ(key_tile(kernel(2047, "")), "128");
  EXPECT_EQ(key_tile(kernel(2048, "bool")), "128");
  EXPECT_EQ(key_tile(kernel(4096, "f16")), "128");
}

TEST(ProgramCache, AWarmProcessSkipsPlanningAndCompiling) {
  const fs::path dir = testing::fresh_cache("recipe");
  Graph g = testing::must_parse(R"({"kiln": 1, "inputs": {"x": {"shape": [9, 301], "dtype": "f32"}},
    "ops": [{"op": "softmax", "in": ["x"], "out": "y"}], "outputs": ["y"]})");
  ASSERT_TRUE(Executable::compile(g, {.arch = "sm_80", .cache_dir = dir}).ok());
  int recipes = 0;
  for (const auto& e : fs::recursive_directory_iterator(dir / "graphs")) recipes += e.path().extension() == ".json";
  EXPECT_EQ(recipes, 1);
  // A second process finds everything on disk.
  const pid_t pid = fork();
  if (pid == 0) _exit(Executable::compile(g, {.arch = "sm_80", .cache_dir = dir, .fail_if_compiling = true}).ok() ? 0 : 1);
  int status = 0;
  waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace kiln

namespace kiln {
namespace {

TEST(KernelCache, EvictsTheLeastRecentlyUsedFirst) {
  const fs::path dir = testing::fresh_cache("evict");
  const runtime::KernelCache cache(dir.string());
  std::vector<ir::Hash128> keys;
  for (int i = 0; i < 4; ++i) {
    const runtime::KeyParts parts = runtime::key_parts("// kernel " + std::to_string(i), "sm_90");
    ASSERT_TRUE(cache.store(parts, "pointwise", std::string(1000, 'x')).ok());
    keys.push_back(parts.key());
    // Last use: entry i used at time 1000 + i (entry 0 least recently).
    const struct timespec times[2] = {{1000 + i, 0}, {1000 + i, 0}};
    ASSERT_EQ(::utimensat(AT_FDCWD, cache.path_of(parts.key()).c_str(), times, 0), 0);
  }
  const int64_t entry = cache.list()[0].bytes;
  EXPECT_EQ(cache.evict(entry * 2), 2);
  EXPECT_FALSE(fs::exists(cache.path_of(keys[0])));
  EXPECT_FALSE(fs::exists(cache.path_of(keys[1])));
  EXPECT_TRUE(cache.load(keys[2]).has_value());  // reading marks it used now
  EXPECT_TRUE(fs::exists(cache.path_of(keys[3])));
  EXPECT_EQ(cache.evict(entry), 1);  // entry 3 is now the least recently used
  EXPECT_TRUE(fs::exists(cache.path_of(keys[2])));
  fs::remove_all(dir);
}

TEST(KernelCache, ExplainNamesThePartThatDiffers) {
  runtime::KeyParts have = runtime::key_parts("// a kernel", "sm_80");
  runtime::KeyParts want = runtime::key_parts("// a kernel", "sm_90");
  EXPECT_THAT(runtime::key_differences(have, want), ::testing::ElementsAre("arch (sm_80 cached, sm_90 wanted)"));
  want = have;
  want.options += " --use_fast_math";
  ASSERT_EQ(runtime::key_differences(have, want).size(), 1u);
  EXPECT_THAT(runtime::key_differences(have, want)[0], ::testing::HasSubstr("compile options"));
  want = have;
  want.kiln = "9.9.9";
  EXPECT_THAT(runtime::key_differences(have, want)[0], ::testing::HasSubstr("kiln version"));
  // The closest entry prefers the same source over fewer other differences.
  std::vector<runtime::CacheEntry> entries(2);
  entries[0].parts = runtime::key_parts("// another kernel", "sm_90");
  entries[1].parts = runtime::key_parts("// a kernel", "sm_80");
  EXPECT_EQ(runtime::closest_entry(entries, runtime::key_parts("// a kernel", "sm_90")), &entries[1]);
}

}  // namespace
}  // namespace kiln

namespace kiln {
namespace {

// ---- pathological sizes: each works or fails with a clear error, in bounded time and memory ----

std::string chain_graph(int ops, bool wide) {
  std::string text = R"({"kiln": 1, "inputs": {"x": {"shape": [64], "dtype": "f32"}}, "ops": [)";
  for (int i = 0; i < ops; ++i)
    text += fmt::format(R"({}{{"op": "{}", "in": ["{}", {}], "out": "t{}"}})", i ? "," : "", wide ? "mul" : "add",
                        wide || i == 0 ? "x" : fmt::format("t{}", i - 1), i + 1, i);
  text += R"(], "outputs": [)";
  for (int i = wide ? 0 : ops - 1; i < ops; i += 1000) text += fmt::format(R"({}"t{}")", i == 0 || !wide ? "" : ",", i);
  return text + "]}";
}

TEST(Pathological, HundredThousandOpsPlanAndGenerateInBoundedTime) {
#ifdef KILN_SANITIZED_BUILD
  const int ops = 25000;  // (ASan and UBSan slow the planner 15x: 100000 ops took 59 s of the 60 allowed)
#else
  const int ops = 100000;
#endif
  for (bool wide : {false, true}) {
    const auto start = std::chrono::steady_clock::now();
    const Graph g = testing::must_parse(chain_graph(ops, wide));
    const ir::Plan plan = ir::plan_fusion(ir_of(g));
    EXPECT_EQ(ir::verify_plan(ir_of(g), plan), "");
    for (const ir::PlannedKernel& k : plan.kernels) EXPECT_LE(k.ops.size(), 256u);  // the planner's per-kernel bound
    Expected<codegen::GeneratedProgram> p = detail::catch_errors([&] { return codegen::generate_program(ir_of(g), plan, 90); });
    ASSERT_TRUE(p.ok()) << p.error().message;
    // A hang guard, not a benchmark: it takes about 2 s; quadratic planning took minutes.
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 60.0) << (wide ? "wide" : "chain");
  }
}

TEST(Pathological, ReductionsOverEveryAxisOfARank8Tensor) {
  const std::string shape = "[2,1,3,1,2,5,2,3]";
  std::vector<std::string> axes_lists;
  for (int a = 0; a < 8; ++a) axes_lists.push_back(fmt::format("[{}]", a));
  axes_lists.push_back("[0,1,2,3,4,5,6,7]");
  axes_lists.push_back("[0,2,4,6]");
  for (const std::string& axes : axes_lists) {
    const Graph g = testing::must_parse(fmt::format(R"({{"kiln": 1, "inputs": {{"x": {{"shape": {}, "dtype": "bf16"}}}},
      "ops": [{{"op": "reduce_max", "in": ["x"], "out": "m", "axes": {}, "keepdims": true}},
              {{"op": "sub", "in": ["x", "m"], "out": "d"}}, {{"op": "reduce_sum", "in": ["d"], "out": "s", "axes": {}}}],
      "outputs": ["s", "d"]}})", shape, axes, axes));
    Expected<Executable> exe = Executable::compile(g, {.arch = "sm_80", .use_cache = false});
    EXPECT_TRUE(exe.ok()) << axes << ": " << exe.error().message;
  }
}

TEST(Pathological, RowsFarTooLongForOneBlockStillCompile) {
  // 4 Mi-element rows: no persistent kernel holds them; the two-pass path does.
  const Graph g = testing::must_parse(R"({"kiln": 1, "inputs": {"x": {"shape": [3, 4194304], "dtype": "bf16"}},
    "ops": [{"op": "softmax", "in": ["x"], "out": "s"}, {"op": "layer_norm", "in": ["x"], "out": "n"}], "outputs": ["s", "n"]})");
  Expected<Executable> exe = Executable::compile(g, {.arch = "sm_90", .use_cache = false});
  EXPECT_TRUE(exe.ok()) << exe.error().message;
}

}  // namespace
}  // namespace kiln

namespace kiln {
namespace {

TEST(Codegen, DecisionsAreReportedPerArch) {
  // The kernel's shape, then its epilogue. conv with channel statistics: on sm_90 the result goes out through shared
  // memory, the statistics as per-column register partials; sm_80 stores directly and keeps the same column
  // partials. A reduction along the row (RMSNorm's mean of squares after a matmul) keeps row partials.
  Graph g = Graph::load(KILN_SOURCE_DIR "/bench/graphs/anchors/conv_channel_stats.json").value();
  auto decisions = [&](int sm) {
    return codegen::generate_program(ir_of(g), ir::plan_fusion(ir_of(g), {.sm = sm}), sm).kernels.at(0).decisions;
  };
  EXPECT_EQ(decisions(90),
            "wgmma 128x128x64, A gathered, cluster 2, 6 stages, registers 128/184; "
            "epilogue: staged c, column partials for s, column partials for ss");  // (x, the conv's input, is no residual)
  EXPECT_EQ(decisions(80),
            "mma.sync 128x128x64, 2x2 warps, 3 stages; epilogue: stores direct, column partials for s, column partials for ss");
  // A library function per element (erf GELU) rolls the staged column blocks.
  Graph gelu = Graph::load(KILN_SOURCE_DIR "/examples/matmul/hopper_matmul_bias_gelu.json").value();
  const codegen::GeneratedKernel k =
      codegen::generate_program(ir_of(gelu), ir::plan_fusion(ir_of(gelu)), 90).kernels.at(0);
  EXPECT_EQ(k.decisions,
            "wgmma 128x192x64, A by TMA, cluster 1, 4 stages, registers 56/224; epilogue: staged y, column blocks rolled");
  Graph rms = Graph::load(KILN_SOURCE_DIR "/examples/matmul/hopper_residual_rms_norm.json").value();
  EXPECT_EQ(codegen::generate_program(ir_of(rms), ir::plan_fusion(ir_of(rms)), 90).kernels.at(0).decisions,
            "wgmma 128x192x64, A by TMA, cluster 1, 4 stages, registers 56/224; "
            "epilogue: staged h, residual r, row partials for ms, column blocks unrolled");
  // Ping-pong, where the tuning asks: each warpgroup's own 64-row tiles.
  EXPECT_EQ(codegen::generate_program(ir_of(gelu), ir::plan_fusion(ir_of(gelu)), 90,
                                      {{0, codegen::Tuning{256, 1, 8, 0, codegen::Tuning::kRolled, 1}}})
                .kernels.at(0)
                .decisions,
            "wgmma 64x256x64 per warpgroup (ping-pong), A by TMA, cluster 1, 4 stages, registers 56/224; "
            "epilogue: staged y, column blocks rolled");
}

}  // namespace
}  // namespace kiln

namespace kiln {
namespace {

TEST(Codegen, AnAttentionOutputReadAsRowsGoesToTheCopyEngineWhereNoSliceCrossesASplit) {
  // [B, H, S, D] read as [B*S, H*D] (an output projection): a 128 x 64 slice of A is one box of
  // a rank-4 map when S is a multiple of 128 and D of 64; otherwise the kernel loads A itself.
  auto kernel_for = [](int64_t s, int64_t d) {
    const int64_t b = 4, h = 4, n = 2176;
    const Graph g = testing::must_parse(fmt::format(R"({{"kiln": 1, "inputs": {{"o": {{"shape": [{0}, {1}, {2}, {3}], "dtype": "bf16"}},
      "w": {{"shape": [{4}, {5}], "dtype": "bf16"}}}},
      "ops": [{{"op": "transpose", "in": ["o"], "out": "t", "perm": [0, 2, 1, 3]}},
              {{"op": "reshape", "in": ["t"], "out": "rows", "shape": [{6}, {5}]}},
              {{"op": "transpose", "in": ["w"], "out": "wt", "perm": [1, 0]}},
              {{"op": "matmul", "in": ["rows", "wt"], "out": "y"}}], "outputs": ["y"]}})",
                                                    b, h, s, d, n, h * d, b * s));
    return codegen::generate_program(ir_of(g), ir::plan_fusion(ir_of(g)), 90).kernels.at(0);
  };
  const codegen::GeneratedKernel split = kernel_for(256, 64);
  EXPECT_NE(split.source.find("full, (int)(k0 % 64LL), (int)(m0 % 256LL), (int)(k0 / 64LL), (int)(m0 / 256LL))"),
            std::string::npos);
  bool rank4 = false;
  for (const codegen::KernelArg& arg : split.args)
    if (arg.role == codegen::KernelArg::Role::TensorMap && arg.map.rank == 4) {
      rank4 = true;
      EXPECT_EQ(arg.map.dims[0], 64u);
      EXPECT_EQ(arg.map.dims[1], 256u);
      EXPECT_EQ(arg.map.strides[0], 64u * 2);            // s: D elements apart in o
      EXPECT_EQ(arg.map.strides[1], 256u * 64 * 2);      // h: S * D
      EXPECT_EQ(arg.map.strides[2], 4u * 256 * 64 * 2);  // b: H * S * D
      EXPECT_EQ(arg.map.box[2], 1u);
      EXPECT_EQ(arg.map.box[3], 1u);
    }
  EXPECT_TRUE(rank4);
  // A slice would cross a sequence (S = 197: ViT-S) or a head (D = 32): no split map.
  for (auto [s, d] : {std::pair<int64_t, int64_t>{197, 64}, {256, 32}}) {
    const codegen::GeneratedKernel k = kernel_for(s, d);
    EXPECT_EQ(k.source.find("(int)(m0 / "), std::string::npos) << s << " " << d;
    EXPECT_EQ(k.source.find("(int)(k0 / "), std::string::npos) << s << " " << d;
  }
}

TEST(Codegen, TensorsNamedLikeGeneratedVariablesAreOnlyComments) {
  // Tensor names reach the source only in comments, so names the emitter
  // also uses for its variables (c2, v0, ...) are no conflict (the fuzzer's
  // first find of the renumbering: conv_channel_stats' tensor c2).
  Graph g = testing::must_parse(R"({"kiln": 1, "inputs": {"v0": {"shape": [4, 8], "dtype": "f32"}, "c1": {"shape": [8], "dtype": "f32"}},
    "ops": [{"op": "add", "in": ["v0", "c1"], "out": "c2"}, {"op": "exp", "in": ["c2"], "out": "v3"},
            {"op": "reduce_sum", "in": ["v3"], "out": "l4", "axes": [1]}], "outputs": ["v3", "l4"]})");
  Graph stats = Graph::load(KILN_SOURCE_DIR "/bench/graphs/anchors/conv_channel_stats.json").value();
  for (const Graph* graph : {&g, &stats})
    for (bool fuse : {true, false})
      for (int sm : {80, 90}) {
        Expected<codegen::GeneratedProgram> p = detail::catch_errors([&] {
          return codegen::generate_program(ir_of(*graph), ir::plan_fusion(ir_of(*graph), {.fuse = fuse, .sm = sm}), sm);
        });
        ASSERT_TRUE(p.ok()) << p.error().message;
        for (const codegen::GeneratedKernel& k : p->kernels) EXPECT_EQ(k.source.find('\x1f'), std::string::npos);
      }
}

}  // namespace
}  // namespace kiln
