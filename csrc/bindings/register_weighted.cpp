#include <cstdint>
#include <memory>
#include <string>

#include "fastshard/weighted.hpp"
#include "pybind.hpp"

namespace {

using Weights = py::array_t<double, py::array::c_style | py::array::forcecast>;

const double* weights_data(const Weights& w) {
    if (w.ndim() != 1) throw py::value_error("weights must be 1-D");
    return w.data();
}

py::tuple summary_tuple(const fastshard::WeightsSummary& s) {
    return py::make_tuple(s.first_invalid, s.sum, s.positive, s.checksum);
}

// The table of valid weights (nullptr otherwise), built without the GIL.
std::shared_ptr<fastshard::AliasTable> build_table(const double* data, std::uint64_t n,
                                                   const fastshard::WeightsSummary& s,
                                                   std::uint64_t segment) {
    if (s.first_invalid >= 0 || s.positive == 0) return nullptr;
    // Safe without the GIL: the caller holds the weights for the call and only reads them.
    py::gil_scoped_release release;
    try {
        return std::make_shared<fastshard::AliasTable>(data, n, s, segment);
    } catch (const std::invalid_argument& e) {
        py::gil_scoped_acquire acquire;
        throw py::value_error(e.what());
    }
}

fastshard::WeightsSummary summarize(const double* data, std::uint64_t n) {
    // Safe without the GIL: the caller holds the weights for the call and only reads them.
    py::gil_scoped_release release;
    return fastshard::summarize_weights(data, n, 0);
}

}  // namespace

void register_weighted(py::module_& m) {
    m.def("summarize_weights", [](const Weights& w) {
              return summary_tuple(summarize(weights_data(w), static_cast<std::uint64_t>(w.shape(0))));
          }, py::arg("weights"),
          "(first invalid index or -1, sum, number of positive weights, 64-bit checksum); every "
          "field the same for any number of threads.");

    m.def("weights_table", [](const Weights& w) {
              const double* data = weights_data(w);
              const auto n = static_cast<std::uint64_t>(w.shape(0));
              const fastshard::WeightsSummary s = summarize(data, n);
              const auto table = build_table(data, n, s, fastshard::AliasTable::kSweepSegment);
              py::tuple out = summary_tuple(s);
              return py::make_tuple(out[0], out[1], out[2], out[3], table ? py::cast(table) : py::none());
          }, py::arg("weights"),
          "summarize_weights(weights) + (the alias table, or None if the weights are invalid or all "
          "zero): one pass for both.");

    py::class_<fastshard::AliasTable, std::shared_ptr<fastshard::AliasTable>>(
        m, "AliasTable", "Walker alias table of float64 weights (immutable).")
        .def(py::init([](const Weights& w, std::uint64_t segment) {
                 const double* data = weights_data(w);
                 const auto n = static_cast<std::uint64_t>(w.shape(0));
                 const fastshard::WeightsSummary s = summarize(data, n);
                 if (n == 0 || s.first_invalid >= 0 || s.positive == 0)
                     throw py::value_error("weights must be non-empty, finite and >= 0, and one must be positive");
                 return build_table(data, n, s, segment);
             }), py::arg("weights"), py::kw_only(),
             py::arg("_segment") = fastshard::AliasTable::kSweepSegment,
             "`_segment`: items per parallel sweep segment, a multiple of 4096 (for tests).")
        .def(py::pickle(
            [](const fastshard::AliasTable& t) {
                return py::make_tuple(t.size(), py::bytes(static_cast<const char*>(t.data()), t.bytes()));
            },
            [](const py::tuple& state) {
                if (state.size() != 2) throw py::value_error("an AliasTable state is (n, bytes)");
                const auto n = state[0].cast<std::uint64_t>();
                const std::string raw = state[1].cast<std::string>();
                try {
                    return std::make_shared<fastshard::AliasTable>(n, raw.data(), raw.size());
                } catch (const std::invalid_argument& e) {
                    throw py::value_error(e.what());
                }
            }))
        .def("__len__", &fastshard::AliasTable::size)
        .def_property_readonly("nbytes", &fastshard::AliasTable::bytes)
        .def("probability", [](const fastshard::AliasTable& t, std::uint64_t i) {
                 if (i >= t.size()) throw py::index_error("item out of range");
                 return t.probability(i);
             }, py::arg("item"), "The probability the table gives item i (O(n); for tests).")
        .def("_buckets", [](const fastshard::AliasTable& t) {
                 py::array_t<std::uint64_t> threshold(static_cast<py::ssize_t>(t.size()));
                 py::array_t<std::uint64_t> alias(static_cast<py::ssize_t>(t.size()));
                 t.buckets(threshold.mutable_data(), alias.mutable_data());
                 return py::make_tuple(threshold, alias);
             }, "(threshold, alias) of every bucket, copied; threshold 2**32 - 1 keeps the item (for tests).");

    m.def("weighted_shard",
          [](std::shared_ptr<fastshard::AliasTable> table, std::uint64_t draws, std::uint64_t num_replicas,
             std::uint64_t rank, bool drop_last, bool pad, std::uint64_t cursor, std::uint64_t seed,
             std::uint64_t epoch) {
              const auto plan = checked_plan(draws, num_replicas, rank, drop_last, pad, cursor);
              return PyShard{fastshard::make_weighted_shard(plan, std::move(table), seed, epoch)};
          },
          py::arg("table"), py::arg("draws"), py::arg("num_replicas"), py::arg("rank"),
          py::arg("drop_last"), py::arg("pad"), py::arg("cursor"), py::arg("seed"), py::arg("epoch"),
          "A rank's shard of an epoch of `draws` independent draws from the table.");

    m.def("weighted_order_shard",
          [](const Weights& w, std::uint64_t draws, std::uint64_t num_replicas, std::uint64_t rank,
             bool drop_last, bool pad, std::uint64_t cursor, std::uint64_t seed, std::uint64_t epoch) {
              const double* data = weights_data(w);
              const auto n = static_cast<std::uint64_t>(w.shape(0));
              const auto plan = checked_plan(draws, num_replicas, rank, drop_last, pad, cursor);
              std::shared_ptr<const fastshard::Shard> shard;
              {
                  // Safe without the GIL: `w` is held by this call and only read.
                  py::gil_scoped_release release;
                  try {
                      shard = fastshard::make_weighted_order_shard(plan, data, n, seed, epoch);
                  } catch (const std::invalid_argument& e) {
                      py::gil_scoped_acquire acquire;
                      throw py::value_error(e.what());
                  }
              }
              return PyShard{std::move(shard)};
          },
          py::arg("weights"), py::arg("draws"), py::arg("num_replicas"), py::arg("rank"),
          py::arg("drop_last"), py::arg("pad"), py::arg("cursor"), py::arg("seed"), py::arg("epoch"),
          "A rank's shard of the first `draws` items of a weighted random order without replacement.");
}
