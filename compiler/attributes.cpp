#include "compiler/attributes.h"

#include <fmt/format.h>

#include <cstdlib>

namespace kiln::ir {

std::string_view to_string(Precision p) {
  switch (p) {
    case Precision::f32: return "f32";
    case Precision::tf32: return "tf32";
    case Precision::bf16: return "bf16";
    case Precision::f16: return "f16";
  }
  return "?";
}

std::string_view to_string(Layout l) {
  switch (l) {
    case Layout::NHWC: return "NHWC";
    case Layout::NCHW: return "NCHW";
  }
  return "?";
}

std::string score_rounding_text(DType to, uint8_t roundings) {
  std::string at;
  for (const auto& [bit, name] : {std::pair{kRoundProduct, "q·kᵀ"}, {kRoundScaled, "scaled"}, {kRoundMasked, "masked"},
                                       {kRoundMasked2, "masked again"}})
    if (roundings & bit) at += fmt::format("{}{}", at.empty() ? "" : ", ", name);
  return fmt::format("{} ({})", to_string(to), at);
}

double printable(float value) {
  const std::string text = fmt::format("{}", value);
  return std::strtod(text.c_str(), nullptr);
}

std::optional<AttrValue> attr_value(const Attributes& a, AttrKey key) {
  auto pair = [](const std::array<int64_t, 2>& p) { return AttrValue(std::vector<int64_t>{p[0], p[1]}); };
  switch (key) {
    case AttrKey::alpha: return AttrValue(printable(a.alpha));
    case AttrKey::min: return a.min ? std::optional<AttrValue>(printable(*a.min)) : std::nullopt;
    case AttrKey::max: return a.max ? std::optional<AttrValue>(printable(*a.max)) : std::nullopt;
    case AttrKey::axes: return AttrValue(a.axes);
    case AttrKey::keepdims: return AttrValue(a.keepdims);
    case AttrKey::axis: return AttrValue(a.axis);
    case AttrKey::eps: return AttrValue(printable(a.eps));
    case AttrKey::groups: return AttrValue(a.groups);
    case AttrKey::precision: return AttrValue(std::string(to_string(a.precision)));
    case AttrKey::layout: return AttrValue(std::string(to_string(a.layout)));
    case AttrKey::stride: return pair(a.stride);
    case AttrKey::padding: return pair(a.padding);
    case AttrKey::dilation: return pair(a.dilation);
    case AttrKey::kernel: return pair(a.kernel);
    case AttrKey::count_include_pad: return AttrValue(a.count_include_pad);
    case AttrKey::perm: return AttrValue(a.perm);
    case AttrKey::shape: return AttrValue(a.shape);
    case AttrKey::causal: return AttrValue(a.causal);
    case AttrKey::scale: return AttrValue(printable(a.scale));
    case AttrKey::start: return AttrValue(a.start);
    case AttrKey::end: return AttrValue(a.end);
    case AttrKey::step: return AttrValue(a.step);
  }
  return std::nullopt;
}

}  // namespace kiln::ir
