// WebDataset-style tar shards: counting samples and finding their byte offsets from the member
// headers alone, and cutting a block of bytes that holds whole samples into their fields.
//
// Members are read as CPython's tarfile reads them (ustar prefix + name, GNU long names 'L',
// pax 'x' headers with path= and size=; global 'g' headers skipped), and grouped into samples as
// webdataset groups them: consecutive regular members with the same key, where the key of
// "dir/key.ext1.ext2" ends at the first dot of the last path component; members named "__*__"
// and names that do not split are skipped; extensions are lower-cased (ASCII) and a sample may
// not hold one twice.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace fastshard {

// Reads up to n bytes at offset into buf; returns how many it read (fewer only at the end).
using ReadAt = std::function<std::size_t(std::uint64_t offset, char* buf, std::size_t n)>;

// The file is not a tar archive at all (its first header is not one): e.g. a compressed tar.
struct NotTarError : std::runtime_error {
    using std::runtime_error::runtime_error;
};

// The archive is a tar file, but its members cannot be grouped into samples.
struct TarFormatError : std::runtime_error {
    using std::runtime_error::runtime_error;
};

struct TarMember {
    std::uint64_t header = 0;  // offset of its first header block (extension headers included)
    std::uint64_t data = 0;    // offset of its data
    std::uint64_t size = 0;    // bytes of data
    std::uint64_t next = 0;    // offset of the next member's first header
    std::string name;
    bool regular = false;
};

// Walks the members of an archive from a header offset, reading headers only.
class TarWalker {
public:
    TarWalker(const ReadAt& read, std::uint64_t offset, bool archive_start)
        : read_(read), pos_(offset), first_(archive_start) {}

    // The next member, or false at the end of the archive (a zero block, a short or invalid
    // header after the first). Throws NotTarError when the archive's first header is invalid,
    // and TarFormatError when a member's data runs past the end of the file (tarfile's
    // "unexpected end of data") or past the largest offset there is. The offset grows by at
    // least a block each step, so every walk ends.
    bool next(TarMember& m);

private:
    bool header(char* block, bool subsequent);
    void advance(std::uint64_t size, const char* what);
    const ReadAt& read_;
    std::uint64_t pos_;
    bool first_;
    // Where the latest member's data ended (0: no data) and its name: the file must reach
    // that far, as tarfile checks before it reads the next header.
    std::uint64_t data_end_ = 0;
    std::string data_name_;
};

// A member name split as webdataset splits it; false for members that are not sample fields.
bool split_member_name(std::string_view name, std::string_view& key, std::string_view& ext);

struct TarScan {
    std::uint64_t samples = 0;
    std::vector<std::uint64_t> offsets;  // first header of samples 0, every, 2 * every, ...
    std::uint64_t end = 0;               // just past the last sample's last member
};

// Counts the samples of an archive, keeping the offset of every `every`-th sample.
TarScan scan_tar(const ReadAt& read, std::uint64_t every, const std::string& name);

// From a header offset where a sample starts, the offset where the `samples`-th sample after it
// starts (or just past the last sample); `found` says how many samples lay in between.
std::uint64_t skip_tar_samples(const ReadAt& read, std::uint64_t offset, std::uint64_t samples,
                               std::uint64_t& found, const std::string& name);

struct TarField {
    std::string ext;
    std::uint64_t data = 0;  // offset in the block
    std::uint64_t size = 0;
};

struct TarSample {
    std::string key;
    std::vector<TarField> fields;
};

// The samples held by buf[0, n), which starts at a sample's first header and ends where a
// sample starts (or at the archive's end). Throws TarFormatError when a field's data runs past
// the block or a sample holds an extension twice.
std::vector<TarSample> parse_tar_block(const char* buf, std::size_t n, const std::string& name);

}  // namespace fastshard
