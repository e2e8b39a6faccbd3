// A plain CPython iterator type: `for i in sampler` costs one tp_iternext call per index,
// with no pybind11 dispatch in between. It refills a small buffer from the shard in C++.
#include <Python.h>

#include <algorithm>
#include <exception>
#include <new>

#include "fastshard/shard.hpp"
#include "pybind.hpp"

namespace {

// Items per refill. A refill's fixed costs (the virtual call, the position's division, the
// cycle walk's last partial passes over a few lanes) are spread over this many items: 1024
// costs about 1 ns an item less than 256 in the feistel order (bench/RESULTS.md, issue 30),
// for 6 KiB more per iterator.
constexpr std::uint32_t kBuffer = 1024;

struct ShardIterObject {
    PyObject_HEAD std::shared_ptr<const fastshard::Shard> shard;
    std::uint64_t next;  // next item to load into the buffer
    std::uint64_t stop;
    std::uint32_t pos;  // next buffered item to hand out
    std::uint32_t len;  // buffered items
    bool ended;         // whether it raised StopIteration: the loop over it has ended
    std::int64_t buffer[kBuffer];
};

PyTypeObject* iter_type = nullptr;

void iter_dealloc(PyObject* self) {
    auto* it = reinterpret_cast<ShardIterObject*>(self);
    PyTypeObject* type = Py_TYPE(self);
    it->shard.~shared_ptr();
    type->tp_free(self);
    Py_DECREF(type);
}

// The refill, out of line: the per-item path of iter_next stays a compare, a load and a
// tail call to PyLong_FromLongLong, without saving registers for the call into the shard.
// Returns false with a Python exception set, or at the end with none set.
[[gnu::noinline]] bool refill(ShardIterObject* it) {
    if (it->next >= it->stop) {  // StopIteration
        it->ended = true;
        return false;
    }
    const auto count = static_cast<std::uint32_t>(std::min<std::uint64_t>(kBuffer, it->stop - it->next));
    // A C++ exception must not unwind into CPython, which called this slot directly (no
    // pybind11 dispatch to translate it): it becomes a Python exception here, and the
    // iterator stays where it was, so a retry refills the same items.
    try {
        it->shard->fill(it->next, count, it->buffer);
    } catch (const std::bad_alloc&) {
        PyErr_NoMemory();
        return false;
    } catch (const std::exception& e) {
        PyErr_SetString(PyExc_RuntimeError, e.what());
        return false;
    } catch (...) {
        PyErr_SetString(PyExc_RuntimeError, "unknown C++ exception while filling the iterator's buffer");
        return false;
    }
    it->next += count;
    it->pos = 0;
    it->len = count;
    return true;
}

PyObject* iter_next(PyObject* self) {
    auto* it = reinterpret_cast<ShardIterObject*>(self);
    if (it->pos == it->len && !refill(it)) return nullptr;
    return PyLong_FromLongLong(it->buffer[it->pos++]);
}

std::uint64_t position_of(const ShardIterObject* it) { return it->next - (it->len - it->pos); }

PyObject* iter_position(PyObject* self, void*) {
    return PyLong_FromUnsignedLongLong(position_of(reinterpret_cast<ShardIterObject*>(self)));
}

PyObject* iter_ended(PyObject* self, void*) {
    return PyBool_FromLong(reinterpret_cast<ShardIterObject*>(self)->ended);
}

PyObject* iter_length_hint(PyObject* self, PyObject*) {
    auto* it = reinterpret_cast<ShardIterObject*>(self);
    return PyLong_FromUnsignedLongLong(it->stop - position_of(it));
}

PyGetSetDef iter_getset[] = {
    {"position", iter_position, nullptr,
     "Index within the shard of the next item this iterator yields.", nullptr},
    {"ended", iter_ended, nullptr,
     "Whether it raised StopIteration (a loop asked for more than the shard holds).", nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr}};

PyMethodDef iter_methods[] = {
    {"__length_hint__", iter_length_hint, METH_NOARGS, "Items left."},
    {nullptr, nullptr, 0, nullptr}};

PyType_Slot iter_slots[] = {{Py_tp_dealloc, reinterpret_cast<void*>(iter_dealloc)},
                            {Py_tp_iter, reinterpret_cast<void*>(PyObject_SelfIter)},
                            {Py_tp_iternext, reinterpret_cast<void*>(iter_next)},
                            {Py_tp_getset, iter_getset},
                            {Py_tp_methods, iter_methods},
                            {Py_tp_doc, const_cast<char*>("Iterator over a shard's indices.")},
                            {0, nullptr}};

PyType_Spec iter_spec = {"fastshard._core.ShardIterator", sizeof(ShardIterObject), 0,
                         Py_TPFLAGS_DEFAULT, iter_slots};

}  // namespace

py::object make_shard_iterator(std::shared_ptr<const fastshard::Shard> shard, std::uint64_t start,
                               std::uint64_t stop) {
    PyObject* obj = iter_type->tp_alloc(iter_type, 0);
    if (obj == nullptr) throw py::error_already_set();
    auto* it = reinterpret_cast<ShardIterObject*>(obj);
    new (&it->shard) std::shared_ptr<const fastshard::Shard>(std::move(shard));
    it->next = start;
    it->stop = stop;
    it->pos = 0;
    it->len = 0;
    it->ended = false;
    return py::reinterpret_steal<py::object>(obj);
}

void register_iterator(py::module_& m) {
    PyObject* type = PyType_FromSpec(&iter_spec);
    if (type == nullptr) throw py::error_already_set();
    iter_type = reinterpret_cast<PyTypeObject*>(type);
    m.add_object("ShardIterator", py::reinterpret_borrow<py::object>(type));
}
