# Prints the graphs under FOLDER (recursively *.json, relative to FOLDER, in
# order) whose `kiln plan` differs between two archs, then a count line:
#
#   plans_by_arch.py KILN FOLDER ARCH_A ARCH_B
#   -> conv/bn_relu_conv_prologue.json
#      ...
#      6 of 85 graphs plan differently for sm_80 and sm_90
#
# tests/cli/warm_per_arch.test checks the list, so that a new example whose
# plan depends on the arch joins the graphs it warms and compiles per arch.
import glob
import os
import subprocess
import sys

kiln, folder, arch_a, arch_b = sys.argv[1:5]


def plan(path, arch):
    done = subprocess.run([kiln, "plan", path, "--arch", arch], capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"plans_by_arch.py: kiln plan {path} --arch {arch} exited {done.returncode}: {done.stderr.strip()}")
    # The plan alone: each kernel's tactic lines name the arch (codegen/tactic.h).
    return "".join(line for line in done.stdout.splitlines(True) if not line.startswith(("  tactic for ", "  rejected ")))


paths = sorted(glob.glob(os.path.join(folder, "**", "*.json"), recursive=True))
differ = [p for p in paths if plan(p, arch_a) != plan(p, arch_b)]
for p in differ:
    print(os.path.relpath(p, folder))
print(f"{len(differ)} of {len(paths)} graphs plan differently for {arch_a} and {arch_b}")
