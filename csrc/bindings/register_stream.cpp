// Sharded streams (fastshard/stream.hpp): plans of shard reads; the reads themselves are Python's.
#include <cstdint>
#include <memory>
#if defined(_MSC_VER)
#include <intrin.h>
#endif
#include <vector>

#include "fastshard/stream.hpp"
#include "pybind.hpp"

namespace {

struct PyStreamEpoch {
    std::shared_ptr<const fastshard::StreamEpoch> epoch;
};

std::shared_ptr<const fastshard::StreamLayout> make_layout(
    const py::array_t<std::int64_t, py::array::c_style | py::array::forcecast>& sizes,
    std::uint64_t chunk_rows) {
    if (sizes.ndim() != 1) throw py::value_error("shard sizes must be 1-D");
    try {
        return std::make_shared<const fastshard::StreamLayout>(
            sizes.data(), static_cast<std::uint64_t>(sizes.shape(0)), chunk_rows);
    } catch (const std::invalid_argument& e) {
        throw py::value_error(e.what());
    }
}

// One atomic compare-and-swap on a word of a caller's buffer (shared memory between processes:
// the ShardedStream's epoch board). Sequentially consistent, so it also orders the plain reads and
// writes of the other words made while the word holds a lock.
std::int64_t compare_swap(std::int64_t* word, std::int64_t expected, std::int64_t desired) {
#if defined(_MSC_VER)
    return _InterlockedCompareExchange64(reinterpret_cast<volatile long long*>(word), desired, expected);
#else
    __atomic_compare_exchange_n(word, &expected, desired, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
    return expected;
#endif
}

void check_lane(const fastshard::StreamEpoch& e, std::uint64_t l) {
    if (l >= e.lanes()) throw py::index_error("lane out of range");
}

}  // namespace

void register_stream(py::module_& m) {
    m.attr("STREAM_DOMAIN") = fastshard::kStreamDomain;

    m.def("compare_swap", [](py::array_t<std::int64_t, py::array::c_style> words, py::ssize_t index,
                             std::int64_t expected, std::int64_t desired) {
              if (words.ndim() != 1 || index < 0 || index >= words.shape(0))
                  throw py::index_error("word index out of range");
              if (!words.writeable()) throw py::value_error("the array is read-only");
              auto* word = words.mutable_data() + index;
              if (reinterpret_cast<std::uintptr_t>(word) % alignof(std::int64_t) != 0)
                  throw py::value_error("the word is not 8-byte aligned");
              return compare_swap(word, expected, desired);
          }, py::arg("words"), py::arg("index"), py::arg("expected"), py::arg("desired"),
          "Atomically: if words[index] == expected, set it to desired. Returns the value seen "
          "(expected when the swap happened).");

    py::class_<fastshard::StreamLayout, std::shared_ptr<fastshard::StreamLayout>>(
        m, "StreamLayout", "Shards and their chunks: what does not depend on the epoch (immutable).")
        .def(py::init([](const py::array_t<std::int64_t, py::array::c_style | py::array::forcecast>& sizes,
                         std::uint64_t chunk_rows) {
                 return std::const_pointer_cast<fastshard::StreamLayout>(make_layout(sizes, chunk_rows));
             }),
             py::arg("sizes"), py::arg("chunk_rows"), "chunk_rows 0: one chunk per non-empty shard.")
        .def_property_readonly("rows", &fastshard::StreamLayout::rows)
        .def_property_readonly("shards", &fastshard::StreamLayout::shards)
        .def_property_readonly("chunks", &fastshard::StreamLayout::chunks);

    py::class_<PyStreamEpoch>(m, "StreamEpoch", "One epoch's stream, lanes and windows (immutable).")
        .def(py::init([](std::shared_ptr<fastshard::StreamLayout> layout, std::uint64_t seed,
                         std::uint64_t epoch, bool shuffle, std::uint64_t lanes, std::uint64_t window) {
                 if (lanes == 0) throw py::value_error("lanes must be >= 1");
                 if (window == 0) throw py::value_error("window must be >= 1");
                 py::gil_scoped_release release;
                 return PyStreamEpoch{std::make_shared<const fastshard::StreamEpoch>(
                     std::move(layout), seed, epoch, shuffle, lanes, window)};
             }),
             py::arg("layout"), py::arg("seed"), py::arg("epoch"), py::arg("shuffle"), py::arg("lanes"),
             py::arg("window"))
        .def_property_readonly("rows", [](const PyStreamEpoch& s) { return s.epoch->rows(); })
        .def_property_readonly("lanes", [](const PyStreamEpoch& s) { return s.epoch->lanes(); })
        .def_property_readonly("window", [](const PyStreamEpoch& s) { return s.epoch->window(); })
        .def("lane", [](const PyStreamEpoch& s, std::uint64_t l) {
                 check_lane(*s.epoch, l);
                 return py::make_tuple(s.epoch->lane_start(l), s.epoch->lane_length(l));
             }, py::arg("lane"), "(first stream row, length) of a lane.")
        .def("segments", [](const PyStreamEpoch& s, std::uint64_t lo, std::uint64_t hi) {
                 if (lo > hi || hi > s.epoch->rows()) throw py::index_error("stream range outside [0, rows]");
                 std::vector<fastshard::StreamSegment> seg;
                 s.epoch->segments(lo, hi, seg);
                 py::array_t<std::int64_t> out({static_cast<py::ssize_t>(seg.size()), py::ssize_t{3}});
                 auto* p = out.mutable_data();
                 for (const auto& g : seg) {
                     *p++ = static_cast<std::int64_t>(g.shard);
                     *p++ = static_cast<std::int64_t>(g.row_lo);
                     *p++ = static_cast<std::int64_t>(g.row_hi);
                 }
                 return out;
             }, py::arg("lo"), py::arg("hi"),
             "(k, 3) int64 array of (shard, row_lo, row_hi): the reads covering stream rows [lo, hi).")
        .def("window_order", [](const PyStreamEpoch& s, std::uint64_t l, std::uint64_t w) {
                 check_lane(*s.epoch, l);
                 if (w * s.epoch->window() >= s.epoch->lane_length(l)) throw py::index_error("window out of range");
                 std::vector<std::uint64_t> order;
                 s.epoch->window_order(l, w, order);
                 py::array_t<std::int64_t> out(static_cast<py::ssize_t>(order.size()));
                 auto* p = out.mutable_data();
                 for (auto v : order) *p++ = static_cast<std::int64_t>(v);
                 return out;
             }, py::arg("lane"), py::arg("window"),
             "Window w of lane l: the window offset of each of its lane rows, in lane order.")
        .def("places", [](const PyStreamEpoch& s, std::uint64_t base, std::uint64_t step, std::uint64_t lo,
                          std::uint64_t hi) {
                 const auto& e = *s.epoch;
                 const std::uint64_t n = e.rows();
                 if (lo > hi) throw py::index_error("lo > hi");
                 if (n == 0 && hi > lo) throw py::index_error("no rows");
                 py::array_t<std::int64_t> out({static_cast<py::ssize_t>(hi - lo), py::ssize_t{3}});
                 auto* o = out.mutable_data();
                 if (hi == lo) return out;
                 // p = (base + step * i) mod n: the first by double-and-add (n < 2^63, so sums
                 // of two residues fit), then one addition per step.
                 const std::uint64_t s_mod = step % n;
                 std::uint64_t p = base % n, a = s_mod, k = lo;
                 while (k != 0) {
                     if (k & 1) p = p + a >= n ? p + a - n : p + a;
                     a = a + a >= n ? a + a - n : a + a;
                     k >>= 1;
                 }
                 for (std::uint64_t i = lo; i < hi; ++i) {
                     const auto at = e.place(p);
                     *o++ = static_cast<std::int64_t>(at.lane);
                     *o++ = static_cast<std::int64_t>(at.window);
                     *o++ = static_cast<std::int64_t>(at.u);
                     p = p + s_mod >= n ? p + s_mod - n : p + s_mod;
                 }
                 return out;
             }, py::arg("base"), py::arg("step"), py::arg("lo"), py::arg("hi"),
             "(k, 3) int64 array of (lane, window, u) of positions (base + step*i) mod rows, "
             "i in [lo, hi): where a reader finds each of its items.")
        .def("sequence", [](const PyStreamEpoch& s, std::uint64_t lo, std::uint64_t hi) {
                 const auto& e = *s.epoch;
                 if (lo > hi || hi > e.rows()) throw py::index_error("positions outside [0, rows]");
                 py::array_t<std::int64_t> out({static_cast<py::ssize_t>(hi - lo), py::ssize_t{2}});
                 auto* p = out.mutable_data();
                 {
                     py::gil_scoped_release release;
                     for (std::uint64_t q = lo; q < hi; ++q) {
                         const auto item = e.locate(q);
                         *p++ = static_cast<std::int64_t>(item.shard);
                         *p++ = static_cast<std::int64_t>(item.row);
                     }
                 }
                 return out;
             }, py::arg("lo"), py::arg("hi"),
             "(k, 2) int64 array of (shard, row) at positions [lo, hi) of the global sequence "
             "(one lookup per position: for checks and measurements, not for reading).");
}
