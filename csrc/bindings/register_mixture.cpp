#include <cstdint>
#include <memory>
#include <stdexcept>
#include <vector>

#include "fastshard/mixture.hpp"
#include "pybind.hpp"

namespace {

using fastshard::MixtureSpec;

std::shared_ptr<MixtureSpec> make_spec(std::vector<std::uint64_t> sizes, std::vector<std::uint64_t> units,
                                       std::uint64_t draws, std::uint64_t period) {
    try {
        return std::make_shared<MixtureSpec>(std::move(sizes), std::move(units), draws, period);
    } catch (const std::invalid_argument& e) {
        throw py::value_error(e.what());
    }
}

}  // namespace

void register_mixture(py::module_& m) {
    py::class_<MixtureSpec, std::shared_ptr<MixtureSpec>>(
        m, "MixtureSpec", "A mixture's datasets, integer weights, draws per epoch and windows (immutable).")
        .def(py::init(&make_spec), py::arg("sizes"), py::arg("units"), py::arg("draws"), py::arg("period"),
             "units: integer weights (sum below 2**64); period 0 takes the default.")
        .def_property_readonly("sizes", &MixtureSpec::sizes)
        .def_property_readonly("units", &MixtureSpec::units)
        .def_property_readonly("offsets", &MixtureSpec::offsets)
        .def_property_readonly("per_epoch", &MixtureSpec::per_epoch, "Draws of each dataset per epoch.")
        .def_property_readonly("draws", &MixtureSpec::draws)
        .def_property_readonly("period", &MixtureSpec::period)
        .def_property_readonly("windows", &MixtureSpec::windows)
        .def_property_readonly("min_window", &MixtureSpec::min_window)
        .def("boundary", [](const MixtureSpec& s, std::uint64_t i) {
                 if (i > s.windows()) throw py::index_error("window boundary out of range");
                 return s.boundary(i);
             }, py::arg("i"), "Draws before window i (i in [0, windows]).")
        .def("cumulative", [](const MixtureSpec& s, std::uint64_t t) {
                 if (t > s.draws()) throw py::index_error("t must be in [0, draws]");
                 std::vector<std::uint64_t> out(s.k()), scratch;
                 s.cumulative(t, out.data(), scratch);
                 return out;
             }, py::arg("t"), "Each dataset's cumulative count after t draws (exact at window boundaries).");

    m.def("mixture_shard",
          [](std::shared_ptr<MixtureSpec> spec, std::uint64_t num_replicas, std::uint64_t rank, bool drop_last,
             bool pad, std::uint64_t cursor, std::uint64_t seed, std::uint64_t epoch) {
              const auto plan = checked_plan(spec->draws(), num_replicas, rank, drop_last, pad, cursor);
              return PyShard{fastshard::make_mixture_shard(plan, std::move(spec), seed, epoch)};
          },
          py::arg("spec"), py::arg("num_replicas"), py::arg("rank"), py::arg("drop_last"), py::arg("pad"),
          py::arg("cursor"), py::arg("seed"), py::arg("epoch"),
          "A rank's shard of an epoch of the mixture's draws (indices into the concatenated datasets).");
}
