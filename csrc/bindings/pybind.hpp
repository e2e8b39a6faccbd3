// The one pybind11 include of the bindings: every register_*.cpp includes this header, so all
// translation units see pybind11 with the same configuration.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

namespace py = pybind11;

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>

#include "fastshard/shard.hpp"

void register_iterator(py::module_& m);
void register_mixture(py::module_& m);
void register_shard(py::module_& m);
void register_weighted(py::module_& m);
void register_length(py::module_& m);
void register_packed(py::module_& m);
void register_stream(py::module_& m);

// Returns a new iterator over items [start, stop) of a shard (defined in register_iterator).
py::object make_shard_iterator(std::shared_ptr<const fastshard::Shard> shard, std::uint64_t start,
                               std::uint64_t stop);

constexpr std::uint64_t kMaxLength = 0x7fffffffffffffffULL;

// The plan after the checks Python already made, repeated here so _core is safe on its own.
inline fastshard::Plan checked_plan(std::uint64_t n, std::uint64_t num_replicas, std::uint64_t rank,
                                    bool drop_last, bool pad, std::uint64_t cursor) {
    if (n > kMaxLength) throw py::value_error("n must be in [0, 2**63 - 1]");
    if (cursor > kMaxLength) throw py::value_error("cursor must be in [0, 2**63 - 1]");
    if (num_replicas == 0 || num_replicas > kMaxLength)
        throw py::value_error("num_replicas must be in [1, 2**63 - 1]");
    if (rank >= num_replicas) throw py::value_error("rank must be in [0, num_replicas)");
    return fastshard::Plan::make(n, num_replicas, rank, drop_last, pad, cursor);
}

// The Python-facing shard: an immutable, shareable handle.
struct PyShard {
    std::shared_ptr<const fastshard::Shard> shard;

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

