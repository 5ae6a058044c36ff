# Writes the malformed-graph corpus (tests/malformed/*.json) and its lit test.
# Each case: a file with one defect and the message kiln must print for it.
import json, os
out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "malformed")
os.makedirs(out, exist_ok=True)

def g(inputs=None, ops=None, outputs=None, **top):
    d = {"kiln": 1}
    d.update(top)
    d["inputs"] = inputs if inputs is not None else {"x": {"shape": [4, 8], "dtype": "f32"}}
    d["ops"] = ops if ops is not None else [{"op": "relu", "in": ["x"], "out": "y"}]
    d["outputs"] = outputs if outputs is not None else ["y"]
    return json.dumps(d, indent=1)

X = {"x": {"shape": [4, 8], "dtype": "f32"}}
cases = [
 ("truncated", '{"kiln": 1, "inputs": {"x": {"shape": [4', "invalid JSON: parse error at line 2, column 1"),
 ("empty_file", "", "invalid JSON"),
 ("trailing_garbage", g() + " }", "invalid JSON"),
 ("not_an_object", "[1, 2, 3]", "a graph must be a JSON object, got array"),
 ("missing_version", json.dumps({"inputs": X, "ops": [], "outputs": ["x"]}), 'missing "kiln"'),
 ("version_2", g().replace('"kiln": 1', '"kiln": 2'), '"kiln" must be the integer 1 (the format version), got 2'),
 ("version_string", g().replace('"kiln": 1', '"kiln": "1"'), '"kiln" must be the integer 1'),
 ("unknown_top_level_key", g(optimize=True), "unknown top-level key 'optimize'"),
 ("missing_outputs", json.dumps({"kiln": 1, "inputs": X, "ops": []}), 'missing "outputs"'),
 ("empty_outputs", g(outputs=[]), "outputs: the graph must have at least one output"),
 ("duplicate_output", g(outputs=["y", "y"]), "outputs: 'y' is listed twice"),
 ("undefined_output", g(outputs=["zz"]), "outputs: 'zz' is not a graph input or op output"),
 ("duplicate_json_key", '{"kiln": 1, "inputs": {"x": {"shape": [4], "dtype": "f32"}, "x": {"shape": [8], "dtype": "f32"}}, "ops": [], "outputs": ["x"]}',
  "key 'x' appears twice in one object"),
 ("bad_input_name", g(inputs={"x-1": {"shape": [4], "dtype": "f32"}}, ops=[], outputs=["x-1"]), "input 'x-1': not a valid name"),
 ("name_injection", g(ops=[{"op": "relu", "in": ["x"], "out": "y\");asm(\"trap;\");//"}], outputs=["y"]),
  "op 0: output name 'y\");asm(\"trap;\");//' is not a valid name"),
 ("name_newline", g(inputs={"x\n#include <evil>": {"shape": [4], "dtype": "f32"}}, ops=[], outputs=["x"]),
  "input 'x\\n#include <evil>': not a valid name"),
 ("name_too_long", g(inputs={"a" * 129: {"shape": [4], "dtype": "f32"}}, ops=[], outputs=["a" * 129]), "at most 128 characters"),
 ("name_redefined", g(ops=[{"op": "relu", "in": ["x"], "out": "x"}], outputs=["x"]), "op 0 'x' (relu): the name 'x' is already defined"),
 ("unknown_dtype", g(inputs={"x": {"shape": [4], "dtype": "f64"}}, ops=[], outputs=["x"]), "input 'x': unknown dtype 'f64' (supported: f32, f16, bf16, bool)"),
 ("reserved_fp8_dtype", g(inputs={"x": {"shape": [4], "dtype": "f8e4m3"}}, ops=[], outputs=["x"]), "dtype 'f8e4m3' is reserved for a later version"),
 ("input_missing_dtype", g(inputs={"x": {"shape": [4]}}, ops=[], outputs=["x"]), "input 'x': missing \"dtype\""),
 ("input_unknown_key", g(inputs={"x": {"shape": [4], "dtype": "f32", "layout": "NHWC"}}, ops=[], outputs=["x"]), "input 'x': unknown key 'layout'"),
 ("zero_dimension", g(inputs={"x": {"shape": [0, 8], "dtype": "f32"}}, ops=[], outputs=["x"]), "shape [0,8] has dimension 0 (dimensions are >= 1)"),
 ("rank_9", g(inputs={"x": {"shape": [1] * 9, "dtype": "f32"}}, ops=[], outputs=["x"]), "has rank 9 (at most 8)"),
 ("element_count_overflow", g(inputs={"x": {"shape": [2147483648, 2147483648, 2], "dtype": "f32"}}, ops=[], outputs=["x"]), "has more than 2^62 elements"),
 ("dimension_not_integer", g(inputs={"x": {"shape": [4, 8.5], "dtype": "f32"}}, ops=[], outputs=["x"]), "an entry of shape must be an integer, got a number"),
 ("dimension_huge", '{"kiln": 1, "inputs": {"x": {"shape": [18446744073709551615], "dtype": "f32"}}, "ops": [], "outputs": ["x"]}', "an entry of shape 18446744073709551615 is too large"),
 ("negative_stride", g(inputs={"x": {"shape": [4, 8], "dtype": "f32", "strides": [8, -1]}}, ops=[], outputs=["x"]), "stride -1 of dimension 1 is negative"),
 ("strides_wrong_rank", g(inputs={"x": {"shape": [4, 8], "dtype": "f32", "strides": [1]}}, ops=[], outputs=["x"]), "strides [1] have 1 entries but shape [4,8] has rank 2"),
 ("unknown_op", g(ops=[{"op": "addd", "in": ["x", "x"], "out": "y"}]), "op 0 'y': unknown op 'addd' (did you mean 'add'?)"),
 ("op_missing_out", g(ops=[{"op": "relu", "in": ["x"]}]), "op 0: missing \"out\""),
 ("wrong_arity", g(ops=[{"op": "relu", "in": ["x", "x"], "out": "y"}]), "op 0 'y' (relu): takes 1 input, got 2"),
 ("undefined_operand", g(ops=[{"op": "relu", "in": ["q"], "out": "y"}]), "op 0 'y' (relu): reads 'q', which is not a graph input or the output of an earlier op"),
 ("use_before_definition", g(ops=[{"op": "neg", "in": ["z"], "out": "y"}, {"op": "relu", "in": ["x"], "out": "z"}]),
  "op 0 'y' (neg): reads 'z', which is not a graph input or the output of an earlier op"),
 ("broadcast_mismatch", g(inputs={"c": {"shape": [32, 56, 56, 128], "dtype": "bf16"}, "b": {"shape": [64], "dtype": "bf16"}},
    ops=[{"op": "relu", "in": ["c"], "out": "r"}, {"op": "add", "in": ["r", "b"], "out": "cb"}], outputs=["cb"]),
  "op 1 'cb' (add): shapes [32,56,56,128] and [64] do not broadcast"),
 ("unknown_attribute", g(ops=[{"op": "relu", "in": ["x"], "out": "y", "alpha": 0.1}]), "op 0 'y' (relu): unknown attribute 'alpha' (relu takes no attributes)"),
 ("attribute_wrong_type", g(ops=[{"op": "reduce_sum", "in": ["x"], "out": "y", "axes": "0"}]), "attribute 'axes' must be a list of integers, got '0'"),
 ("attribute_not_finite", g(ops=[{"op": "layer_norm", "in": ["x"], "out": "y", "eps": 1e39}]), "attribute 'eps' 1e+39 is not finite in f32"),
 ("axis_out_of_range", g(ops=[{"op": "softmax", "in": ["x"], "out": "y", "axis": 2}]), "op 0 'y' (softmax): axis 2 is out of range for a rank-2 input"),
 ("duplicate_axes", g(ops=[{"op": "reduce_max", "in": ["x"], "out": "y", "axes": [1, -1]}]), "axes [1,-1] name the same axis twice"),
 ("matmul_inner_mismatch", g(inputs={"a": {"shape": [8, 16], "dtype": "bf16"}, "b": {"shape": [32, 8], "dtype": "bf16"}},
    ops=[{"op": "matmul", "in": ["a", "b"], "out": "y"}]), "inner dimensions differ: 'a' bf16[8,16] is [..., M, 16] but 'b' bf16[32,8] is [..., 32, N]"),
 ("matmul_rank_1", g(inputs={"a": {"shape": [16], "dtype": "f32"}, "b": {"shape": [16, 4], "dtype": "f32"}},
    ops=[{"op": "matmul", "in": ["a", "b"], "out": "y"}]), "must have rank at least 2"),
 ("conv_channel_mismatch", g(inputs={"x": {"shape": [1, 8, 8, 16], "dtype": "f16"}, "w": {"shape": [32, 3, 3, 8], "dtype": "f16"}},
    ops=[{"op": "conv2d", "in": ["x", "w"], "out": "y"}]), "weight 'w' f16[32,3,3,8] has 8 channels per group but input 'x' f16[1,8,8,16] has 16 channels"),
 ("conv_empty_output", g(inputs={"x": {"shape": [1, 2, 2, 4], "dtype": "f32"}, "w": {"shape": [4, 3, 3, 4], "dtype": "f32"}},
    ops=[{"op": "conv2d", "in": ["x", "w"], "out": "y"}]), "the output would be empty"),
 ("conv_groups_not_dividing", g(inputs={"x": {"shape": [1, 8, 8, 16], "dtype": "f32"}, "w": {"shape": [16, 1, 1, 5], "dtype": "f32"}},
    ops=[{"op": "conv2d", "in": ["x", "w"], "out": "y", "groups": 3}]), "groups 3 must divide both the 16 input channels"),
 ("conv_bad_layout", g(inputs={"x": {"shape": [1, 8, 8, 16], "dtype": "f32"}, "w": {"shape": [16, 1, 1, 16], "dtype": "f32"}},
    ops=[{"op": "conv2d", "in": ["x", "w"], "out": "y", "layout": "NHCW"}]), "attribute 'layout' must be \"NHWC\" or \"NCHW\", got 'NHCW'"),
 ("pool_missing_kernel", g(inputs={"x": {"shape": [1, 8, 8, 3], "dtype": "f32"}}, ops=[{"op": "max_pool2d", "in": ["x"], "out": "y"}]),
  "(max_pool2d): attribute 'kernel' [kh, kw] is required"),
 ("pool_padding_too_large", g(inputs={"x": {"shape": [1, 8, 8, 3], "dtype": "f32"}},
    ops=[{"op": "avg_pool2d", "in": ["x"], "out": "y", "kernel": [3, 3], "padding": [2, 2]}]), "padding 2 exceeds half the kernel size 3 (at most 1)"),
 ("reshape_count_mismatch", g(ops=[{"op": "reshape", "in": ["x"], "out": "y", "shape": [5, 7]}]), "cannot reshape 'x' f32[4,8] (32 elements) to [5,7] (35 elements)"),
 ("transpose_bad_perm", g(ops=[{"op": "transpose", "in": ["x"], "out": "y", "perm": [1, 1]}]), "perm names axis 1 twice"),
 ("layer_norm_weight_shape", g(inputs={"x": {"shape": [4, 8], "dtype": "f32"}, "w": {"shape": [4], "dtype": "f32"}},
    ops=[{"op": "layer_norm", "in": ["x", "w"], "out": "y"}]), "weight 'w' f32[4] must have shape [8]"),
 ("group_norm_missing_groups", g(inputs={"x": {"shape": [2, 4, 8], "dtype": "f32"}}, ops=[{"op": "group_norm", "in": ["x"], "out": "y"}]),
  "(group_norm): attribute 'groups' is required"),
 ("batch_norm_missing_var", g(inputs={"x": {"shape": [2, 8], "dtype": "f32"}, "m": {"shape": [8], "dtype": "f32"}},
    ops=[{"op": "batch_norm", "in": ["x", "m"], "out": "y"}]), "(batch_norm): takes 3 to 5 inputs, got 2"),
 ("bool_read_by_add", g(ops=[{"op": "gt", "in": ["x", 0], "out": "pos"}, {"op": "add", "in": ["pos", "x"], "out": "y"}]),
  "op 1 'y' (add): input 0 'pos' bool[4,8] is bool; bool values may only be read as where's condition, by cast, as sdpa's mask, or through views and concat"),
 ("where_condition_not_bool", g(ops=[{"op": "where", "in": ["x", "x", 0], "out": "y"}]), "op 0 'y' (where): the condition 'x' f32[4,8] must be bool"),
 ("compare_dtype_not_bool", g(ops=[{"op": "lt", "in": ["x", 1], "out": "y", "dtype": "f16"}]), "a comparison's dtype must be bool, got f16"),
 ("cast_without_dtype", g(ops=[{"op": "cast", "in": ["x"], "out": "y"}]), "op 0 'y' (cast): cast requires a dtype"),
 ("scalar_not_finite", g(ops=[{"op": "mul", "in": ["x", 1e39], "out": "y"}]), "scalar constant 1e+39 is not finite in f32"),
 ("scalar_into_matmul", g(ops=[{"op": "matmul", "in": ["x", 2], "out": "y"}]), "(matmul): input 1 is a scalar constant; scalars may only be operands of pointwise ops"),
 ("sdpa_heads_not_multiple", g(inputs={"q": {"shape": [1, 8, 4, 16], "dtype": "f32"}, "k": {"shape": [1, 3, 4, 16], "dtype": "f32"}, "v": {"shape": [1, 3, 4, 16], "dtype": "f32"}},
    ops=[{"op": "sdpa", "in": ["q", "k", "v"], "out": "y"}]), "q's 8 heads are not a multiple of k/v's 3 heads"),
 ("sdpa_mask_shape", g(inputs={"q": {"shape": [1, 2, 4, 16], "dtype": "f32"}, "k": {"shape": [1, 2, 6, 16], "dtype": "f32"}, "v": {"shape": [1, 2, 6, 16], "dtype": "f32"}, "m": {"shape": [4, 4], "dtype": "f32"}},
    ops=[{"op": "sdpa", "in": ["q", "k", "v", "m"], "out": "y"}]), "mask 'm' f32[4,4] does not broadcast to the scores' shape [1,2,4,6]"),
 ("deep_nesting", '{"kiln": 1, "name": ' + "[" * 5000 + "]" * 5000 + "}", "JSON nesting is deeper than 64 levels"),
 ("ops_not_a_list", json.dumps({"kiln": 1, "inputs": X, "ops": {"op": "relu"}, "outputs": ["x"]}), "\"ops\" must be a list, got object"),
 ("operand_not_name_or_number", g(ops=[{"op": "relu", "in": [["x"]], "out": "y"}]), "each entry of \"in\" must be a tensor name or a number, got array"),
 ("slice_bad_axis", g(ops=[{"op": "slice", "in": ["x"], "out": "y", "axis": 2, "start": 0, "end": 2}]),
  "op 0 'y' (slice): axis 2 is out of range for a rank-2 input (valid: -2 to 1)"),
 ("slice_without_axis", g(ops=[{"op": "slice", "in": ["x"], "out": "y", "start": 1}]), "op 0 'y' (slice): attribute 'axis' is required"),
 ("slice_empty", g(ops=[{"op": "slice", "in": ["x"], "out": "y", "axis": 1, "start": 5, "end": 2}]),
  "op 0 'y' (slice): slice [5:2:1] of axis 1 (size 8) of 'x' f32[4,8] is empty"),
 ("slice_zero_step", g(ops=[{"op": "slice", "in": ["x"], "out": "y", "axis": 1, "step": 0}]), "op 0 'y' (slice): step 0 must be >= 1"),
 ("concat_shape_mismatch", g(inputs={"a": {"shape": [4, 8], "dtype": "f32"}, "b": {"shape": [5, 3], "dtype": "f32"}},
    ops=[{"op": "concat", "in": ["a", "b"], "out": "y", "axis": 1}]),
  "op 0 'y' (concat): input 1 'b' f32[5,3] differs from input 0 'a' f32[4,8] at axis 0 (only axis 1 may differ)"),
 ("concat_rank_mismatch", g(inputs={"a": {"shape": [4, 8], "dtype": "f32"}, "b": {"shape": [4, 8, 1], "dtype": "f32"}},
    ops=[{"op": "concat", "in": ["a", "b"], "out": "y", "axis": 0}]), "op 0 'y' (concat): input 1 'b' f32[4,8,1] has rank 3, input 0 'a' f32[4,8] rank 2"),
 ("concat_one_input", g(ops=[{"op": "concat", "in": ["x"], "out": "y", "axis": 0}]), "op 0 'y' (concat): takes 2 to 4096 inputs, got 1"),
 ("concat_without_axis", g(inputs={"a": {"shape": [4], "dtype": "f32"}, "b": {"shape": [4], "dtype": "f32"}},
    ops=[{"op": "concat", "in": ["a", "b"], "out": "y"}]), "op 0 'y' (concat): attribute 'axis' is required"),
 ("expand_incompatible", g(ops=[{"op": "expand", "in": ["x"], "out": "y", "shape": [4, 9]}]),
  "op 0 'y' (expand): cannot expand 'x' f32[4,8] to [4,9]: axis 1 has size 9, which only a size of 1 can be expanded to"),
 ("expand_fewer_dims", g(ops=[{"op": "expand", "in": ["x"], "out": "y", "shape": [8]}]),
  "op 0 'y' (expand): cannot expand 'x' f32[4,8] to [8]: the target has fewer dimensions than the input"),
]
names = [c[0] for c in cases]
assert len(names) == len(set(names))
lines = ["# The malformed-graph corpus: one defect per file. Each must be rejected",
         "# by `kiln validate` with exit status 1 and a message naming the defect",
         "# and where it is; none may crash or hang (expect-exit fails on both).", ""]
for name, text, expected in cases:
    with open(os.path.join(out, name + ".json"), "w") as f:
        f.write(text if text.endswith("\n") or text == "" else text + "\n")
    prefix = name.upper().replace("_", "-")
    check = expected.replace("{{", "{ {")
    lines.append(f"RUN: %expect-exit 1 %kiln validate %S/{name}.json 2>&1 | FileCheck %s --check-prefix={prefix}")
    lines.append(f"{prefix}: kiln: error: {{{{.*}}}}{check}")
    lines.append("")
with open(os.path.join(out, "malformed.test"), "w") as f:
    f.write("\n".join(lines))
print(len(cases), "cases")
