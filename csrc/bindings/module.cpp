#include "pybind.hpp"

void register_tar(py::module_& m);  // register_tar.cpp

PYBIND11_MODULE(_core, m) {
    m.doc() = "fastshard's compiled core: shard plans, orders and bulk fills.";
    // pybind11 looks up NumPy's C API at the first array it converts (0.3 ms: it parses
    // numpy.__version__); at import, not inside a reader's first call.
    py::detail::npy_api::get();
    register_iterator(m);
    register_mixture(m);
    register_shard(m);
    register_weighted(m);
    register_length(m);
    register_packed(m);
    register_stream(m);
    register_tar(m);
}
