// Packed rows (fastshard/packed.hpp): the lengths are read in place, never copied.
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "fastshard/packed.hpp"
#include "lengths_arg.hpp"
#include "pybind.hpp"

namespace {

// An epoch's rows (concat or best_fit), with the array its view reads.
struct PyRows {
    py::array owner;
    std::shared_ptr<const fastshard::RowSource> rows;
    std::shared_ptr<const void> keep;  // the best_fit layout the epoch reads
};

struct PyPackLayout {
    py::array owner;
    std::shared_ptr<const fastshard::PackLayout> layout;
};

struct PyPackedShard {
    py::array owner;
    std::shared_ptr<const fastshard::PackedShard> shard;
    std::shared_ptr<const void> keep;
};

// Segments as a new (k, 3) int64 array: one buffer, cheap to pickle to a DataLoader worker.
py::array_t<std::int64_t> to_array(const fastshard::Segments& s) {
    const auto k = static_cast<py::ssize_t>(s.size() / 3);
    py::array_t<std::int64_t> out({k, py::ssize_t{3}});
    auto* p = out.mutable_data();
    for (std::size_t i = 0; i < s.size(); ++i) p[i] = static_cast<std::int64_t>(s[i]);
    return out;
}

py::array_t<std::int64_t> row_of(const PyPackedShard& s, std::uint64_t g) {
    fastshard::Segments seg;
    {
        // Safe without the GIL: the shard guards its window cache with a mutex.
        py::gil_scoped_release release;
        s.shard->global_row(g, seg);
    }
    return to_array(seg);
}

}  // namespace

void register_packed(py::module_& m) {
    m.attr("PACKED_DOMAIN") = fastshard::kPackedDomain;

    m.def("scan_packed", [](const py::array& a, std::uint64_t seq_len, bool best_fit, bool split, bool checksum) {
              const LengthsView arg = lengths_arg(a);
              fastshard::PackedScan s;
              {
                  // Safe without the GIL: `a` is held by this call and only read.
                  py::gil_scoped_release release;
                  s = fastshard::scan_packed(arg.view, seq_len, best_fit, split, 0, checksum);
              }
              return py::make_tuple(s.first_nonpositive, s.total, s.total_overflow, s.full_pieces,
                                    s.truncated_tokens, s.checksum);
          }, py::arg("lengths"), py::arg("seq_len"), py::arg("best_fit") = false, py::arg("split") = false,
          py::arg("checksum") = false,
          "(first index of a length <= 0 or -1, total tokens, whether the total overflowed 64 bits, "
          "full pieces of split documents, truncated tokens, the lengths checksum of scan_lengths or 0 "
          "without `checksum`) in one threaded pass.");

    py::class_<PyPackLayout>(m, "PackLayout", "best_fit: classes and every window's row count (immutable).")
        .def(py::init([](const py::array& a, std::uint64_t seq_len, bool split, std::uint64_t window,
                         std::uint64_t min_class_items) {
                 const LengthsView arg = lengths_arg(a);
                 std::shared_ptr<const fastshard::PackLayout> layout;
                 {
                     // Safe without the GIL: the array is held by this call and only read.
                     py::gil_scoped_release release;
                     layout = std::make_shared<const fastshard::PackLayout>(arg.view, seq_len, split, window, 0,
                                                                            min_class_items);
                 }
                 return PyPackLayout{arg.owner, std::move(layout)};
             }),
             py::arg("lengths"), py::arg("seq_len"), py::arg("split"), py::arg("window"),
             py::arg("min_class_items") = 0)
        .def_property_readonly("num_rows", [](const PyPackLayout& l) { return l.layout->num_rows(); })
        .def_property_readonly("packed_rows", [](const PyPackLayout& l) { return l.layout->packed_rows(); })
        .def_property_readonly("full_rows", [](const PyPackLayout& l) { return l.layout->full_rows(); })
        .def_property_readonly("num_windows", [](const PyPackLayout& l) { return l.layout->num_windows(); })
        .def_property_readonly("num_classes", [](const PyPackLayout& l) { return l.layout->num_classes(); })
        .def_property_readonly("per_stratum",
                               [](const PyPackLayout& l) { return l.layout->strata().per_stratum(); })
        .def_property_readonly("packed_tokens", [](const PyPackLayout& l) { return l.layout->packed_tokens(); })
        .def_property_readonly("truncated_tokens",
                               [](const PyPackLayout& l) { return l.layout->truncated_tokens(); });

    py::class_<PyRows>(m, "PackedEpoch", "An epoch's rows, concat or best_fit (immutable).")
        .def_property_readonly("num_rows", [](const PyRows& r) { return r.rows->num_rows(); });

    m.def("concat_epoch",
          [](const py::array& a, std::uint64_t seq_len, bool overlap, std::uint64_t window, std::uint64_t seed,
             std::uint64_t epoch) {
              const LengthsView arg = lengths_arg(a);
              std::shared_ptr<const fastshard::RowSource> rows;
              {
                  // Safe without the GIL: the array is held by this call and only read.
                  py::gil_scoped_release release;
                  rows = std::make_shared<const fastshard::ConcatEpoch>(arg.view, seq_len, overlap, window, seed,
                                                                        epoch, 0);
              }
              return PyRows{arg.owner, std::move(rows), nullptr};
          },
          py::arg("lengths"), py::arg("seq_len"), py::arg("overlap"), py::arg("window"), py::arg("seed"),
          py::arg("epoch"), "concat rows of an epoch: one threaded scan of the epoch's order. Lengths >= 1.");

    m.def("concat_start",
          [](const py::array& a, std::uint64_t seq_len, bool overlap, std::uint64_t window, std::uint64_t seed,
             std::uint64_t epoch) {
              const LengthsView arg = lengths_arg(a);
              fastshard::ConcatStart start;
              {
                  // Safe without the GIL: the array is held by this call and only read.
                  py::gil_scoped_release release;
                  start = fastshard::concat_start(arg.view, seq_len, overlap, window, seed, epoch, 0);
              }
              py::object rows = py::none();
              if (start.epoch) rows = py::cast(PyRows{arg.owner, start.epoch, nullptr});
              return py::make_tuple(start.scan.first_nonpositive, start.scan.total, start.scan.total_overflow,
                                    start.scan.checksum, rows);
          },
          py::arg("lengths"), py::arg("seq_len"), py::arg("overlap"), py::arg("window"), py::arg("seed"),
          py::arg("epoch"),
          "A concat sampler's construction in one sequential read: (first index of a length <= 0 or -1, "
          "total tokens, whether the total overflowed 64 bits, the lengths checksum of scan_lengths, the "
          "rows of epoch `epoch` as concat_epoch builds them, or None where the lengths hold no rows).");

    m.def("best_fit_epoch",
          [](const PyPackLayout& l, std::uint64_t seed, std::uint64_t epoch) {
              std::shared_ptr<const fastshard::RowSource> rows;
              {
                  // Safe without the GIL: `l` (and its array) is held by the caller and only read.
                  py::gil_scoped_release release;
                  rows = std::make_shared<const fastshard::BestFitEpoch>(l.layout, seed, epoch, 0);
              }
              return PyRows{l.owner, std::move(rows), l.layout};
          },
          py::arg("layout"), py::arg("seed"), py::arg("epoch"), "best_fit rows of an epoch.");

    m.def("packed_shard",
          [](const PyRows& r, std::uint64_t num_replicas, std::uint64_t rank, bool drop_last, std::uint64_t cursor,
             bool pad) {
              const auto plan = checked_plan(r.rows->num_rows(), num_replicas, rank, drop_last, pad, cursor);
              return PyPackedShard{r.owner, std::make_shared<const fastshard::PackedShard>(r.rows, plan), r.keep};
          },
          py::arg("epoch"), py::arg("num_replicas"), py::arg("rank"), py::arg("drop_last"), py::arg("cursor"),
          py::arg("pad") = true, "A rank's rows of the epoch through the shared plan.");

    py::class_<PyPackedShard>(m, "PackedShard", "A rank's packed rows of one epoch.")
        .def("__len__", [](const PyPackedShard& s) { return s.shard->size(); })
        .def_property_readonly("num_samples", [](const PyPackedShard& s) { return s.shard->plan().num_samples; })
        .def_property_readonly("total_size", [](const PyPackedShard& s) { return s.shard->plan().total_size; })
        .def("position", [](const PyPackedShard& s, std::uint64_t k) {
                 if (k >= s.shard->size()) throw py::index_error("row out of range");
                 return s.shard->global(k);
             }, py::arg("k"), "The global row (index into the epoch's row sequence) of row k.")
        .def("row", [](const PyPackedShard& s, std::uint64_t k) {
                 if (k >= s.shard->size())
                     throw py::index_error("row " + std::to_string(k) + " is out of range for a shard of " +
                                           std::to_string(s.shard->size()) + " rows");
                 return row_of(s, s.shard->global(k));
             }, py::arg("k"), "This rank's k-th row: a (segments, 3) int64 array of (document, start, stop).")
        .def("global_row", [](const PyPackedShard& s, std::uint64_t g) {
                 if (g >= s.shard->plan().n) throw py::index_error("global row out of range");
                 return row_of(s, g);
             }, py::arg("g"), "Row g of the epoch's global row sequence.");
}
