#include <cstdint>
#include <memory>
#include <stdexcept>
#include <tuple>
#include <utility>
#include <vector>

#include "fastshard/mixture.hpp"
#include "fastshard/schedule.hpp"
#include "pybind.hpp"

namespace {

using fastshard::Bridge;
using fastshard::HeldValue;
using fastshard::MixtureSchedule;
using fastshard::MixtureSpec;
using fastshard::StreamStart;
using fastshard::u128;

using StartTuple = std::tuple<std::uint64_t, std::uint64_t, std::uint64_t, std::uint64_t>;

// A 128-bit value as a Python int (pybind11 has no caster for it).
py::int_ to_int(u128 v) {
    const py::int_ hi(static_cast<std::uint64_t>(v >> 64)), lo(static_cast<std::uint64_t>(v));
    return py::int_(hi.attr("__lshift__")(64).attr("__or__")(lo));
}

std::shared_ptr<MixtureSchedule> make_schedule(std::vector<std::uint64_t> sizes, std::vector<std::uint64_t> draws_at,
                                               std::vector<std::uint64_t> units, std::uint64_t unit_total,
                                               std::uint64_t draws, std::uint64_t period, std::uint64_t seed,
                                               std::uint64_t anchor, std::vector<std::uint64_t> anchor_counts,
                                               const std::vector<StartTuple>& starts,
                                               const std::vector<std::vector<std::pair<std::uint64_t, std::uint64_t>>>& held) {
    std::vector<StreamStart> st;
    for (const auto& t : starts) st.push_back(StreamStart{std::get<0>(t), std::get<1>(t), std::get<2>(t), std::get<3>(t)});
    std::vector<std::vector<HeldValue>> hv;
    for (const auto& list : held) {
        hv.emplace_back();
        for (const auto& [n, v] : list) hv.back().push_back(HeldValue{n, v});
    }
    try {
        return std::make_shared<MixtureSchedule>(std::move(sizes), std::move(draws_at), std::move(units), unit_total,
                                                 draws, period, seed, anchor, std::move(anchor_counts), std::move(st),
                                                 std::move(hv));
    } catch (const std::invalid_argument& e) {
        throw py::value_error(e.what());
    }
}

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
        .def("window_of", [](const MixtureSpec& s, std::uint64_t j) {
                 if (j >= s.draws()) throw py::index_error("j must be in [0, draws)");
                 return s.window_of(j);
             }, py::arg("j"), "The window holding draw j of an epoch.")
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

    py::class_<MixtureSchedule, std::shared_ptr<MixtureSchedule>>(
        m, "MixtureSchedule", "A mixture whose weights follow a schedule of global draws (immutable).")
        .def(py::init(&make_schedule), py::arg("sizes"), py::arg("draws_at"), py::arg("units"),
             py::arg("unit_total"), py::arg("draws"), py::arg("period"), py::arg("seed"), py::arg("anchor"),
             py::arg("anchor_counts"), py::arg("starts"), py::arg("held"))
        .def_property_readonly("sizes", &MixtureSchedule::sizes)
        .def_property_readonly("offsets", &MixtureSchedule::offsets)
        .def_property_readonly("draws", &MixtureSchedule::draws)
        .def_property_readonly("period", &MixtureSchedule::period)
        .def_property_readonly("windows", &MixtureSchedule::windows)
        .def_property_readonly("anchor", &MixtureSchedule::anchor)
        .def_property_readonly("first_boundary", &MixtureSchedule::first_boundary)
        .def("window_of", [](const MixtureSchedule& s, std::uint64_t j) {
                 if (j >= s.draws()) throw py::index_error("j must be in [0, draws)");
                 return s.window_of(j);
             }, py::arg("j"), "The window holding draw j of an epoch.")
        .def("boundary_draw", &MixtureSchedule::boundary_draw, py::arg("i"),
             "Global draw of boundary index i (epoch * windows + m).")
        .def("targets", [](const MixtureSchedule& s, std::uint64_t g) {
                 if (g < s.anchor()) throw py::value_error("g must be >= the anchor");
                 MixtureSchedule::Targets t;
                 s.targets(g, t);
                 py::list num;
                 for (u128 v : t.num) num.append(to_int(v));
                 return py::make_tuple(t.whole, num, to_int(t.den));
             }, py::arg("g"), "Exact targets at global draw g: (whole parts, numerators, denominator).")
        .def("boundary_counts", [](const MixtureSchedule& s, std::uint64_t i) {
                 if (i + 1 < s.first_boundary()) throw py::value_error("boundary before the anchor");
                 MixtureSchedule::Cache cache;
                 std::vector<std::uint64_t> out(s.k());
                 s.boundary_counts(i, cache, out.data());
                 return out;
             }, py::arg("i"))
        .def("counts_at", [](const MixtureSchedule& s, std::uint64_t g) {
                 if (g < s.anchor()) throw py::value_error("g must be >= the anchor");
                 std::vector<std::uint64_t> out(s.k());
                 s.counts_at(g, out.data());
                 return out;
             }, py::arg("g"), "Each dataset's count after g global draws (g >= the anchor).")
        .def("stream", [](const MixtureSchedule& s, std::size_t c, std::uint64_t x) {
                 if (c >= s.k()) throw py::index_error("dataset out of range");
                 std::uint64_t pos = 0, key = 0;
                 s.locate(c, x, pos, key);
                 return py::make_tuple(pos, key);
             }, py::arg("c"), py::arg("x"), "(position, key) of dataset c's draw x since the anchor.");

    py::class_<Bridge, std::shared_ptr<Bridge>>(
        m, "MixtureBridge", "The mixture a run drew from before it took new weights (immutable).")
        .def_static("fixed", [](std::shared_ptr<MixtureSpec> spec, std::uint64_t seed, std::uint64_t from) {
                        auto b = std::make_shared<Bridge>();
                        b->spec = std::move(spec);
                        b->seed = seed;
                        b->from = from;
                        return b;
                    }, py::arg("spec"), py::arg("seed"), py::arg("from_draw"))
        .def_static("scheduled", [](std::shared_ptr<MixtureSchedule> schedule, std::shared_ptr<Bridge> inner,
                                    std::uint64_t from) {
                        auto b = std::make_shared<Bridge>();
                        b->schedule = std::move(schedule);
                        b->inner = std::move(inner);
                        b->from = from;
                        return b;
                    }, py::arg("schedule"), py::arg("inner"), py::arg("from_draw"));

    m.def("schedule_shard",
          [](std::shared_ptr<MixtureSchedule> schedule, std::uint64_t num_replicas, std::uint64_t rank,
             bool drop_last, bool pad, std::uint64_t cursor, std::uint64_t epoch, std::shared_ptr<Bridge> bridge) {
              const auto plan = checked_plan(schedule->draws(), num_replicas, rank, drop_last, pad, cursor);
              try {
                  return PyShard{fastshard::make_schedule_shard(plan, std::move(schedule), epoch, std::move(bridge))};
              } catch (const std::invalid_argument& e) {
                  throw py::value_error(e.what());
              }
          },
          py::arg("schedule"), py::arg("num_replicas"), py::arg("rank"), py::arg("drop_last"), py::arg("pad"),
          py::arg("cursor"), py::arg("epoch"), py::arg("bridge") = nullptr,
          "A rank's shard of an epoch of a scheduled mixture.");

    m.def("mixture_stand",
          [](std::shared_ptr<MixtureSpec> spec, std::uint64_t seed, std::uint64_t epoch, std::uint64_t j) {
              std::vector<std::uint64_t> counts;
              std::vector<StreamStart> starts;
              try {
                  fastshard::mixture_stand(std::move(spec), seed, epoch, j, counts, starts);
              } catch (const std::invalid_argument& e) {
                  throw py::value_error(e.what());
              }
              std::vector<StartTuple> out;
              for (const auto& s : starts) out.emplace_back(s.key, s.from, s.len, s.base);
              return py::make_tuple(counts, out);
          },
          py::arg("spec"), py::arg("seed"), py::arg("epoch"), py::arg("j"),
          "Where each dataset of a fixed-weight mixture stands after j draws of an epoch: "
          "(counts, stream starts (key, from, len, base)).");

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
