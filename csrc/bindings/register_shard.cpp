#include <cstdint>
#include <limits>
#include <memory>
#include <string>

#include "fastshard/feistel.hpp"
#include "fastshard/mix.hpp"
#include "fastshard/parallel.hpp"
#include "fastshard/shard.hpp"
#include "fastshard/torch_order.hpp"
#include "pybind.hpp"

namespace {

using fastshard::Shard;

fastshard::Order parse_order(const std::string& name) {
    if (name == "feistel") return fastshard::Order::feistel;
    if (name == "identity") return fastshard::Order::identity;
    if (name == "torch") return fastshard::Order::torch;
    throw py::value_error("order must be 'feistel', 'identity' or 'torch', got '" + name + "'");
}

PyShard make(std::uint64_t n, std::uint64_t num_replicas, std::uint64_t rank, bool drop_last,
             bool pad, std::uint64_t cursor, const std::string& order, std::uint64_t seed,
             std::uint64_t epoch) {
    const auto plan = checked_plan(n, num_replicas, rank, drop_last, pad, cursor);
    const auto kind = parse_order(order);
    // Safe without the GIL: only C++ values are involved. The torch order spends O(n) here.
    py::gil_scoped_release release;
    return PyShard{fastshard::make_shard(plan, kind, seed, epoch)};
}

}  // namespace

void register_shard(py::module_& m) {
    py::class_<PyShard>(m, "Shard", "One rank's items of one epoch (immutable).")
        .def(py::init(&make), py::arg("n"), py::arg("num_replicas"), py::arg("rank"),
             py::arg("drop_last"), py::arg("pad"), py::arg("cursor"), py::arg("order"),
             py::arg("seed"), py::arg("epoch"))
        .def("__len__", &PyShard::size)
        .def_property_readonly("num_samples", &PyShard::size)
        .def_property_readonly("total_size", [](const PyShard& s) { return s.shard->plan().total_size; })
        .def_property_readonly("n", [](const PyShard& s) { return s.shard->plan().n; })
        .def_property_readonly("num_replicas", [](const PyShard& s) { return s.shard->plan().num_replicas; })
        .def_property_readonly("rank", [](const PyShard& s) { return s.shard->plan().rank; })
        .def_property_readonly("cursor", [](const PyShard& s) { return s.shard->plan().cursor; })
        .def("position", [](const PyShard& s, std::uint64_t k) {
                 if (k >= s.size()) throw py::index_error("k is out of range");
                 return s.shard->plan().position(k);
             }, py::arg("k"), "Position in the epoch's global sequence of this rank's k-th item.")
        .def("__getitem__", &PyShard::getitem, py::arg("k"))
        .def("indices", &PyShard::indices, py::arg("start"), py::arg("stop"), py::arg("threads") = 0)
        .def("batch", &PyShard::batch, py::arg("start"), py::arg("stop"))
        .def("iter", [](const PyShard& s, std::uint64_t start) {
                 if (start > s.size()) throw py::index_error("start is out of range");
                 return make_shard_iterator(s.shard, start, s.size());
             }, py::arg("start") = 0)
        .def("__iter__", [](const PyShard& s) { return make_shard_iterator(s.shard, 0, s.size()); });

    m.def("feistel_network", [](std::uint64_t n, std::uint64_t seed, std::uint64_t epoch, std::uint64_t table_max,
                                int rounds) {
              if (n > (std::uint64_t{1} << 24)) throw py::value_error("n must be <= 2**24");
              if (table_max > fastshard::Feistel::kTableMax) throw py::value_error("table_max too large");
              if (rounds < 1 || rounds > fastshard::Feistel::kMaxRounds)
                  throw py::value_error("rounds must be in [1, 32]");
              const auto key = fastshard::derive_key(fastshard::kFeistelDomain, n, seed, epoch);
              const fastshard::Feistel perm(n, key, table_max, rounds);
              py::array_t<std::int64_t> out(static_cast<py::ssize_t>(n));
              auto* x = reinterpret_cast<std::uint64_t*>(out.mutable_data());
              for (std::uint64_t i = 0; i < n; ++i) x[i] = i;
              perm.apply(x, static_cast<std::size_t>(n));
              return out;
          }, py::arg("n"), py::arg("seed"), py::arg("epoch"), py::arg("table_max"),
          py::arg("rounds") = fastshard::Feistel::kRounds,
          "The feistel order's permutation of [0, n) with the small-domain table limited to "
          "table_max and the given number of rounds (for studying the bare network; the public "
          "order uses the defaults).");
    m.def("torch_randperm", [](std::uint64_t n, std::uint32_t seed, const std::string& algorithm) {
              fastshard::TorchAlgorithm a = fastshard::TorchAlgorithm::automatic;
              if (algorithm == "fisher_yates") a = fastshard::TorchAlgorithm::fisher_yates;
              else if (algorithm == "inside_out") a = fastshard::TorchAlgorithm::inside_out;
              else if (algorithm != "auto")
                  throw py::value_error("algorithm must be 'auto', 'fisher_yates' or 'inside_out'");
              if (n > (std::uint64_t{1} << 32)) throw py::value_error("n must be <= 2**32");
              if (a == fastshard::TorchAlgorithm::fisher_yates && n == (std::uint64_t{1} << 32))
                  throw py::value_error("fisher_yates needs n < 2**32");
              py::array_t<std::int64_t> out(static_cast<py::ssize_t>(n));
              std::int64_t* data = out.mutable_data();
              {
                  // Safe without the GIL: `out` is not yet visible to Python.
                  py::gil_scoped_release release;
                  fastshard::torch_randperm(data, n, seed, a);
              }
              return out;
          }, py::arg("n"), py::arg("seed"), py::arg("algorithm") = "auto",
          "torch.randperm(n) from torch.Generator().manual_seed(seed), seed in [0, 2**32), "
          "computed without torch; `algorithm` forces one of torch's two (for tests).");
    m.def("plan_lengths", [](std::uint64_t n, std::uint64_t num_replicas, std::uint64_t rank, bool drop_last,
                             bool pad, std::uint64_t cursor) {
              const auto plan = checked_plan(n, num_replicas, rank, drop_last, pad, cursor);
              return py::make_tuple(plan.num_samples, plan.total_size);
          }, py::arg("n"), py::arg("num_replicas"), py::arg("rank"), py::arg("drop_last"), py::arg("pad"),
          py::arg("cursor"), "(num_samples, total_size) of a plan, without building any order.");
    m.def("get_num_threads", &fastshard::default_threads);
    m.def("set_num_threads", [](unsigned t) { fastshard::set_default_threads(t); }, py::arg("threads"));
    m.attr("FEISTEL_ROUNDS") = fastshard::Feistel::kRounds;
    m.attr("FEISTEL_TABLE_MAX") = fastshard::Feistel::kTableMax;
}
