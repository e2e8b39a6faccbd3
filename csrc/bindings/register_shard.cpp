#include <algorithm>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>

#include "fastshard/feistel.hpp"
#include "fastshard/mix.hpp"
#include "fastshard/shard.hpp"
#include "pybind.hpp"

namespace {

using fastshard::Shard;

constexpr std::uint64_t kMaxLength = static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max());

fastshard::Order parse_order(const std::string& name) {
    if (name == "feistel") return fastshard::Order::feistel;
    if (name == "identity") return fastshard::Order::identity;
    throw py::value_error("order must be 'feistel' or 'identity', got '" + name + "'");
}

// The Python-facing shard: an immutable, shareable handle.
struct PyShard {
    std::shared_ptr<const Shard> shard;

    std::uint64_t size() const { return shard->size(); }

    void check_range(std::uint64_t start, std::uint64_t stop) const {
        if (start > stop || stop > size())
            throw py::index_error("range [" + std::to_string(start) + ", " + std::to_string(stop) +
                                  ") is outside [0, " + std::to_string(size()) + ")");
    }

    std::int64_t getitem(std::int64_t k) const {
        const auto len = static_cast<std::int64_t>(size());  // size() <= n < 2^63
        const std::int64_t i = k < 0 ? k + len : k;
        if (i < 0 || i >= len)
            throw py::index_error("index " + std::to_string(k) + " is out of range for a shard of " +
                                  std::to_string(len) + " items");
        return shard->at(static_cast<std::uint64_t>(i));
    }

    py::array_t<std::int64_t> indices(std::uint64_t start, std::uint64_t stop, unsigned threads) const {
        check_range(start, stop);
        py::array_t<std::int64_t> out(static_cast<py::ssize_t>(stop - start));
        std::int64_t* data = out.mutable_data();
        // Safe without the GIL: the shard is immutable and `out` is not yet visible to Python.
        py::gil_scoped_release release;
        shard->fill_parallel(start, stop - start, data, threads);
        return out;
    }

    py::list batch(std::uint64_t start, std::uint64_t stop) const {
        check_range(start, stop);
        const std::uint64_t count = stop - start;
        // The list first, through PyList_New: an impossible size is a MemoryError. The items are
        // then filled in chunks through a small buffer, with no temporary copy of the batch.
        PyObject* raw = PyList_New(static_cast<py::ssize_t>(count));
        if (raw == nullptr) throw py::error_already_set();
        auto out = py::reinterpret_steal<py::list>(raw);
        constexpr std::uint64_t kChunk = 1024;
        std::int64_t buf[kChunk];
        for (std::uint64_t done = 0; done < count; done += kChunk) {
            const std::uint64_t m = std::min(kChunk, count - done);
            shard->fill(start + done, m, buf);
            for (std::uint64_t i = 0; i < m; ++i) {
                PyObject* v = PyLong_FromLongLong(buf[i]);
                if (v == nullptr) throw py::error_already_set();  // the list frees what is set
                PyList_SET_ITEM(raw, static_cast<py::ssize_t>(done + i), v);
            }
        }
        return out;
    }
};

PyShard make(std::uint64_t n, std::uint64_t num_replicas, std::uint64_t rank, bool drop_last,
             bool pad, std::uint64_t cursor, const std::string& order, std::uint64_t seed,
             std::uint64_t epoch) {
    if (n > kMaxLength) throw py::value_error("n must be in [0, 2**63 - 1]");
    if (cursor > kMaxLength) throw py::value_error("cursor must be in [0, 2**63 - 1]");
    if (num_replicas == 0 || num_replicas > kMaxLength)
        throw py::value_error("num_replicas must be in [1, 2**63 - 1]");
    if (rank >= num_replicas) throw py::value_error("rank must be in [0, num_replicas)");
    const auto plan = fastshard::Plan::make(n, num_replicas, rank, drop_last, pad, cursor);
    return PyShard{fastshard::make_shard(plan, parse_order(order), seed, epoch)};
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
    m.def("get_num_threads", &fastshard::default_threads);
    m.def("set_num_threads", [](unsigned t) { fastshard::set_default_threads(t); }, py::arg("threads"));
    m.attr("FEISTEL_ROUNDS") = fastshard::Feistel::kRounds;
    m.attr("FEISTEL_TABLE_MAX") = fastshard::Feistel::kTableMax;
}
