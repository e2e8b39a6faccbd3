#include "fastshard/tar.hpp"

#include <algorithm>
#include <cstring>

namespace fastshard {

namespace {

constexpr std::uint64_t kBlock = 512;
// An extension header (long name, pax records) larger than this is not a sample's name.
constexpr std::uint64_t kMaxExtension = std::uint64_t{1} << 24;

std::uint64_t padded(std::uint64_t n) {
    if (n > ~std::uint64_t{0} - kBlock) throw TarFormatError("member size out of range");
    return (n + kBlock - 1) / kBlock * kBlock;
}

// A NUL-terminated field (tarfile's nts).
std::string_view field(const char* p, std::size_t n) {
    std::size_t len = 0;
    while (len < n && p[len] != '\0') ++len;
    return {p, len};
}

// Python's str.strip() on ASCII text.
bool is_space(char c) {
    return c == ' ' || (c >= '\t' && c <= '\r') || (c >= '\x1c' && c <= '\x1f');
}

// A number outside [0, 2**64 - 1): negative, or too large for any file.
constexpr std::uint64_t kOutOfRange = ~std::uint64_t{0};

// A number field (tarfile's nti): octal text, or base-256 when the first byte is 0x80 (0xff:
// negative). False where tarfile finds the header invalid; kOutOfRange for a valid field whose
// number no size or checksum can be (tarfile takes it, then fails to seek past it).
bool number(const char* p, std::size_t n, std::uint64_t& out) {
    const auto c0 = static_cast<unsigned char>(p[0]);
    if (c0 == 0x80 || c0 == 0xff) {
        out = kOutOfRange;
        if (c0 == 0xff) return true;
        std::uint64_t v = 0;
        for (std::size_t i = 1; i < n; ++i) {
            if (v >> 56) return true;
            v = (v << 8) | static_cast<unsigned char>(p[i]);
        }
        if (v == kOutOfRange) return true;
        out = v;
        return true;
    }
    // int(text.strip() or "0", 8): a sign, a "0o" prefix and single underscores between
    // digits (or after the prefix) are valid too.
    std::string_view s = field(p, n);
    while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
    while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
    bool negative = false;
    if (!s.empty() && (s.front() == '+' || s.front() == '-')) {
        negative = s.front() == '-';
        s.remove_prefix(1);
        if (s.empty()) return false;
    }
    bool underscore_ok = false;  // an underscore may come next
    if (s.size() >= 2 && s[0] == '0' && (s[1] == 'o' || s[1] == 'O')) {
        s.remove_prefix(2);
        if (s.empty()) return false;
        underscore_ok = true;
    }
    std::uint64_t v = 0;
    bool big = false;
    bool last_underscore = false;
    for (char c : s) {
        if (c == '_') {
            if (!underscore_ok) return false;
            underscore_ok = false;
            last_underscore = true;
            continue;
        }
        if (c < '0' || c > '7') return false;
        if (v >> 60) big = true;
        v = v * 8 + static_cast<std::uint64_t>(c - '0');
        underscore_ok = true;
        last_underscore = false;
    }
    if (last_underscore) return false;
    out = (big || (negative && v != 0) || v == kOutOfRange) ? kOutOfRange : v;
    return true;
}

bool checksum_ok(const char* b) {
    std::uint64_t stored = 0;
    if (!number(b + 148, 8, stored) || stored == kOutOfRange) return false;
    // tarfile accepts the sum of the bytes read as unsigned or as signed chars, with the
    // checksum field itself counted as 8 spaces.
    std::int64_t u = 256;
    std::int64_t s = 256;
    for (std::size_t i = 0; i < kBlock; ++i) {
        if (i >= 148 && i < 156) continue;
        u += static_cast<unsigned char>(b[i]);
        s += static_cast<signed char>(b[i]);
    }
    return static_cast<std::int64_t>(stored) == u || static_cast<std::int64_t>(stored) == s;
}

bool all_zero(const char* b) {
    for (std::size_t i = 0; i < kBlock; ++i)
        if (b[i] != '\0') return false;
    return true;
}

// What one pax header says of the member after it (the last record of a key wins).
struct PaxRecords {
    std::string path;
    bool has_path = false;
    std::uint64_t size = 0;
    bool has_size = false;
};

// pax records "LEN KEY=VALUE\n", parsed as tarfile parses them (its regex r"(\d+) ([^=]+)=",
// the value sliced up to the record's end and clamped to the buffer). Records that would give
// every following member a path or size ('g' headers) or describe a sparse file are refused
// rather than read differently from tarfile.
PaxRecords pax_records(const std::string& buf, bool global) {
    PaxRecords out;
    std::size_t pos = 0;
    while (pos < buf.size()) {
        std::size_t i = pos;
        std::uint64_t len = 0;
        bool huge = false;  // past any buffer: the value runs to the buffer's end
        for (; i < buf.size() && buf[i] >= '0' && buf[i] <= '9'; ++i) {
            if (len >= (std::uint64_t{1} << 40)) huge = true;
            else len = len * 10 + static_cast<std::uint64_t>(buf[i] - '0');
        }
        if (i == pos || i >= buf.size() || buf[i] != ' ') break;
        const std::size_t eq = buf.find('=', i + 1);
        if (eq == std::string::npos || eq == i + 1) break;
        if (len == 0 && !huge) throw TarFormatError("pax header with a record of length 0");
        const std::uint64_t end = huge ? ~std::uint64_t{0} : pos + len;  // past the "\n"
        const std::size_t stop = static_cast<std::size_t>(std::min<std::uint64_t>(end - 1, buf.size()));
        const std::string key = buf.substr(i + 1, eq - i - 1);
        const std::string value = stop > eq + 1 ? buf.substr(eq + 1, stop - eq - 1) : std::string();
        if (key.rfind("GNU.sparse.", 0) == 0) throw TarFormatError("GNU sparse members are not supported");
        if ((key == "path" || key == "size") && global)
            throw TarFormatError("a global pax header sets '" + key +
                                 "' for every member: not supported");
        if (key == "path") {
            out.path = value;
            while (!out.path.empty() && out.path.back() == '/') out.path.pop_back();
            out.has_path = true;
        } else if (key == "size") {
            std::uint64_t v = 0;
            bool ok = !value.empty();
            for (char c : value) {
                if (c < '0' || c > '9' || v > (std::uint64_t{1} << 58)) {
                    ok = false;
                    break;
                }
                v = v * 10 + static_cast<std::uint64_t>(c - '0');
            }
            if (!ok) throw TarFormatError("pax header with an invalid size");
            out.size = v;
            out.has_size = true;
        }
        if (end >= buf.size()) break;
        pos = static_cast<std::size_t>(end);
    }
    return out;
}

char lower_ascii(char c) { return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c; }

bool is_meta(std::string_view name) {
    // tarfile's match of r"__[^/]*__($|/)" at the start of the name.
    const std::size_t slash = name.find('/');
    const std::string_view first = name.substr(0, slash);
    if (first.size() >= 4 && first.substr(0, 2) == "__" && first.substr(first.size() - 2) == "__")
        return true;
    // `$` also matches before a final newline.
    return slash == std::string_view::npos && first.size() >= 5 && first.substr(0, 2) == "__" &&
           first.substr(first.size() - 3) == "__\n";
}

}  // namespace

bool split_member_name(std::string_view name, std::string_view& key, std::string_view& ext) {
    if (is_meta(name)) return false;
    // The match of r"^((?:.*/|)[^.]+)[.]([^/]*)$": the key's last run of non-dots starts at the
    // start of the name or after a slash that `.*` reaches (no newline before it), tried from
    // the last such slash back; the key ends at the first dot after that start, and the
    // extension, after it, holds no slash.
    const std::size_t newline = name.find('\n');
    std::size_t from = name.size();
    while (true) {
        std::size_t start = 0;
        bool more = false;
        if (from > 0) {
            const std::size_t slash = name.rfind('/', from - 1);
            if (slash != std::string_view::npos) {
                start = slash + 1;
                more = true;
                from = slash;
            }
        }
        const bool reachable = start == 0 || newline == std::string_view::npos || newline > start - 1;
        if (reachable) {
            const std::size_t dot = name.find('.', start);
            if (dot != std::string_view::npos && dot > start &&
                name.find('/', dot + 1) == std::string_view::npos) {
                key = name.substr(0, dot);
                ext = name.substr(dot + 1);
                return true;
            }
        }
        if (!more) return false;
    }
}

void TarWalker::advance(std::uint64_t size, const char* what) {
    // A size field can hold up to 2**88 (base-256): the offset must not wrap back to an
    // earlier header, which would walk the same headers forever.
    const std::uint64_t span = padded(size);
    if (span > ~std::uint64_t{0} - pos_)
        throw TarFormatError(std::string(what) + " at byte " + std::to_string(pos_) + " has a size (" +
                             std::to_string(size) + ") that runs past the end of the file");
    pos_ += span;
}

bool TarWalker::header(char* block, bool subsequent) {
    const std::size_t got = read_(pos_, block, kBlock);
    const bool first = first_;
    first_ = false;
    if (got == 0 && data_end_ == pos_ && pos_ > 0) {
        // Nothing where the next header would be: the file must still hold the last byte of
        // the member before (tarfile reads it to tell a complete archive without end blocks
        // from a cut one).
        char last = 0;
        if (read_(pos_ - 1, &last, 1) == 0)
            throw TarFormatError("the file ends inside the data of member '" + data_name_ +
                                 "' (cut short? the member needs " + std::to_string(pos_) +
                                 " bytes of file)");
    }
    data_end_ = 0;
    if (got < kBlock) {
        if (first && got == 0) throw NotTarError("empty file");
        if (first) throw NotTarError("truncated header");
        if (subsequent) throw TarFormatError("truncated header after an extension header");
        return false;
    }
    if (all_zero(block)) {
        if (subsequent) throw TarFormatError("end of archive after an extension header");
        return false;
    }
    std::uint64_t size = 0;
    // tarfile reads every number field of a header, and finds the header invalid when one
    // is not a number.
    static constexpr std::size_t kNumbers[][2] = {{100, 8}, {108, 8}, {116, 8}, {136, 12}, {329, 8}, {337, 8}};
    bool numbers = true;
    for (const auto& f : kNumbers) {
        std::uint64_t ignored = 0;
        numbers = numbers && number(block + f[0], f[1], ignored);
    }
    if (!checksum_ok(block) || !number(block + 124, 12, size) || !numbers) {
        if (first) throw NotTarError("invalid header (a bad checksum or number field)");
        if (subsequent) throw TarFormatError("invalid header after an extension header");
        return false;
    }
    if (size == kOutOfRange)
        throw TarFormatError("the header at byte " + std::to_string(pos_) +
                             " gives a negative size or one of 2**64 bytes or more");
    return true;
}

bool TarWalker::next(TarMember& m) {
    char b[kBlock];
    m.header = pos_;
    std::string long_name;
    bool has_name = false;
    std::uint64_t size_override = 0;
    bool has_size = false;
    bool subsequent = false;
    bool extended = false;
    while (true) {
        if (!header(b, subsequent)) return false;
        const char type = b[156];
        std::uint64_t size = 0;
        number(b + 124, 12, size);  // checked in header()
        pos_ += kBlock;
        if (type == 'L' || type == 'K' || type == 'x' || type == 'X' || type == 'g') {
            if (type == 'L' || type == 'x' || type == 'X' || type == 'g') {
                if (size > kMaxExtension) throw TarFormatError("extension header too large");
                // The whole padded block, as tarfile reads it: a long name ends at its first
                // NUL, which may lie past the size the header gives.
                std::string data(static_cast<std::size_t>(padded(size)), '\0');
                if (read_(pos_, data.data(), data.size()) < data.size())
                    throw TarFormatError("truncated extension header");
                // The outermost of a chain of extension headers wins, as in tarfile.
                if (type == 'L' && !has_name) {
                    const std::string_view n = field(data.data(), data.size());
                    long_name.assign(n.data(), n.size());
                    has_name = true;
                } else if (type != 'L') {
                    // The outermost header of a chain wins, key by key.
                    const PaxRecords pax = pax_records(data, type == 'g');
                    if (pax.has_path && !has_name) {
                        long_name = pax.path;
                        has_name = true;
                    }
                    if (pax.has_size && !has_size) {
                        size_override = pax.size;
                        has_size = true;
                    }
                }
            }
            advance(size, "an extension header");
            if (type == 'g' && !extended) m.header = pos_;  // global headers are skipped
            if (type != 'g') extended = true;
            subsequent = true;
            continue;
        }
        const std::string_view short_name = field(b, 100);
        bool dir = type == '5' || (type == '\0' && !short_name.empty() && short_name.back() == '/');
        if (type == 'S') throw TarFormatError("GNU sparse members are not supported");
        if (has_name) {
            m.name = long_name;
        } else {
            const std::string_view prefix = field(b + 345, 155);
            m.name.clear();
            if (!prefix.empty()) {
                m.name.assign(prefix.data(), prefix.size());
                m.name += '/';
            }
            m.name.append(short_name.data(), short_name.size());
        }
        if (has_size) size = size_override;
        m.regular = !dir && (type == '0' || type == '\0' || type == '7');
        // tarfile skips the data of regular members and of types it does not know; links,
        // devices, FIFOs and directories have none.
        const bool known_empty = dir || (type >= '1' && type <= '6');
        m.data = pos_;
        m.size = size;
        if (!known_empty && size > 0) {
            data_name_ = m.name;
            advance(size, ("member '" + m.name + "'").c_str());
            data_end_ = pos_;
        }
        m.next = pos_;
        return true;
    }
}

namespace {

// Groups members into samples; returns true when the member starts a new sample.
class Grouper {
public:
    explicit Grouper(const std::string& name) : name_(name) {}

    // -1: not a sample field; 0: a field of the current sample; 1: the first of a new one.
    int add(const TarMember& m, bool check) {
        if (!m.regular) return -1;
        std::string_view key;
        std::string_view ext;
        if (!split_member_name(m.name, key, ext)) return -1;
        ext_.assign(ext.data(), ext.size());
        for (char& c : ext_) c = lower_ascii(c);
        if (!has_ || key != key_) {
            key_.assign(key.data(), key.size());
            has_ = true;
            exts_.clear();
            if (check) exts_.push_back(ext_);
            return 1;
        }
        if (check) {
            if (std::find(exts_.begin(), exts_.end(), ext_) != exts_.end())
                throw TarFormatError(name_ + ": sample '" + key_ + "' has two members with extension '" +
                                     ext_ + "'");
            exts_.push_back(ext_);
        }
        return 0;
    }

    const std::string& key() const { return key_; }
    const std::string& ext() const { return ext_; }

private:
    const std::string& name_;
    std::string key_;
    std::string ext_;
    std::vector<std::string> exts_;
    bool has_ = false;
};

}  // namespace

TarScan scan_tar(const ReadAt& read, std::uint64_t every, const std::string& name) {
    if (every == 0) throw std::invalid_argument("every must be >= 1");
    TarScan s;
    TarWalker walker(read, 0, true);
    Grouper group(name);
    TarMember m;
    while (walker.next(m)) {
        const int kind = group.add(m, true);
        if (kind < 0) continue;
        if (kind == 1) {
            if (s.samples % every == 0) s.offsets.push_back(m.header);
            ++s.samples;
        }
        s.end = m.next;
    }
    return s;
}

std::uint64_t skip_tar_samples(const ReadAt& read, std::uint64_t offset, std::uint64_t samples,
                               std::uint64_t& found, const std::string& name) {
    found = 0;
    if (samples == 0) return offset;
    TarWalker walker(read, offset, offset == 0);
    Grouper group(name);
    TarMember m;
    std::uint64_t end = offset;
    bool any = false;
    while (walker.next(m)) {
        const int kind = group.add(m, false);
        if (kind < 0) continue;
        if (kind == 1) {
            if (any && found == samples) return m.header;
            any = true;
            ++found;
        }
        end = m.next;
    }
    return end;
}

std::vector<TarSample> parse_tar_block(const char* buf, std::size_t n, const std::string& name) {
    const ReadAt read = [buf, n](std::uint64_t off, char* out, std::size_t k) -> std::size_t {
        if (off >= n) return 0;
        const std::size_t m = static_cast<std::size_t>(std::min<std::uint64_t>(k, n - off));
        std::memcpy(out, buf + off, m);
        return m;
    };
    std::vector<TarSample> out;
    TarWalker walker(read, 0, false);
    Grouper group(name);
    TarMember m;
    while (walker.next(m)) {
        const int kind = group.add(m, true);
        if (kind < 0) continue;
        if (m.data > n || m.size > n - m.data)
            throw TarFormatError(name + ": the file ends inside the data of member '" + m.name +
                                 "' (cut short?)");
        if (kind == 1) out.push_back(TarSample{group.key(), {}});
        out.back().fields.push_back(TarField{group.ext(), m.data, m.size});
    }
    return out;
}

}  // namespace fastshard
