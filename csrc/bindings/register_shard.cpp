#include <cstdint>
#include <limits>
#include <memory>
#include <new>
#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>

#include "fastshard/block.hpp"
#include "fastshard/feistel.hpp"
#include "fastshard/mix.hpp"
#include "fastshard/parallel.hpp"
#include "fastshard/shard.hpp"
#include "fastshard/torch_order.hpp"
#include "pybind.hpp"

namespace {

using fastshard::Shard;

fastshard::Order parse_order(const std::string& name) {
    if (name == "feistel") return fastshard::Order::feistel;
    if (name == "identity") return fastshard::Order::identity;
    if (name == "torch") return fastshard::Order::torch;
    throw py::value_error("order must be 'feistel', 'identity', 'torch' or 'block', got '" + name + "'");
}

fastshard::TorchAlgorithm parse_torch_shuffle(const std::string& name,
                                              const char* what = "torch_shuffle") {
    if (name == "auto") return fastshard::TorchAlgorithm::automatic;
    if (name == "fisher_yates") return fastshard::TorchAlgorithm::fisher_yates;
    if (name == "inside_out") return fastshard::TorchAlgorithm::inside_out;
    throw py::value_error(std::string(what) + " must be 'auto', 'fisher_yates' or 'inside_out', got '" +
                          name + "'");
}

// For tests of error paths: the identity order, except that filling a range that holds item
// `fail_at` throws std::bad_alloc ("bad_alloc") or std::runtime_error ("runtime"), as a real
// fill may run out of memory in any of the threads fill_parallel starts or on the caller.
class FailingShard final : public Shard {
  public:
    FailingShard(const fastshard::Plan& plan, std::uint64_t fail_at, bool bad_alloc)
        : Shard(plan), fail_at_(fail_at), bad_alloc_(bad_alloc) {}

  protected:
    void fill_range(std::uint64_t k0, std::uint64_t count, std::int64_t* out) const override {
        if (k0 <= fail_at_ && fail_at_ - k0 < count) {
            if (bad_alloc_) throw std::bad_alloc();
            throw std::runtime_error("injected failure at item " + std::to_string(fail_at_));
        }
        for (std::uint64_t i = 0; i < count; ++i) out[i] = static_cast<std::int64_t>(k0 + i);
    }

  private:
    std::uint64_t fail_at_;
    bool bad_alloc_;
};

// (chunks, size, rem, offset, taken) of a block order's interrupted round.
using RoundTuple = std::tuple<std::uint64_t, std::uint64_t, std::uint64_t, std::uint64_t, std::uint64_t>;

std::optional<RoundTuple> round_tuple(const fastshard::BlockRound& d) {
    if (d.chunks == 0) return std::nullopt;
    return RoundTuple{d.chunks, d.size, d.rem, d.offset, d.taken};
}

PyShard make_block(std::uint64_t n, std::uint64_t num_replicas, std::uint64_t rank, bool drop_last,
                   bool pad, std::uint64_t cursor, std::uint64_t seed, std::uint64_t epoch,
                   std::uint64_t block_size, std::uint64_t window, bool shuffle,
                   const std::optional<RoundTuple>& round) {
    checked_plan(n, num_replicas, rank, drop_last, pad, cursor);  // the shared argument checks
    if (block_size == 0 || block_size > kMaxLength) throw py::value_error("block_size must be in [1, 2**63 - 1]");
    if (window == 0 || window > kMaxLength / block_size)
        throw py::value_error("window must be in [1, (2**63 - 1) // block_size]");
    fastshard::BlockResume resume;
    resume.cursor = cursor;
    if (round) {
        const auto& [chunks, size, rem, offset, taken] = *round;
        if (chunks == 0) throw py::value_error("round chunks must be >= 1");
        resume.round = fastshard::BlockRound{chunks, size, rem, offset, taken};
    }
    try {
        return PyShard{std::make_shared<fastshard::BlockShard>(
            n, num_replicas, rank, drop_last, pad, fastshard::BlockSpec{block_size, window, shuffle}, resume,
            seed, epoch)};
    } catch (const std::invalid_argument& e) {
        throw py::value_error(e.what());
    }
}

PyShard make(std::uint64_t n, std::uint64_t num_replicas, std::uint64_t rank, bool drop_last,
             bool pad, std::uint64_t cursor, const std::string& order, std::uint64_t seed,
             std::uint64_t epoch, std::uint64_t block_size, std::uint64_t window, bool shuffle,
             const std::optional<RoundTuple>& round, const std::string& torch_shuffle) {
    if (order == "block")
        return make_block(n, num_replicas, rank, drop_last, pad, cursor, seed, epoch, block_size, window,
                          shuffle, round);
    if (round) throw py::value_error("round is only for order='block'");
    const auto plan = checked_plan(n, num_replicas, rank, drop_last, pad, cursor);
    const auto kind = parse_order(order);
    const auto algorithm = parse_torch_shuffle(torch_shuffle);
    // Safe without the GIL: only C++ values are involved. The torch order spends O(n) here.
    py::gil_scoped_release release;
    return PyShard{fastshard::make_shard(plan, kind, seed, epoch, algorithm)};
}

const fastshard::BlockShard* as_block(const PyShard& s) {
    return dynamic_cast<const fastshard::BlockShard*>(s.shard.get());
}

// The resume point after every rank consumed its first k items: (cursor, round or None).
std::tuple<std::uint64_t, std::optional<RoundTuple>> resume_after(const PyShard& s, std::uint64_t k) {
    if (k > s.size()) throw py::index_error("k is out of range");
    if (const auto* block = as_block(s)) {
        const auto r = block->resume_after(k);
        return {r.cursor, round_tuple(r.round)};
    }
    // The permutation plan: at step k every rank took all positions before cursor + k * W.
    const auto& p = s.shard->plan();
    const std::uint64_t step = k > p.total_size / p.num_replicas ? p.total_size : k * p.num_replicas;
    return {p.cursor + std::min(step, p.total_size), std::nullopt};
}

}  // namespace

void register_shard(py::module_& m) {
    py::class_<PyShard>(m, "Shard", "One rank's items of one epoch (immutable).")
        .def(py::init(&make), py::arg("n"), py::arg("num_replicas"), py::arg("rank"),
             py::arg("drop_last"), py::arg("pad"), py::arg("cursor"), py::arg("order"),
             py::arg("seed"), py::arg("epoch"), py::kw_only(), py::arg("block_size") = 0,
             py::arg("window") = 1, py::arg("shuffle") = true, py::arg("round") = std::nullopt,
             py::arg("torch_shuffle") = "auto",
             "order='block' reads block_size, window, shuffle (False: blocks in order, chunks "
             "unshuffled) and round (the interrupted round of a resume point); other orders "
             "take 'identity' for no shuffle. order='torch' reads torch_shuffle: 'auto' "
             "(torch >= 2.6), 'fisher_yates' (torch <= 2.5) or 'inside_out', the shuffle for "
             "n >= 214,748,364.")
        .def("__len__", &PyShard::size)
        .def_property_readonly("num_samples", &PyShard::size)
        .def_property_readonly("total_size", [](const PyShard& s) { return s.shard->plan().total_size; })
        .def_property_readonly("n", [](const PyShard& s) { return s.shard->plan().n; })
        .def_property_readonly("num_replicas", [](const PyShard& s) { return s.shard->plan().num_replicas; })
        .def_property_readonly("rank", [](const PyShard& s) { return s.shard->plan().rank; })
        .def_property_readonly("cursor", [](const PyShard& s) { return s.shard->plan().cursor; })
        .def("resume_after", &resume_after, py::arg("k"),
             "(cursor, round or None): the resume point once every rank consumed its first k items.")
        .def_property_readonly("round", [](const PyShard& s) -> std::optional<RoundTuple> {
                 const auto* block = as_block(s);
                 return block ? round_tuple(block->resume().round) : std::nullopt;
             }, "The block order's interrupted round this shard resumes (normalized), else None.")
        .def_property_readonly("head_length", [](const PyShard& s) -> std::uint64_t {
                 const auto* block = as_block(s);
                 return block ? block->head_length() : 0;
             }, "Block order: this rank's items before the chunks (the rest of an interrupted round).")
        .def("position", [](const PyShard& s, std::uint64_t k) {
                 if (as_block(s)) throw py::type_error("position() is not defined for the block order");
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
    m.def("_feistel_points",
          [](std::uint64_t n, std::uint64_t seed, std::uint64_t epoch, const py::array_t<std::int64_t>& points,
             bool inverse, std::uint64_t domain, std::uint64_t table_max, int rounds) {
              if (n == 0 || n >= (std::uint64_t{1} << 63)) throw py::value_error("n must be in [1, 2**63)");
              if (table_max > fastshard::Feistel::kTableMax) throw py::value_error("table_max too large");
              if (rounds < 1 || rounds > fastshard::Feistel::kMaxRounds)
                  throw py::value_error("rounds must be in [1, 32]");
              if (points.ndim() != 1) throw py::value_error("points must be 1-D");
              const auto count = static_cast<std::size_t>(points.shape(0));
              py::array_t<std::int64_t> out(static_cast<py::ssize_t>(count));
              auto* x = reinterpret_cast<std::uint64_t*>(out.mutable_data());
              const auto in = points.unchecked<1>();
              for (std::size_t i = 0; i < count; ++i) {
                  const std::int64_t v = in(static_cast<py::ssize_t>(i));
                  if (v < 0 || static_cast<std::uint64_t>(v) >= n) throw py::value_error("points must be in [0, n)");
                  x[i] = static_cast<std::uint64_t>(v);
              }
              {
                  // Safe without the GIL: `out` is not yet visible to Python.
                  py::gil_scoped_release release;
                  const fastshard::Feistel perm(n, fastshard::derive_key(domain, n, seed, epoch), table_max, rounds);
                  if (inverse) perm.invert(x, count);
                  else perm.apply(x, count);
              }
              return out;
          }, py::arg("n"), py::arg("seed"), py::arg("epoch"), py::arg("points"), py::arg("inverse") = false,
          py::arg("domain") = fastshard::kFeistelDomain, py::arg("table_max") = fastshard::Feistel::kTableMax,
          py::arg("rounds") = fastshard::Feistel::kRounds,
          "Private, for tests: P(x) (or P^-1(x) with `inverse`) for each point x in [0, n) of the order of "
          "(n, seed, epoch) under `domain` (1: the feistel sampler's order; PACKED_DOMAIN: the packed "
          "document order), with the small-domain table limited to table_max and the given rounds.");
    m.def("torch_randperm", [](std::uint64_t n, std::uint32_t seed, const std::string& algorithm) {
              const auto a = parse_torch_shuffle(algorithm, "algorithm");
              if (n > (std::uint64_t{1} << 32)) throw py::value_error("n must be <= 2**32");
              if (a == fastshard::TorchAlgorithm::fisher_yates && n == (std::uint64_t{1} << 32))
                  throw py::value_error("fisher_yates needs n < 2**32");
              py::array_t<std::int64_t> out(static_cast<py::ssize_t>(n));
              std::int64_t* data = out.mutable_data();
              {
                  // Safe without the GIL: `out` is not yet visible to Python.
                  py::gil_scoped_release release;
                  fastshard::torch_randperm(data, n, seed, a);
              }
              return out;
          }, py::arg("n"), py::arg("seed"), py::arg("algorithm") = "auto",
          "torch.randperm(n) from torch.Generator().manual_seed(seed), seed in [0, 2**32), "
          "computed without torch; `algorithm` forces one of torch's two (for tests).");
    m.def("plan_lengths", [](std::uint64_t n, std::uint64_t num_replicas, std::uint64_t rank, bool drop_last,
                             bool pad, std::uint64_t cursor) {
              const auto plan = checked_plan(n, num_replicas, rank, drop_last, pad, cursor);
              return py::make_tuple(plan.num_samples, plan.total_size);
          }, py::arg("n"), py::arg("num_replicas"), py::arg("rank"), py::arg("drop_last"), py::arg("pad"),
          py::arg("cursor"), "(num_samples, total_size) of a plan, without building any order.");
    m.def("_failing_shard", [](std::uint64_t n, std::uint64_t fail_at, const std::string& error) {
              if (error != "bad_alloc" && error != "runtime")
                  throw py::value_error("error must be 'bad_alloc' or 'runtime'");
              const auto plan = checked_plan(n, 1, 0, false, true, 0);
              return PyShard{std::make_shared<FailingShard>(plan, fail_at, error == "bad_alloc")};
          }, py::arg("n"), py::arg("fail_at"), py::arg("error"),
          "For tests: items 0..n-1 in order, but filling item `fail_at` throws the C++ `error`.");
    m.def("get_num_threads", &fastshard::default_threads);
    m.def("set_num_threads", [](unsigned t) { fastshard::set_default_threads(t); }, py::arg("threads"));
    m.attr("FEISTEL_ROUNDS") = fastshard::Feistel::kRounds;
    m.attr("BLOCK_DOMAIN") = fastshard::kBlockDomain;
    m.attr("FEISTEL_TABLE_MAX") = fastshard::Feistel::kTableMax;
}
