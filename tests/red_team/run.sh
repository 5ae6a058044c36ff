#!/usr/bin/env bash
# Every case of the CLI red team (issue 24's list), run against a kiln
# binary: what kiln did, its exit code, wall time and peak memory, as a
# Markdown table. Usage: tests/red_team/run.sh KILN [WORKDIR]
# Needs no GPU (cases that need one say so). Each case has a time limit;
# a case that reaches it is reported as a hang.
set -uo pipefail
kiln=$(readlink -f "$1")
work=${2:-$(mktemp -d)}
rm -rf "$work"  # a fresh folder each run
mkdir -p "$work" && cd "$work" || exit 2
export KILN_CACHE_DIR=$work/cache
unset KILN_CACHE_MAX_BYTES KILN_DUMP_DIR

unexpected=0
printf '| case | exit | s | peak MiB | what kiln said (first line) |\n|---|---|---|---|---|\n'
# case NAME EXPECTED_EXITS CMD...: runs CMD with a 60 s limit; marks
# an exit outside EXPECTED_EXITS (a comma list) with "UNEXPECTED".
case_() {
  local name=$1 expected=$2; shift 2
  local code seconds peak said
  # Wall time and the child's peak resident memory, with a 60 s limit (the
  # whole process group is killed: a hang is reported, not waited on).
  read -r code seconds peak < <(python3 - "$@" <<'PY'
import os, resource, signal, subprocess, sys, time
start = time.monotonic()
with open("out.txt", "wb") as out, open("err.txt", "wb") as err:
    child = subprocess.Popen(sys.argv[1:], stdin=subprocess.DEVNULL, stdout=out, stderr=err, start_new_session=True)
    try:
        code = child.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)
        child.wait()
        code = 124
code = 128 - code if code < 0 else code
print(code, f"{time.monotonic() - start:.1f}", resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss // 1024)
PY
)
  said=$( (grep -v '^\s*$' err.txt; grep -v '^\s*$' out.txt) | head -1 | cut -c1-150 | tr '|' '/' | cat -v)
  [[ $code == 124 ]] && said="HANG (killed after 60 s) $said"
  [[ ",$expected," == *",$code,"* ]] || said="UNEXPECTED: $said"
  [[ $said == UNEXPECTED* ]] && unexpected=$((unexpected + 1))
  printf '| %s | %s | %s | %s | %s |\n' "$name" "$code" "$seconds" "$peak" "$said"
}
graph() {  # graph FILE NAME INPUTS_JSON OPS_JSON OUTPUTS_JSON
  printf '{"kiln": 1, "name": %s, "inputs": %s, "ops": %s, "outputs": %s}\n' "$2" "$3" "$4" "$5" >"$1"
}
npy() {  # npy FILE SHAPE_TUPLE DESCR [DATA_BYTES]: a version-1 .npy header, then DATA_BYTES zero bytes
  python3 - "$@" <<'PY'
import sys
path, shape, descr = sys.argv[1], sys.argv[2], sys.argv[3]
data = int(sys.argv[4]) if len(sys.argv) > 4 else 0
header = "{'descr': '%s', 'fortran_order': False, 'shape': %s, }" % (descr, shape)
header += " " * (64 - (10 + len(header) + 1) % 64) + "\n"
with open(path, "wb") as f:
    f.write(b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header.encode())
    f.write(b"\0" * data)
PY
}

graph relu.json '"relu"' '{"x": {"shape": [4, 4], "dtype": "f32"}}' '[{"op": "relu", "in": ["x"], "out": "y"}]' '["y"]'
graph big_matmul.json '"big"' '{"a": {"shape": [200000, 200000], "dtype": "f32"}, "b": {"shape": [200000, 200000], "dtype": "f32"}}' \
  '[{"op": "matmul", "in": ["a", "b"], "out": "y"}]' '["y"]'
# The red team's sizes (a 60000^2 relu needs 40 GiB with the reference, 10 * 2^30
# random inputs 120 GiB) fit a large machine, where kiln rightly runs them for
# minutes: the rows grow with the memory available here, so that each case
# needs about twice what this machine has (a 512 GiB host: 26 and 9 times).
available_gib=$(awk '/^MemAvailable:/ {print int($2 / 1048576)}' /proc/meminfo)
relu_rows=$((60000 * (1 + available_gib / 20)))
input_rows=$((10 * (1 + available_gib / 60)))
graph big_relu.json '"big_relu"' "{\"x\": {\"shape\": [$relu_rows, 60000], \"dtype\": \"bf16\"}}" '[{"op": "relu", "in": ["x"], "out": "y", "dtype": "bf16"}]' '["y"]'
graph huge_inputs.json '"huge"' "{\"x\": {\"shape\": [$input_rows, 1073741824], \"dtype\": \"f32\"}}" '[{"op": "relu", "in": ["x"], "out": "y"}]' '["y"]'
graph k38.json '"k38"' '{"a": {"shape": [1, 274877906944], "dtype": "bf16"}, "b": {"shape": [274877906944, 1], "dtype": "bf16"}}' \
  '[{"op": "matmul", "in": ["a", "b"], "out": "y"}]' '["y"]'
graph zero_strides.json '"zs"' '{"x": {"shape": [4, 4], "dtype": "f32", "strides": [0, 0]}}' '[{"op": "relu", "in": ["x"], "out": "y"}]' '["y"]'
printf '{"kiln": 1, "name": "bad\\u001b[31mname\\nline2\\u0000", "inputs": {"x": {"shape": [4], "dtype": "f32"}}, "ops": [{"op": "relu", "in": ["x"], "out": "y"}], "outputs": ["y"]}' >escape.json

echo "| **resources** | | | | |"
case_ "run --device cpu: 200000^2 f32 matmul" 1 "$kiln" run --device cpu --random 1 big_matmul.json
case_ "run --device cpu: ${relu_rows}x60000 bf16 relu" 1 "$kiln" run --device cpu --random 1 big_relu.json
case_ "run --device cpu: random inputs of $input_rows*2^30 elements" 1 "$kiln" run --device cpu --random 1 huge_inputs.json
case_ "warm --jobs 100000" 0 "$kiln" warm --jobs 100000 relu.json
case_ "compile: matmul with K = 2^38" 0,1 "$kiln" compile k38.json

echo "| **input files** | | | | |"
mkdir -p in_dir/x.npy; case_ "--inputs DIR with x.npy a directory" 1 "$kiln" run --device cpu --inputs in_dir relu.json
mkdir -p in_fifo && rm -f in_fifo/x.npy && mkfifo in_fifo/x.npy; case_ "--inputs: x.npy a FIFO" 1 "$kiln" run --device cpu --inputs in_fifo relu.json
mkdir -p in_zero && ln -sf /dev/zero in_zero/x.npy; case_ "--inputs: x.npy a link to /dev/zero" 1 "$kiln" run --device cpu --inputs in_zero relu.json
mkdir -p in_sparse && npy in_sparse/x.npy '(4, 4)' '<f4' 64 && truncate -s 3G in_sparse/x.npy
case_ "--inputs: 3 GB sparse x.npy, valid header (numpy reads the 64 bytes it states)" 0 "$kiln" run --device cpu --inputs in_sparse relu.json
mkdir -p in_wrap && npy in_wrap/x.npy '(2147483648, 2147483648)' '<f4'
case_ "--inputs: shape (2^31, 2^31) <f4 (count x size wraps)" 1 "$kiln" run --device cpu --inputs in_wrap relu.json
mkdir -p in_zs && npy in_zs/x.npy '(4, 4)' '<f4' && python3 -c "
import struct; open('in_zs/x.npy', 'ab').write(struct.pack('<16f', *range(16)))"
case_ "--inputs: values that strides [0, 0] cannot hold" 1 "$kiln" run --device cpu --inputs in_zs zero_strides.json
case_ "validate DIR" 1 "$kiln" validate in_dir
rm -f fifo.json && mkfifo fifo.json; case_ "validate a FIFO" 1 "$kiln" validate fifo.json
mkdir -p out_link && ln -sf "$work/victim.txt" out_link/y.npy && echo keep >victim.txt
case_ "--outputs: y.npy a planted link" 0 "$kiln" run --device cpu --random 1 --outputs out_link relu.json
printf '| (the link'"'"'s target afterwards) | | | | %s |\n' "$(cat victim.txt)"
[[ $(cat victim.txt) == keep ]] || unexpected=$((unexpected + 1))

echo "| **options** | | | | |"
case_ "KILN_CACHE_MAX_BYTES=garbage compile" 0 env KILN_CACHE_MAX_BYTES=garbage "$kiln" compile relu.json
case_ "KILN_CACHE_MAX_BYTES=-5 compile" 0 env KILN_CACHE_MAX_BYTES=-5 "$kiln" compile relu.json
case_ "KILN_CACHE_MAX_BYTES=1 compile" 0 env KILN_CACHE_MAX_BYTES=1 "$kiln" compile relu.json
case_ "--arch sm_999" 1 "$kiln" compile --arch sm_999 relu.json
case_ "--jobs abc" 1 "$kiln" warm --jobs abc relu.json
case_ "--jobs 2147483648" 1 "$kiln" warm --jobs 2147483648 relu.json
case_ "--jobs 0" 1 "$kiln" warm --jobs 0 relu.json
case_ "--tolerance nan" 1 "$kiln" run --device cpu --random 1 --check --tolerance nan relu.json
case_ "--random -1" 1 "$kiln" run --device cpu --random -1 relu.json
case_ "--random 1e23" 1 "$kiln" run --device cpu --random 1e23 relu.json
case_ "dump --kernel -7" 1 "$kiln" dump --stage cuda --kernel -7 relu.json
case_ "dump --kernel 3 --stage ir" 1 "$kiln" dump --stage ir --kernel 3 relu.json
case_ "KILN_DUMP_DIR not writable" 0 env KILN_DUMP=cuda KILN_DUMP_DIR=/proc/kiln-dump "$kiln" compile --no-cache relu.json
if command -v dot >/dev/null; then
  case_ "TMPDIR missing: plan --svg" 1 env TMPDIR=$work/missing "$kiln" plan --svg relu.json
else
  printf '| TMPDIR missing: plan --svg | | | | skipped: no Graphviz dot here |\n'
fi
case_ "TMPDIR missing: warm" 0,1 env TMPDIR=$work/missing "$kiln" warm relu.json

echo "| **the cache folder** | | | | |"
mkdir -p project/graphs project/tuning && echo mine >project/notes.txt && echo '{}' >project/graphs/my_model.json
case_ "--cache-dir PROJECT compile" 1 "$kiln" --cache-dir project compile relu.json
case_ "--cache-dir PROJECT cache clear" 1 "$kiln" --cache-dir project cache clear
printf '| (the project folder afterwards) | | | | %s |\n' "$(cd project && find . -type f | sort | tr '\n' ' ')"
[[ -f project/notes.txt && -f project/graphs/my_model.json ]] || unexpected=$((unexpected + 1))
if [[ $(id -u) == 0 ]]; then case_ "KILN_CACHE_DIR=/ as root" 1 env KILN_CACHE_DIR=/ "$kiln" compile relu.json; fi
"$kiln" compile relu.json >/dev/null 2>&1
entry=$(find cache/kernels -type f -name '*.cubin*' -o -type f -path '*kernels*' | grep -v CACHEDIR | head -1)
cp "$entry" entry.bak
truncate -s 40G "$entry"
case_ "a cache entry grown to 40 GB: compile" 0 "$kiln" compile relu.json
case_ "  ... cache verify" 0,1 "$kiln" cache verify
printf '| (the entry afterwards) | | | | %s |\n' "$( [[ -e $entry ]] && du -h --apparent-size "$entry" | cut -f1 || echo removed)"
"$kiln" compile relu.json >/dev/null 2>&1
entry=$(find cache/kernels -type f | grep -v CACHEDIR | head -1)
rm -f "$entry" && mkfifo "$entry"
case_ "a FIFO in place of a cache entry: compile" 0 "$kiln" compile relu.json
case_ "  ... cache ls" 0 "$kiln" cache ls
case_ "  ... cache verify" 0,1 "$kiln" cache verify
"$kiln" cache clear >/dev/null 2>&1
graph neg.json '"neg"' '{"x": {"shape": [4, 4], "dtype": "f32"}}' '[{"op": "neg", "in": ["x"], "out": "y"}]' '["y"]'
"$kiln" compile relu.json >/dev/null 2>&1; first=$(find cache/kernels -type f -name '*.cubin')
"$kiln" compile neg.json >/dev/null 2>&1; second=$(find cache/kernels -type f -name '*.cubin' | grep -v "$first")
python3 - "$first" "$second" <<'PY'
import sys, pathlib
a, b = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
key = bytes.fromhex(b.stem)  # the name is the key, high half first
data = bytearray(a.read_bytes())
data[16:24] = int.from_bytes(key[:8], "big").to_bytes(8, "little")
data[24:32] = int.from_bytes(key[8:], "big").to_bytes(8, "little")
b.write_bytes(bytes(data))  # relu's kernel under neg's name, its header's key patched to match
PY
case_ "relu's entry under neg's name, key patched: cache verify" 0,1 "$kiln" cache verify
case_ "  ... compile neg (must not load relu's kernel)" 0 "$kiln" compile neg.json

echo "| **the size limit** | | | | |"
"$kiln" cache clear >/dev/null 2>&1
case_ "KILN_CACHE_MAX_BYTES=1 compile" 0 env KILN_CACHE_MAX_BYTES=1 "$kiln" compile relu.json
examples=$(cd "$(dirname "$kiln")/../.." && pwd)/examples
[[ -d $examples ]] || examples=$(dirname "$(readlink -f "$0")")/../../examples
"$kiln" cache clear >/dev/null 2>&1
start=$SECONDS
for i in 1 2 3 4 5 6 7 8; do KILN_CACHE_MAX_BYTES=100000 "$kiln" warm --jobs 2 "$examples/pointwise" "$examples/reduction" >/dev/null 2>warm$i.err & done
wait
size=$(find cache/kernels -type f -name '*.cubin' -printf '%s\n' | awk '{s += $1} END {print s + 0}')
printf '| 8 warms at once, KILN_CACHE_MAX_BYTES=100000 | | %s | | %s |\n' "$((SECONDS - start))" \
  "$( ((size <= 100000)) && echo "cache $size bytes afterwards: within the limit" || echo "UNEXPECTED: cache $size bytes afterwards")"
((size <= 100000)) || unexpected=$((unexpected + 1))
grep -h "error" warm*.err | head -3 | sed 's/^/| (a warm said) | | | | UNEXPECTED: /; s/$/ |/'
grep -qh "error" warm*.err && unexpected=$((unexpected + 1))
"$kiln" cache clear >/dev/null 2>&1
( for i in $(seq 30); do "$kiln" cache clear >/dev/null 2>&1; done ) &
# (The clears may delete what warm compiled: warm then names each graph a
# compile would compile again and exits 3, its check of what it warmed.)
case_ "warm while cache clear runs 30 times beside it" 0,3 "$kiln" warm --jobs 2 "$examples/pointwise" "$examples/reduction"
wait
echo "| **output of names** | | | | |"
case_ "validate: a name with ESC, newline, NUL" 0 "$kiln" validate escape.json
case_ "compile: the same name" 0 "$kiln" compile escape.json
echo
echo "$unexpected unexpected"
exit $((unexpected > 0))
