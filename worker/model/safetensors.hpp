// Safetensors reading: header validation, mmap of single files, and sharded checkpoints
// (model.safetensors.index.json).
//
// File format (https://huggingface.co/docs/safetensors, "Format" section):
//   8 bytes   N, little-endian uint64: byte length of the JSON header
//   N bytes   JSON object: name -> {"dtype": "BF16", "shape": [..], "data_offsets": [begin, end]}
//             plus an optional "__metadata__" object of string -> string
//   rest      the data section; offsets are relative to its first byte
//
// Every tensor is validated before any byte of it is used: dtype known, shape product times
// dtype size equals end - begin, begin <= end <= data section size, and no two spans overlap.
//
// Thread-safety: a parsed header and an open SafetensorsFile/TensorSet are immutable; reads
// may run concurrently.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace servedeck::worker {

/// Thrown for a malformed or unsupported safetensors file; the message names the file, the
/// tensor (where one is concerned), the expected and the actual value.
struct SafetensorsError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// Element types we read. f8_e4m3 (float8_e4m3fn: FP8 weights, NVFP4 block scales) and u8 (NVFP4's
/// packed e2m1 pairs) appear only in quantised checkpoints (worker/model/quant_format.hpp); the
/// rest are the plain weight types.
enum class Dtype { bf16, f16, f32, f8_e4m3, u8 };

/// The safetensors spelling: "BF16", "F16", "F32", "F8_E4M3", "U8".
std::string_view to_string(Dtype d);
/// Bytes per element: 2, 2, 4, 1, 1.
std::size_t dtype_size(Dtype d);
/// True for BF16, F16 and F32: the types a tensor read as plain numbers may have.
bool is_plain_float(Dtype d);

/// Upper bound on the JSON header length (bytes). note: real checkpoints' headers are tens of
/// KiB to a few MiB (a 1,000-tensor shard is ~150 KiB); 100 MiB only guards against garbage.
inline constexpr std::uint64_t k_max_header_bytes = 100ull * 1024 * 1024;

/// One tensor as the header describes it.
struct TensorInfo {
  std::string name;
  Dtype dtype = Dtype::f32;
  std::vector<std::int64_t> shape;  // row-major, outermost first; [] is a scalar
  std::uint64_t begin = 0;          // byte offset in the data section
  std::uint64_t end = 0;            // one past the last byte

  std::uint64_t byte_size() const { return end - begin; }
  std::uint64_t element_count() const;
};

/// Formats a shape as "[8, 64]".
std::string shape_to_string(std::span<const std::int64_t> shape);

/// A validated header.
struct SafetensorsHeader {
  std::uint64_t header_bytes = 0;       // N, the JSON length
  std::uint64_t data_offset = 0;        // 8 + N: where the data section starts in the file
  std::vector<TensorInfo> tensors;      // in file order (sorted by begin)
  std::map<std::string, std::string> metadata;  // "__metadata__"

  /// nullptr when absent.
  const TensorInfo* find(std::string_view name) const;
};

/// Validates and parses the header of a safetensors file whose full contents (header and data)
/// are `file`. `file_label` names the file in error messages. Throws SafetensorsError; never
/// reads outside `file`.
SafetensorsHeader parse_safetensors_header(std::span<const std::byte> file,
                                           std::string_view file_label);

/// A read-only memory map of one .safetensors file with its validated header.
class SafetensorsFile {
 public:
  /// Maps `path` and validates its header. Throws SafetensorsError (file cannot be opened,
  /// header invalid).
  static std::unique_ptr<SafetensorsFile> open(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const SafetensorsHeader& header() const { return header_; }
  /// The tensor's bytes (validated to lie inside the map).
  std::span<const std::byte> bytes(const TensorInfo& t) const;

 private:
  SafetensorsFile() = default;
  std::string path_;
  const std::byte* map_ = nullptr;
  std::size_t map_size_ = 0;
  SafetensorsHeader header_;
};

/// A tensor resolved in a TensorSet: its description and bytes.
struct TensorRef {
  const TensorInfo* info = nullptr;
  std::span<const std::byte> bytes;
  const std::string* file = nullptr;  // the path of the shard holding it
};

/// All tensors of a checkpoint directory: either `model.safetensors` alone, or the shards that
/// `model.safetensors.index.json` lists in its "weight_map" (name -> file).
class TensorSet {
 public:
  /// Opens `dir`. With an index, every name in weight_map must be present in the shard it names
  /// and no tensor may appear in two shards. Throws SafetensorsError.
  static TensorSet open_dir(const std::string& dir);

  /// nullptr info when absent.
  TensorRef find(std::string_view name) const;
  /// Every tensor name, sorted.
  std::vector<std::string> names() const;
  const std::vector<std::unique_ptr<SafetensorsFile>>& files() const { return files_; }

 private:
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, std::pair<std::size_t, const TensorInfo*>, std::less<>> index_;
};

}  // namespace servedeck::worker
