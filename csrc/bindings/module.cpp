#include "pybind.hpp"

void register_tar(py::module_& m);  // register_tar.cpp

PYBIND11_MODULE(_core, m) {
    m.doc() = "fastshard's compiled core: shard plans, orders and bulk fills.";
    register_iterator(m);
    register_mixture(m);
    register_shard(m);
    register_weighted(m);
    register_length(m);
    register_packed(m);
    register_stream(m);
    register_tar(m);
}
