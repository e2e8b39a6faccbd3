// Length-grouped batches (fastshard/length.hpp): the lengths are read in place, never copied.
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "fastshard/length.hpp"
#include "lengths_arg.hpp"
#include "pybind.hpp"

namespace {

// What does not depend on the epoch, with the array its view reads.
struct PyLengthLayout {
    py::array owner;
    std::shared_ptr<const fastshard::LengthLayout> layout;
};

// An epoch's batches, with the array its view reads.
struct PyLengthEpoch {
    py::array owner;
    std::shared_ptr<const fastshard::LengthEpoch> epoch;
};

PyLengthLayout make_layout(const py::array& a, std::uint64_t batch_size, std::uint64_t max_tokens,
                           std::uint64_t max_batch_size, std::uint64_t window, std::uint64_t min_class_items) {
    const LengthsView arg = lengths_arg(a);
    const fastshard::BatchRule rule{batch_size, max_tokens, max_batch_size};
    std::shared_ptr<const fastshard::LengthLayout> layout;
    {
        // Safe without the GIL: the array is held by this call and only read.
        py::gil_scoped_release release;
        layout = std::make_shared<const fastshard::LengthLayout>(arg.view, rule, window, 0, min_class_items);
    }
    return PyLengthLayout{arg.owner, std::move(layout)};
}

PyLengthEpoch make_epoch(const PyLengthLayout& l, std::uint64_t seed, std::uint64_t epoch) {
    std::shared_ptr<const fastshard::LengthEpoch> e;
    {
        // Safe without the GIL: `l` (and its array) is held by the caller and only read.
        py::gil_scoped_release release;
        e = std::make_shared<const fastshard::LengthEpoch>(l.layout, seed, epoch, 0);
    }
    return PyLengthEpoch{l.owner, std::move(e)};
}

struct PyLengthShard {
    py::array owner;
    std::shared_ptr<const fastshard::LengthShard> shard;

    void check(std::uint64_t k) const {
        if (k >= shard->size())
            throw py::index_error("batch " + std::to_string(k) + " is out of range for a shard of " +
                                  std::to_string(shard->size()) + " batches");
    }
};

py::list to_list(const std::vector<std::uint64_t>& items) {
    py::list out(items.size());
    for (std::size_t i = 0; i < items.size(); ++i)
        out[i] = py::reinterpret_steal<py::object>(PyLong_FromUnsignedLongLong(items[i]));
    return out;
}

}  // namespace

void register_length(py::module_& m) {
    m.attr("LENGTH_DOMAIN") = fastshard::kLengthDomain;

    m.def("scan_lengths", [](const py::array& a) {
              const LengthsView arg = lengths_arg(a);
              fastshard::LengthsSummary s;
              {
                  // Safe without the GIL: `a` is held by this call and only read.
                  py::gil_scoped_release release;
                  s = fastshard::scan_lengths(arg.view, 0);
              }
              return py::make_tuple(s.first_negative, s.max, s.sum, s.checksum);
          }, py::arg("lengths"),
          "(first negative index or -1, max, sum as a float, 64-bit checksum) of a 1-D contiguous "
          "integer array, in one threaded pass; the same for any number of threads and for equal "
          "values in any integer dtype.");

    py::class_<PyLengthLayout>(m, "LengthLayout",
                               "What does not depend on the epoch: windows, length classes and each "
                               "window's batch count (immutable). The lengths must have been checked "
                               "non-negative (scan_lengths).")
        .def(py::init(&make_layout), py::arg("lengths"), py::arg("batch_size"), py::arg("max_tokens"),
             py::arg("max_batch_size"), py::arg("window"), py::arg("min_class_items") = 0,
             "Exactly one of batch_size and max_tokens > 0 (max_batch_size 0: no limit); "
             "min_class_items 0: the default class merging (for measurements).")
        .def_property_readonly("num_batches", [](const PyLengthLayout& l) { return l.layout->num_batches(); })
        .def_property_readonly("num_windows", [](const PyLengthLayout& l) { return l.layout->num_windows(); })
        .def_property_readonly("num_classes", [](const PyLengthLayout& l) { return l.layout->num_classes(); })
        .def_property_readonly("per_stratum",
                               [](const PyLengthLayout& l) { return l.layout->strata().per_stratum(); })
        .def("window_offset", [](const PyLengthLayout& l, std::uint64_t w) {
                 if (w > l.layout->num_windows()) throw py::index_error("window out of range");
                 return l.layout->window_offset(w);
             }, py::arg("window"), "The number of batches of the windows before `window`.")
        .def("classes", [](const PyLengthLayout& l) {
                 py::list out;
                 for (std::uint32_t b = 0; b < l.layout->num_classes(); ++b)
                     out.append(py::make_tuple(l.layout->class_count(b), l.layout->class_upper(b)));
                 return out;
             }, "(items, largest rule length) of each length class, in length order (max_tokens only).");

    py::class_<PyLengthEpoch>(m, "LengthEpoch", "An epoch's length-grouped batches (immutable).")
        .def(py::init(&make_epoch), py::arg("layout"), py::arg("seed"), py::arg("epoch"))
        .def(py::init([](const py::array& a, std::uint64_t batch_size, std::uint64_t max_tokens,
                         std::uint64_t max_batch_size, std::uint64_t window, std::uint64_t seed,
                         std::uint64_t epoch) {
                 return make_epoch(make_layout(a, batch_size, max_tokens, max_batch_size, window, 0), seed, epoch);
             }),
             py::arg("lengths"), py::arg("batch_size"), py::arg("max_tokens"), py::arg("max_batch_size"),
             py::arg("window"), py::arg("seed"), py::arg("epoch"),
             "A layout and its epoch in one call. Exactly one of batch_size and max_tokens > 0.")
        .def_property_readonly("num_batches", [](const PyLengthEpoch& e) { return e.epoch->num_batches(); })
        .def_property_readonly("num_windows", [](const PyLengthEpoch& e) { return e.epoch->layout().num_windows(); })
        .def("window_offset", [](const PyLengthEpoch& e, std::uint64_t w) {
                 if (w > e.epoch->layout().num_windows()) throw py::index_error("window out of range");
                 return e.epoch->layout().window_offset(w);
             }, py::arg("window"), "The number of batches of the windows before `window`.");

    m.def("length_shard",
          [](const PyLengthEpoch& e, std::uint64_t num_replicas, std::uint64_t rank, bool drop_last,
             std::uint64_t cursor, bool pad) {
              const auto plan = checked_plan(e.epoch->num_batches(), num_replicas, rank, drop_last, pad, cursor);
              return PyLengthShard{e.owner, std::make_shared<const fastshard::LengthShard>(e.epoch, plan)};
          },
          py::arg("epoch"), py::arg("num_replicas"), py::arg("rank"), py::arg("drop_last"), py::arg("cursor"),
          py::arg("pad") = true,
          "A rank's batches of the epoch through the shared plan (pad=True: every rank the same count).");

    py::class_<PyLengthShard>(m, "LengthShard", "A rank's length-grouped batches of one epoch.")
        .def("__len__", [](const PyLengthShard& s) { return s.shard->size(); })
        .def_property_readonly("num_samples", [](const PyLengthShard& s) { return s.shard->plan().num_samples; })
        .def_property_readonly("total_size", [](const PyLengthShard& s) { return s.shard->plan().total_size; })
        .def("position", [](const PyLengthShard& s, std::uint64_t k) {
                 s.check(k);
                 return s.shard->global(k);
             }, py::arg("k"), "The global batch (index into the epoch's batch sequence) of batch k.")
        .def("batch", [](const PyLengthShard& s, std::uint64_t k) {
                 s.check(k);
                 std::vector<std::uint64_t> items;
                 {
                     // Safe without the GIL: the shard guards its window cache with a mutex.
                     py::gil_scoped_release release;
                     s.shard->global_batch(s.shard->global(k), items);
                 }
                 return to_list(items);
             }, py::arg("k"), "This rank's k-th batch: a list of item indices.")
        .def("global_batch", [](const PyLengthShard& s, std::uint64_t g) {
                 if (g >= s.shard->plan().n) throw py::index_error("global batch out of range");
                 std::vector<std::uint64_t> items;
                 {
                     py::gil_scoped_release release;
                     s.shard->global_batch(g, items);
                 }
                 return to_list(items);
             }, py::arg("g"), "Batch g of the epoch's global batch sequence.");
}
