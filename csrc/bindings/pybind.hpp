// The one pybind11 include of the bindings: every register_*.cpp includes this header, so all
// translation units see pybind11 with the same configuration.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

namespace py = pybind11;

void register_shard(py::module_& m);
void register_iterator(py::module_& m);

// Returns a new iterator over items [start, stop) of a shard (defined in register_iterator).
namespace fastshard {
class Shard;
}
py::object make_shard_iterator(std::shared_ptr<const fastshard::Shard> shard, std::uint64_t start,
                               std::uint64_t stop);
