// A lengths array as the compiled core reads it, in place: the one conversion the length-grouped
// and packed bindings share.
#pragma once

#include <cstdint>

#include "fastshard/stratify.hpp"
#include "pybind.hpp"

// A view of a 1-D C-contiguous integer array (Python passes nothing else; checked again here
// so that _core is safe on its own). `owner` keeps the array alive for the view's users.
struct LengthsView {
    py::array owner;
    fastshard::Lengths view;
};

inline LengthsView lengths_arg(const py::array& a) {
    using fastshard::LengthType;
    if (a.ndim() != 1) throw py::value_error("lengths must be 1-D");
    if (!(a.flags() & py::array::c_style)) throw py::value_error("lengths must be C-contiguous");
    const char kind = a.dtype().kind();
    const auto size = a.itemsize();
    LengthType type;
    if (kind == 'i' && size == 1) type = LengthType::i8;
    else if (kind == 'i' && size == 2) type = LengthType::i16;
    else if (kind == 'i' && size == 4) type = LengthType::i32;
    else if (kind == 'i' && size == 8) type = LengthType::i64;
    else if (kind == 'u' && size == 1) type = LengthType::u8;
    else if (kind == 'u' && size == 2) type = LengthType::u16;
    else if (kind == 'u' && size == 4) type = LengthType::u32;
    else if (kind == 'u' && size == 8) type = LengthType::u64;
    else throw py::type_error("lengths must have an integer dtype");
    return {a, {a.data(), type, static_cast<std::uint64_t>(a.shape(0))}};
}
