// Inputs drawn as `kiln run --random SEED` draws them (cli.md): normal(0,1)
// for floating inputs, except an input read as batch_norm's `var`, drawn as
// |normal(0,1)| + 0.5; bool inputs true with p = 0.5. Values are rounded to
// each input's dtype. The same seed gives the same values on every machine
// (mt19937_64 and a Box-Muller transform written out here, not the library's
// implementation-defined distributions), one stream per input, the inputs
// drawn on several threads. An input declared with stride 0 along an axis
// holds one stored value along it, so it is drawn that way.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kiln/graph.h"
#include "kiln/host_tensor.h"

namespace kiln {

std::vector<HostTensor> random_inputs(const Graph& graph, uint64_t seed);

// Where values given for input `desc` cannot be what its layout stores
// (different values along an axis declared with stride 0, which the device
// holds once): the first such element, in words; empty when they can.
std::string stored_layout_problem(const TensorDesc& desc, const HostTensor& values);

}  // namespace kiln
