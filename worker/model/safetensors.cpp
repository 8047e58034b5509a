#include "worker/model/safetensors.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

namespace servedeck::worker {

namespace {

using json = nlohmann::json;

[[noreturn]] void fail(std::string_view file, const std::string& what) {
  throw SafetensorsError(std::string(file) + ": " + what);
}

bool parse_dtype(std::string_view s, Dtype& out) {
  if (s == "BF16") { out = Dtype::bf16; return true; }
  if (s == "F16") { out = Dtype::f16; return true; }
  if (s == "F32") { out = Dtype::f32; return true; }
  if (s == "F8_E4M3") { out = Dtype::f8_e4m3; return true; }
  if (s == "U8") { out = Dtype::u8; return true; }
  return false;
}

/// Reads a non-negative integer JSON value; false when it is anything else.
bool read_u64(const json& v, std::uint64_t& out) {
  if (v.is_number_unsigned()) {
    out = v.get<std::uint64_t>();
    return true;
  }
  if (v.is_number_integer() && v.get<std::int64_t>() >= 0) {
    out = static_cast<std::uint64_t>(v.get<std::int64_t>());
    return true;
  }
  return false;
}

TensorInfo parse_tensor(std::string_view file, const std::string& name, const json& entry,
                        std::uint64_t data_size) {
  const std::string where = "tensor '" + name + "'";
  if (!entry.is_object()) fail(file, where + ": expected an object, got " + entry.type_name());
  TensorInfo t;
  t.name = name;

  auto dt = entry.find("dtype");
  if (dt == entry.end() || !dt->is_string())
    fail(file, where + ": expected a string \"dtype\"");
  const auto dtype_text = dt->get<std::string>();
  if (!parse_dtype(dtype_text, t.dtype))
    fail(file, where + ": unsupported dtype '" + dtype_text + "' (supported: BF16, F16, F32, F8_E4M3, U8)");

  auto sh = entry.find("shape");
  if (sh == entry.end() || !sh->is_array()) fail(file, where + ": expected an array \"shape\"");
  std::uint64_t elements = 1;
  for (const auto& d : *sh) {
    std::uint64_t dim = 0;
    if (!read_u64(d, dim) || dim > (1ull << 40))
      fail(file, where + ": shape entries must be integers in [0, 2^40], got " + d.dump());
    if (dim != 0 && elements > (~0ull) / dim) fail(file, where + ": shape product overflows");
    elements *= dim;
    t.shape.push_back(static_cast<std::int64_t>(dim));
  }

  auto off = entry.find("data_offsets");
  if (off == entry.end() || !off->is_array() || off->size() != 2 || !read_u64((*off)[0], t.begin) ||
      !read_u64((*off)[1], t.end))
    fail(file, where + ": expected \"data_offsets\" [begin, end] of non-negative integers");
  if (t.begin > t.end)
    fail(file, where + ": data_offsets begin " + std::to_string(t.begin) + " > end " +
                   std::to_string(t.end));
  if (t.end > data_size)
    fail(file, where + ": data_offsets end " + std::to_string(t.end) +
                   " is past the data section of " + std::to_string(data_size) + " bytes");
  const std::uint64_t esize = dtype_size(t.dtype);
  if (elements > (~0ull) / esize) fail(file, where + ": byte size overflows");
  if (elements * esize != t.byte_size())
    fail(file, where + ": shape " + shape_to_string(t.shape) + " x " + dtype_text + " needs " +
                   std::to_string(elements * esize) + " bytes, data_offsets span " +
                   std::to_string(t.byte_size()));
  return t;
}

}  // namespace

std::string_view to_string(Dtype d) {
  switch (d) {
    case Dtype::bf16: return "BF16";
    case Dtype::f16: return "F16";
    case Dtype::f32: return "F32";
    case Dtype::f8_e4m3: return "F8_E4M3";
    case Dtype::u8: return "U8";
  }
  return "?";
}

std::size_t dtype_size(Dtype d) {
  switch (d) {
    case Dtype::f32: return 4;
    case Dtype::bf16:
    case Dtype::f16: return 2;
    case Dtype::f8_e4m3:
    case Dtype::u8: return 1;
  }
  return 1;
}

bool is_plain_float(Dtype d) { return d == Dtype::bf16 || d == Dtype::f16 || d == Dtype::f32; }

std::uint64_t TensorInfo::element_count() const {
  std::uint64_t n = 1;
  for (auto d : shape) n *= static_cast<std::uint64_t>(d);
  return n;
}

std::string shape_to_string(std::span<const std::int64_t> shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

const TensorInfo* SafetensorsHeader::find(std::string_view name) const {
  for (const auto& t : tensors)
    if (t.name == name) return &t;
  return nullptr;
}

SafetensorsHeader parse_safetensors_header(std::span<const std::byte> file,
                                           std::string_view file_label) {
  if (file.size() < 8)
    fail(file_label, "file is " + std::to_string(file.size()) +
                         " bytes, shorter than the 8-byte header length");
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<std::uint8_t>(file[static_cast<std::size_t>(i)]);
  if (n > k_max_header_bytes)
    fail(file_label, "header length " + std::to_string(n) + " exceeds the limit of " +
                         std::to_string(k_max_header_bytes) + " bytes");
  if (n > file.size() - 8)
    fail(file_label, "header length " + std::to_string(n) + " exceeds the " +
                         std::to_string(file.size() - 8) + " bytes after the length field");
  if (n < 2) fail(file_label, "header length " + std::to_string(n) + " is too short for a JSON object");

  const char* text = reinterpret_cast<const char*>(file.data() + 8);
  json root = json::parse(text, text + n, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) fail(file_label, "header is not valid JSON");
  if (!root.is_object()) fail(file_label, std::string("header: expected a JSON object, got ") + root.type_name());

  SafetensorsHeader h;
  h.header_bytes = n;
  h.data_offset = 8 + n;
  const std::uint64_t data_size = file.size() - h.data_offset;
  for (const auto& [key, value] : root.items()) {
    if (key == "__metadata__") {
      if (!value.is_object()) fail(file_label, "\"__metadata__\": expected an object");
      for (const auto& [mk, mv] : value.items()) {
        if (!mv.is_string()) fail(file_label, "\"__metadata__\"." + mk + ": expected a string");
        h.metadata[mk] = mv.get<std::string>();
      }
      continue;
    }
    h.tensors.push_back(parse_tensor(file_label, key, value, data_size));
  }
  std::sort(h.tensors.begin(), h.tensors.end(), [](const TensorInfo& a, const TensorInfo& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  // note: zero-sized tensors occupy no bytes and cannot overlap anything; each non-empty span
  // is compared with the previous non-empty one (sorted by begin, so that one ends last).
  const TensorInfo* prev = nullptr;
  for (const auto& b : h.tensors) {
    if (!b.byte_size()) continue;
    if (prev && b.begin < prev->end)
      fail(file_label, "tensor '" + b.name + "' bytes [" + std::to_string(b.begin) + ", " + std::to_string(b.end) +
                           ") overlap tensor '" + prev->name + "' bytes [" + std::to_string(prev->begin) + ", " +
                           std::to_string(prev->end) + ")");
    prev = &b;
  }
  return h;
}

std::unique_ptr<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  // A FIFO or device would block the open or the map: regular files only (symlinks followed).
  if (struct stat pre {}; ::stat(path.c_str(), &pre) == 0 && !S_ISREG(pre.st_mode))
    throw SafetensorsError(path + ": not a regular file (a safetensors file was expected)");
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw SafetensorsError(path + ": cannot open: " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int e = errno;
    ::close(fd);
    throw SafetensorsError(path + ": cannot stat: " + std::strerror(e));
  }
  std::unique_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->path_ = path;
  f->map_size_ = static_cast<std::size_t>(st.st_size);
  if (f->map_size_ > 0) {
    void* p = ::mmap(nullptr, f->map_size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      int e = errno;
      ::close(fd);
      throw SafetensorsError(path + ": cannot mmap " + std::to_string(f->map_size_) +
                             " bytes: " + std::strerror(e));
    }
    f->map_ = static_cast<const std::byte*>(p);
  }
  ::close(fd);
  f->header_ = parse_safetensors_header({f->map_, f->map_size_}, path);
  return f;
}

SafetensorsFile::~SafetensorsFile() {
  if (map_) ::munmap(const_cast<std::byte*>(map_), map_size_);
}

std::span<const std::byte> SafetensorsFile::bytes(const TensorInfo& t) const {
  return {map_ + header_.data_offset + t.begin, static_cast<std::size_t>(t.byte_size())};
}

TensorSet TensorSet::open_dir(const std::string& dir) {
  namespace fs = std::filesystem;
  TensorSet set;
  const fs::path index_path = fs::path(dir) / "model.safetensors.index.json";
  const fs::path single_path = fs::path(dir) / "model.safetensors";
  if (fs::exists(index_path)) {
    std::ifstream in(index_path);
    std::stringstream ss;
    ss << in.rdbuf();
    json idx = json::parse(ss.str(), nullptr, false);
    if (idx.is_discarded() || !idx.is_object())
      throw SafetensorsError(index_path.string() + ": not a JSON object");
    auto wm = idx.find("weight_map");
    if (wm == idx.end() || !wm->is_object())
      throw SafetensorsError(index_path.string() + ": expected an object \"weight_map\"");
    std::map<std::string, std::size_t> file_ids;
    for (const auto& [name, file] : wm->items()) {
      if (!file.is_string())
        throw SafetensorsError(index_path.string() + ": weight_map['" + name + "']: expected a file name string");
      const auto fname = file.get<std::string>();
      if (fname.find('/') != std::string::npos || fname == "..")
        throw SafetensorsError(index_path.string() + ": weight_map['" + name +
                               "']: expected a file name in the checkpoint directory, got '" + fname + "'");
      auto it = file_ids.find(fname);
      if (it == file_ids.end()) {
        const auto p = (fs::path(dir) / fname).string();
        if (!fs::exists(p))
          throw SafetensorsError(index_path.string() + ": weight_map['" + name + "'] names '" + fname +
                                 "', which does not exist");
        set.files_.push_back(SafetensorsFile::open(p));
        it = file_ids.emplace(fname, set.files_.size() - 1).first;
      }
      const auto& sf = *set.files_[it->second];
      const TensorInfo* t = sf.header().find(name);
      if (!t)
        throw SafetensorsError(index_path.string() + ": weight_map puts '" + name + "' in '" + fname +
                               "', which has no such tensor");
      set.index_[name] = {it->second, t};
    }
    // A shard may hold tensors the index does not list; they must not duplicate listed ones.
    for (std::size_t i = 0; i < set.files_.size(); ++i)
      for (const auto& t : set.files_[i]->header().tensors) {
        auto it = set.index_.find(t.name);
        if (it == set.index_.end()) {
          set.index_[t.name] = {i, &t};
        } else if (it->second.first != i) {
          throw SafetensorsError("tensor '" + t.name + "' appears in both '" + set.files_[it->second.first]->path() +
                                 "' and '" + set.files_[i]->path() + "'");
        }
      }
  } else if (fs::exists(single_path)) {
    set.files_.push_back(SafetensorsFile::open(single_path.string()));
    for (const auto& t : set.files_[0]->header().tensors) set.index_[t.name] = {0, &t};
  } else {
    throw SafetensorsError(dir + ": expected model.safetensors or model.safetensors.index.json, found neither");
  }
  return set;
}

TensorRef TensorSet::find(std::string_view name) const {
  auto it = index_.find(name);
  if (it == index_.end()) return {};
  const auto& f = *files_[it->second.first];
  return {it->second.second, f.bytes(*it->second.second), &f.path()};
}

std::vector<std::string> TensorSet::names() const {
  std::vector<std::string> out;
  out.reserve(index_.size());
  for (const auto& [k, v] : index_) out.push_back(k);
  return out;
}

}  // namespace servedeck::worker
