#include "compiler/graph_hash.h"

#include <fmt/format.h>

#include <algorithm>

#include "compiler/error.h"
#include "compiler/symbolic_dims.h"

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace kiln::ir {
namespace {

constexpr int kRefinementRounds = 3;

void add_attribute_value(HashBuilder& h, const std::optional<AttrValue>& value) {
  if (!value) {
    h.add(int64_t{-1});
    return;
  }
  h.add(static_cast<int64_t>(value->index()));
  std::visit(
      [&](const auto& v) {
        using V = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<V, bool>) h.add(int64_t{v});
        else if constexpr (std::is_same_v<V, std::vector<int64_t>>) {
          h.add(static_cast<int64_t>(v.size()));
          for (int64_t e : v) h.add(e);
        } else if constexpr (std::is_same_v<V, std::vector<DimSize>>) {
          KILN_INTERNAL_CHECK(false);  // resolved attributes hold integers; expressions are in op.symbolic
        } else h.add(v);
      },
      *value);
}

void add_type(HashBuilder& h, const Tensor& t) {
  h.add(static_cast<int64_t>(t.dtype)).add(static_cast<int64_t>(t.shape.size()));
  if (t.symbolic) {  // every dimension as its expression
    h.add(std::string_view("symbolic")).add(int64_t{t.symbolic->strides_declared});
    for (const DimExpr& d : t.symbolic->dims) h.add(std::string_view(to_string(d)));
    return;
  }
  for (int64_t d : t.shape) h.add(d);
}

// reshape's and expand's shape, slice's bounds, where they hold symbols.
void add_symbolic_attrs(HashBuilder& h, const Op& op) {
  if (!op.symbolic) return;
  h.add(std::string_view("symbolic attrs"));
  for (const DimExpr& d : op.symbolic->shape) h.add(std::string_view(to_string(d)));
  for (const std::optional<SlicePosition>& p : {op.symbolic->start, op.symbolic->end}) {
    h.add(int64_t{p.has_value()});
    if (!p) continue;
    h.add(std::string_view(p->term ? to_string(*p->term) : "")).add(p->offset);
  }
}

// The `dims` table, by symbol name (the document's order does not matter).
void add_dims(HashBuilder& h, const Graph& g) {
  if (!g.dims) return;
  std::vector<DimSymbol> symbols = g.dims->symbols;
  std::sort(symbols.begin(), symbols.end(), [](const DimSymbol& a, const DimSymbol& b) { return a.name < b.name; });
  h.add(std::string_view("dims"));
  for (const DimSymbol& s : symbols) h.add(std::string_view(s.name)).add(s.min).add(s.max).add(s.multiple_of);
}

class Canonicalizer {
 public:
  explicit Canonicalizer(const Graph& g) : g_(g), down_(g.tensors.size()), up_(g.tensors.size()),
                                            label_(g.tensors.size()) {}

  Hash128 run() {
    for (int round = 0; round < kRefinementRounds; ++round) {
      compute_down();
      compute_up();
      for (TensorId id : g_.inputs)
        label_[static_cast<size_t>(id)] = HashBuilder().add(down_[static_cast<size_t>(id)]).add(up_[static_cast<size_t>(id)]).digest();
    }
    compute_down();
    std::vector<Hash128> all;
    for (size_t id = 0; id < g_.tensors.size(); ++id) {
      const Tensor& t = g_.tensors[id];
      if (t.kind == TensorKind::Constant) continue;
      all.push_back(HashBuilder().add(down_[id]).add(int64_t{t.is_output}).digest());
    }
    std::sort(all.begin(), all.end());
    HashBuilder h;
    h.add(std::string_view("kiln-graph-v1"));
    for (const Hash128& x : all) h.add(x);
    add_dims(h, g_);
    return h.digest();
  }

 private:
  void compute_down() {
    for (size_t id = 0; id < g_.tensors.size(); ++id) {
      const Tensor& t = g_.tensors[id];
      HashBuilder h;
      switch (t.kind) {
        case TensorKind::Input:
          h.add(std::string_view("input"));
          add_type(h, t);
          for (int64_t s : t.strides) h.add(s);
          h.add(label_[id]);
          down_[id] = h.digest();
          break;
        case TensorKind::Constant:
          h.add(std::string_view("constant")).add(static_cast<double>(t.constant));
          down_[id] = h.digest();
          break;
        case TensorKind::OpResult:
          break;  // in op order below, so operands are ready
      }
    }
    for (const Op& op : g_.ops) {
      HashBuilder h;
      h.add(std::string_view("op")).add(static_cast<int64_t>(op.kind)).add(int64_t{op.explicit_dtype});
      add_type(h, g_.tensor(op.output));
      for (int k = 0; k < kAttrKeyCount; ++k) {
        const auto key = static_cast<AttrKey>(k);
        if (op_info(op.kind).attrs & attr_bit(key)) add_attribute_value(h, attr_value(op.attrs, key));
      }
      add_symbolic_attrs(h, op);
      for (TensorId in : op.inputs) h.add(down_[static_cast<size_t>(in)]);
      down_[static_cast<size_t>(op.output)] = h.digest();
    }
  }

  // A tensor's uses: for each (op, slot) reading it, the op's own hash and
  // its result's uses. Consumers always have larger ids, so go backwards.
  void compute_up() {
    for (size_t id = g_.tensors.size(); id-- > 0;) {
      std::vector<Hash128> uses;
      for (int32_t user : g_.users[id]) {
        const Op& op = g_.ops[static_cast<size_t>(user)];
        for (size_t slot = 0; slot < op.inputs.size(); ++slot) {
          if (op.inputs[slot] != static_cast<TensorId>(id)) continue;
          const auto out = static_cast<size_t>(op.output);
          uses.push_back(HashBuilder().add(static_cast<int64_t>(slot)).add(down_[out]).add(up_[out]).digest());
        }
      }
      std::sort(uses.begin(), uses.end());
      HashBuilder h;
      h.add(int64_t{g_.tensors[id].is_output});
      for (const Hash128& u : uses) h.add(u);
      up_[id] = h.digest();
    }
  }

  const Graph& g_;
  std::vector<Hash128> down_, up_, label_;
};

}  // namespace

std::string Hash128::hex() const { return fmt::format("{:016x}{:016x}", high, low); }

std::optional<Hash128> Hash128::from_hex(std::string_view hex) {
  if (hex.size() != 32 || hex.find_first_not_of("0123456789abcdef") != std::string_view::npos) return std::nullopt;
  return Hash128{std::stoull(std::string(hex.substr(0, 16)), nullptr, 16), std::stoull(std::string(hex.substr(16)), nullptr, 16)};
}

HashBuilder& HashBuilder::add_bytes(const void* data, size_t size) {
  bytes_.append(static_cast<const char*>(data), size);
  return *this;
}

HashBuilder& HashBuilder::add(std::string_view text) {
  add(static_cast<int64_t>(text.size()));
  return add_bytes(text.data(), text.size());
}

Hash128 HashBuilder::digest() const {
  XXH128_hash_t h = XXH3_128bits(bytes_.data(), bytes_.size());
  return {h.high64, h.low64};
}

Hash128 graph_hash(const Graph& graph) { return Canonicalizer(graph).run(); }

}  // namespace kiln::ir
