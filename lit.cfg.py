# lit configuration for kiln's golden tests: `*.test` files beside the graphs
# they check (examples/, tests/malformed/). CMake passes the paths:
#   lit --param kiln=BIN --param filecheck_dir=DIR --param exec_root=DIR PATHS
import os
import shutil
import sys
import lit.formats

config.name = "kiln"
config.test_format = lit.formats.ShTest(execute_external=False)
config.suffixes = [".test"]
config.test_source_root = os.path.dirname(os.path.abspath(__file__))
config.test_exec_root = lit_config.params.get("exec_root", "/tmp/kiln-lit")
config.excludes = ["build", "bench", "tools", "Output"]

kiln = lit_config.params.get("kiln")
if not kiln:
    lit_config.fatal("pass --param kiln=/path/to/kiln")
config.substitutions.append(("%kiln", kiln))
config.substitutions.append(("%python", sys.executable))
# %long_matmul_n: the side of a square f32 matmul that the reference
# interpreter takes a few seconds on (8 s at 2400 in a release build on a
# CI-sized machine; a sanitizer build is about 30 times slower, and 800 is
# 27 times less work).
sanitized = lit_config.params.get("sanitized", "0") == "1"
config.substitutions.append(("%long_matmul_n", "800" if sanitized else "2400"))
# `UNSUPPORTED: sanitized`: the few tests whose time under the sanitizers is
# NVRTC's (uninstrumented) or the reference interpreter's on a large graph
# (5-37 s each, half of the sanitized golden suite), where the code they run
# is the code smaller tests run. Their plans and kernels are still generated
# under the sanitizers (Codegen.EveryExampleCompilesForSm80AndSm90, the
# fuzzers' seeds); the GCC build runs them whole.
if sanitized:
    config.available_features.add("sanitized")
# %expect-exit CODE CMD...: passes when CMD exits with exactly CODE (a crash,
# a hang past 60 s, or any other code fails the test).
config.substitutions.append(
    ("%expect-exit", "bash " + os.path.join(config.test_source_root, "tests", "expect-exit.sh")))

path = [lit_config.params.get("filecheck_dir", ""), lit_config.params.get("sass_dir", ""),
        config.environment.get("PATH", os.environ.get("PATH", ""))]
config.environment["PATH"] = os.pathsep.join(p for p in path if p)
# `REQUIRES: sass`: tests that read a kernel's SASS need cuobjdump or nvdisasm.
if any(shutil.which(tool, path=config.environment["PATH"]) for tool in ("cuobjdump", "nvdisasm")):
    config.available_features.add("sass")
# Tests must not touch the user's kernel cache.
config.environment["KILN_CACHE_DIR"] = os.path.join(config.test_exec_root, "cache")
# Plans that do not depend on whether this machine has cuBLASLt: kiln's own
# kernels, the cuBLASLt tactic refused for it (a test asks for it by name).
config.environment["KILN_VENDOR"] = "off"
