// Tar shards (fastshard/tar.hpp): the header scan, the skip to a sample and the cut of a block into
// samples. Files are read by file descriptor (pread) or through a Python file object.
#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <exception>
#include <stdexcept>
#include <string>
#include <vector>

#include <fcntl.h>
#include <sys/stat.h>
#ifdef _WIN32
#include <io.h>
#else
#include <unistd.h>
#endif

#include "fastshard/parallel.hpp"
#include "fastshard/tar.hpp"
#include "pybind.hpp"

namespace {

// An OS error while the GIL was released, raised as OSError once it is held again.
struct OsError : std::runtime_error {
    OsError(int err, std::string path) : std::runtime_error(path), err(err), path(std::move(path)) {}
    int err;
    std::string path;
};

std::size_t pread_all(int fd, std::uint64_t off, char* buf, std::size_t n, const std::string& path) {
    std::size_t total = 0;
    while (total < n) {
#ifdef _WIN32
        if (_lseeki64(fd, static_cast<__int64>(off + total), SEEK_SET) < 0) throw OsError(errno, path);
        const int r = _read(fd, buf + total, static_cast<unsigned>(std::min<std::size_t>(n - total, 1 << 30)));
#else
        const ssize_t r = ::pread(fd, buf + total, n - total, static_cast<off_t>(off + total));
#endif
        if (r < 0) {
            if (errno == EINTR) continue;
            throw OsError(errno, path);
        }
        if (r == 0) break;
        total += static_cast<std::size_t>(r);
    }
    return total;
}

// No read reaches past `size`: a header's size can point anywhere up to 2**64, and an offset
// past what the file system allows fails (EINVAL) instead of reading nothing.
std::size_t clip(std::uint64_t size, std::uint64_t off, std::size_t n) {
    if (off >= size) return 0;
    return static_cast<std::size_t>(std::min<std::uint64_t>(n, size - off));
}

fastshard::ReadAt fd_reader(int fd, const std::string& path) {
#ifdef _WIN32
    struct _stat64 st;
    if (_fstat64(fd, &st) != 0) throw OsError(errno, path);
#else
    struct stat st;
    if (::fstat(fd, &st) != 0) throw OsError(errno, path);
#endif
    const auto size = static_cast<std::uint64_t>(st.st_size);
    return [fd, &path, size](std::uint64_t off, char* buf, std::size_t n) {
        n = clip(size, off, n);
        return n == 0 ? std::size_t{0} : pread_all(fd, off, buf, n, path);
    };
}

// Reads through a Python file object (seek + readinto), taking the GIL for each call.
// `size`: the file's length (seek to its end), taken with the GIL held.
fastshard::ReadAt file_reader(const py::object& f, std::uint64_t size) {
    return [&f, size](std::uint64_t off, char* buf, std::size_t n) -> std::size_t {
        n = clip(size, off, n);
        if (n == 0) return 0;
        py::gil_scoped_acquire gil;
        f.attr("seek")(off);
        std::size_t total = 0;
        while (total < n) {
            py::memoryview view = py::memoryview::from_memory(buf + total, static_cast<py::ssize_t>(n - total));
            py::object got = f.attr("readinto")(view);
            const std::size_t k = got.is_none() ? 0 : got.cast<std::size_t>();
            if (k == 0) break;
            total += k;
        }
        return total;
    };
}

// Created once when the module is initialised and kept for the life of the process.
PyObject* not_tar_error = nullptr;
PyObject* tar_format_error = nullptr;

// Sets a Python error whose message may hold bytes of a member name that are not UTF-8.
void set_error(PyObject* type, const std::string& message) {
    PyObject* text = PyUnicode_DecodeUTF8(message.data(), static_cast<py::ssize_t>(message.size()),
                                          "backslashreplace");
    if (text == nullptr) return;  // the decode's own error stands
    PyErr_SetObject(type, text);
    Py_DECREF(text);
}

// Raises a stored error of the tar code as the matching Python exception (with the GIL held).
// Its message is prefixed with `path` unless it names the file already (or `path` is empty).
[[noreturn]] void raise_tar_error(std::exception_ptr error, const std::string& path) {
    const auto named = [&](const std::string& what) {
        return path.empty() || what.rfind(path + ": ", 0) == 0 ? what : path + ": " + what;
    };
    try {
        std::rethrow_exception(error);
    } catch (const OsError& e) {
        errno = e.err;
        PyErr_SetFromErrnoWithFilename(PyExc_OSError, e.path.c_str());
    } catch (const fastshard::NotTarError& e) {
        set_error(not_tar_error, named(e.what()));
    } catch (const fastshard::TarFormatError& e) {
        set_error(tar_format_error, named(e.what()));
    }
    throw py::error_already_set();
}

// Runs fn without the GIL and raises what it threw as the matching Python exception.
template <class Fn>
void run_released(const std::string& path, Fn&& fn) {
    std::exception_ptr error;
    {
        py::gil_scoped_release release;
        try {
            fn();
        } catch (...) {
            error = std::current_exception();
        }
    }
    if (error) raise_tar_error(error, path);
}

template <class Fn>
void with_source(const py::object& source, const std::string& path, Fn&& fn) {
    if (py::isinstance<py::int_>(source)) {
        const int fd = source.cast<int>();
        run_released(path, [&] { fn(fd_reader(fd, path)); });
    } else {
        const std::uint64_t size = source.attr("seek")(0, 2).cast<std::uint64_t>();
        // The reads take the GIL back; releasing it here lets them run in turn with other threads.
        run_released(path, [&] { fn(file_reader(source, size)); });
    }
}

py::array_t<std::int64_t> to_array(const std::vector<std::uint64_t>& v) {
    py::array_t<std::int64_t> out(static_cast<py::ssize_t>(v.size()));
    std::int64_t* p = out.mutable_data();
    for (std::size_t i = 0; i < v.size(); ++i) p[i] = static_cast<std::int64_t>(v[i]);
    return out;
}

py::tuple scan(const py::object& source, std::uint64_t every, const std::string& path) {
    if (every == 0) throw py::value_error("every must be >= 1");
    fastshard::TarScan s;
    with_source(source, path, [&](const fastshard::ReadAt& read) { s = fastshard::scan_tar(read, every, path); });
    return py::make_tuple(s.samples, to_array(s.offsets), s.end);
}

py::tuple scan_paths(const std::vector<std::string>& paths, std::uint64_t every, unsigned threads) {
    if (every == 0) throw py::value_error("every must be >= 1");
    std::vector<fastshard::TarScan> scans(paths.size());
    std::exception_ptr error;
    {
        // Safe without the GIL: the paths were copied into C++ strings; each part writes its own slots.
        py::gil_scoped_release release;
        try {
            fastshard::parallel_for(paths.size(), threads, 1, [&](unsigned, std::uint64_t begin, std::uint64_t count) {
                for (std::uint64_t i = begin; i < begin + count; ++i) {
                    const std::string& path = paths[i];
#ifdef _WIN32
                    const int fd = _open(path.c_str(), _O_RDONLY | _O_BINARY);
#else
                    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
#endif
                    if (fd < 0) throw OsError(errno, path);
                    try {
                        scans[i] = fastshard::scan_tar(fd_reader(fd, path), every, path);
                    } catch (const fastshard::NotTarError& e) {
#ifdef _WIN32
                        _close(fd);
#else
                        ::close(fd);
#endif
                        throw fastshard::NotTarError(path + ": " + e.what());
                    } catch (const fastshard::TarFormatError& e) {
#ifdef _WIN32
                        _close(fd);
#else
                        ::close(fd);
#endif
                        const std::string what = e.what();
                        throw fastshard::TarFormatError(what.rfind(path + ": ", 0) == 0 ? what : path + ": " + what);
                    } catch (...) {
#ifdef _WIN32
                        _close(fd);
#else
                        ::close(fd);
#endif
                        throw;
                    }
#ifdef _WIN32
                    _close(fd);
#else
                    ::close(fd);
#endif
                }
            });
        } catch (...) {
            error = std::current_exception();
        }
    }
    // Each error carries its file's path in its message already.
    if (error) raise_tar_error(error, "");
    std::vector<std::uint64_t> counts(paths.size());
    std::vector<std::uint64_t> bounds(paths.size() + 1);
    std::vector<std::uint64_t> ends(paths.size());
    std::vector<std::uint64_t> offsets;
    for (std::size_t i = 0; i < scans.size(); ++i) {
        counts[i] = scans[i].samples;
        ends[i] = scans[i].end;
        bounds[i + 1] = bounds[i] + scans[i].offsets.size();
        offsets.insert(offsets.end(), scans[i].offsets.begin(), scans[i].offsets.end());
    }
    return py::make_tuple(to_array(counts), to_array(bounds), to_array(offsets), to_array(ends));
}

py::tuple skip(const py::object& source, std::uint64_t offset, std::uint64_t samples, const std::string& path) {
    std::uint64_t found = 0;
    std::uint64_t at = 0;
    with_source(source, path, [&](const fastshard::ReadAt& read) {
        at = fastshard::skip_tar_samples(read, offset, samples, found, path);
    });
    return py::make_tuple(at, found);
}

bool ascii(const std::string& s) {
    for (char c : s)
        if (static_cast<unsigned char>(c) >= 0x80) return false;
    return true;
}

py::list samples(const py::buffer& block, const py::object& url, const std::string& path) {
    const py::buffer_info info = block.request();
    if (info.ndim != 1 || info.itemsize != 1) throw py::value_error("block must be a 1-D buffer of bytes");
    const char* buf = static_cast<const char*>(info.ptr);
    const auto n = static_cast<std::size_t>(info.size);
    std::vector<fastshard::TarSample> parsed;
    run_released(path, [&] { parsed = fastshard::parse_tar_block(buf, n, path); });
    py::list out(parsed.size());
    const py::str key_name("__key__");
    const py::str url_name("__url__");
    for (std::size_t i = 0; i < parsed.size(); ++i) {
        const auto& s = parsed[i];
        py::dict d;
        d[key_name] = py::reinterpret_steal<py::str>(
            PyUnicode_DecodeUTF8(s.key.data(), static_cast<py::ssize_t>(s.key.size()), "surrogateescape"));
        d[url_name] = url;
        for (const auto& f : s.fields) {
            PyObject* raw = PyUnicode_DecodeUTF8(f.ext.data(), static_cast<py::ssize_t>(f.ext.size()), "surrogateescape");
            if (raw == nullptr) throw py::error_already_set();
            py::object ext = py::reinterpret_steal<py::object>(raw);
            if (!ascii(f.ext)) ext = ext.attr("lower")();  // Python's lower-casing, as webdataset's
            if (d.contains(ext)) {
                set_error(tar_format_error,
                          path + ": sample '" + s.key + "' has two members with extension '" + f.ext + "'");
                throw py::error_already_set();
            }
            d[ext] = py::bytes(buf + f.data, static_cast<py::ssize_t>(f.size));
        }
        out[i] = std::move(d);
    }
    return out;
}

}  // namespace

void register_tar(py::module_& m) {
    not_tar_error = PyErr_NewException("fastshard._core.NotTarError", PyExc_ValueError, nullptr);
    tar_format_error = PyErr_NewException("fastshard._core.TarFormatError", PyExc_ValueError, nullptr);
    if (not_tar_error == nullptr || tar_format_error == nullptr) throw py::error_already_set();
    m.attr("NotTarError") = py::reinterpret_borrow<py::object>(not_tar_error);
    m.attr("TarFormatError") = py::reinterpret_borrow<py::object>(tar_format_error);
    m.def("tar_scan", &scan, py::arg("source"), py::arg("every"), py::arg("path"),
          "(samples, offsets of every every-th sample, end of the last sample) of one tar file, read "
          "by file descriptor or through a file object; headers only.");
    m.def("tar_scan_paths", &scan_paths, py::arg("paths"), py::arg("every"), py::arg("threads") = 0,
          "tar_scan of many files on `threads` threads: (counts, bounds, flat offsets, ends).");
    m.def("tar_skip", &skip, py::arg("source"), py::arg("offset"), py::arg("samples"), py::arg("path"),
          "(offset of the samples-th sample after the one at offset, samples passed); headers only.");
    m.def("tar_samples", &samples, py::arg("block"), py::arg("url"), py::arg("path"),
          "The samples in a block of a tar file that starts and ends at sample bounds, as dicts.");
}
