// Safetensors header validation: each malformed header is rejected with a message naming what
// was wrong, expected and actual; a valid file round-trips; sharded indexes resolve.
#include <doctest/doctest.h>

#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tests/worker/model/temp_dir.hpp"
#include "worker/model/safetensors.hpp"
#include "worker/model/safetensors_writer.hpp"

using namespace servedeck::worker;
using servedeck::test::TempDir;

namespace {

std::string parse_error(const std::vector<std::byte>& file) {
  try {
    parse_safetensors_header(file, "x.safetensors");
  } catch (const SafetensorsError& e) {
    return e.what();
  }
  return "<no error>";
}

std::string parse_error(const std::string& header, std::size_t data_bytes) {
  std::vector<std::byte> data(data_bytes, std::byte{0});
  return parse_error(raw_safetensors(header, data));
}

void write_bytes(const std::string& path, const std::vector<std::byte>& b) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}

}  // namespace

TEST_CASE("a valid header parses with shapes, dtypes and offsets") {
  const std::string h =
      R"({"__metadata__":{"format":"pt"},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]},)"
      R"("a":{"dtype":"BF16","shape":[2],"data_offsets":[0,4]},"z":{"dtype":"F16","shape":[0],"data_offsets":[12,12]}})";
  std::vector<std::byte> data(12, std::byte{1});
  const auto file = raw_safetensors(h, data);
  const auto hdr = parse_safetensors_header(file, "ok.safetensors");
  REQUIRE(hdr.tensors.size() == 3);
  CHECK(hdr.metadata.at("format") == "pt");
  CHECK(hdr.data_offset == 8 + h.size());
  const TensorInfo* a = hdr.find("a");
  REQUIRE(a);
  CHECK(a->dtype == Dtype::bf16);
  CHECK(a->shape == std::vector<std::int64_t>{2});
  CHECK(a->byte_size() == 4);
  CHECK(hdr.find("b")->dtype == Dtype::f32);
  CHECK(hdr.find("missing") == nullptr);
}

TEST_CASE("header length: shorter than 8 bytes, over the limit, past the end of the file") {
  CHECK(parse_error(std::vector<std::byte>(5)) ==
        "x.safetensors: file is 5 bytes, shorter than the 8-byte header length");
  std::vector<std::byte> huge(16, std::byte{0});
  huge[4] = std::byte{1};  // N = 2^32
  CHECK(parse_error(huge) == "x.safetensors: header length 4294967296 exceeds the limit of 104857600 bytes");
  std::vector<std::byte> past(16, std::byte{0});
  past[0] = std::byte{100};
  CHECK(parse_error(past) == "x.safetensors: header length 100 exceeds the 8 bytes after the length field");
}

TEST_CASE("bad JSON and non-object JSON") {
  CHECK(parse_error("{\"a\": [1, 2", 0) == "x.safetensors: header is not valid JSON");
  CHECK(parse_error("[1, 2, 3]", 0) == "x.safetensors: header: expected a JSON object, got array");
}

TEST_CASE("dtypes: F8_E4M3 and U8 are one byte; unknown dtypes list the supported ones") {
  const std::string h = R"({"f":{"dtype":"F8_E4M3","shape":[4],"data_offsets":[0,4]},)"
                        R"("u":{"dtype":"U8","shape":[2, 2],"data_offsets":[4,8]}})";
  const auto file = raw_safetensors(h, std::vector<std::byte>(8, std::byte{0}));
  const auto hdr = parse_safetensors_header(file, "q.safetensors");
  CHECK(hdr.find("f")->dtype == Dtype::f8_e4m3);
  CHECK(hdr.find("u")->dtype == Dtype::u8);
  CHECK(!is_plain_float(Dtype::f8_e4m3));
  CHECK(is_plain_float(Dtype::bf16));
  // a one-byte dtype still has its shape product checked against the span
  CHECK(parse_error(R"({"w":{"dtype":"F8_E4M3","shape":[4],"data_offsets":[0,8]}})", 8) ==
        "x.safetensors: tensor 'w': shape [4] x F8_E4M3 needs 4 bytes, data_offsets span 8");
  CHECK(parse_error(R"({"w":{"dtype":"F8_E5M2","shape":[4],"data_offsets":[0,4]}})", 4) ==
        "x.safetensors: tensor 'w': unsupported dtype 'F8_E5M2' (supported: BF16, F16, F32, F8_E4M3, U8)");
  CHECK(parse_error(R"({"w":{"dtype":"I64","shape":[1],"data_offsets":[0,8]}})", 8) ==
        "x.safetensors: tensor 'w': unsupported dtype 'I64' (supported: BF16, F16, F32, F8_E4M3, U8)");
  CHECK(parse_error(R"({"w":{"shape":[1],"data_offsets":[0,4]}})", 4) ==
        "x.safetensors: tensor 'w': expected a string \"dtype\"");
}

TEST_CASE("offsets outside the data section, reversed, or malformed") {
  CHECK(parse_error(R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 8) ==
        "x.safetensors: tensor 'w': data_offsets end 16 is past the data section of 8 bytes");
  CHECK(parse_error(R"({"w":{"dtype":"F32","shape":[0],"data_offsets":[8,4]}})", 8) ==
        "x.safetensors: tensor 'w': data_offsets begin 8 > end 4");
  CHECK(parse_error(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[-4,0]}})", 8) ==
        "x.safetensors: tensor 'w': expected \"data_offsets\" [begin, end] of non-negative integers");
  CHECK(parse_error(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0]}})", 8) ==
        "x.safetensors: tensor 'w': expected \"data_offsets\" [begin, end] of non-negative integers");
}

TEST_CASE("overlapping spans name both tensors and their byte ranges") {
  CHECK(parse_error(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                    R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                    12) == "x.safetensors: tensor 'b' bytes [4, 12) overlap tensor 'a' bytes [0, 8)");
  // A zero-sized tensor between two overlapping ones does not hide the overlap.
  CHECK(parse_error(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                    R"("e":{"dtype":"F32","shape":[0],"data_offsets":[4,4]},)"
                    R"("c":{"dtype":"F32","shape":[1],"data_offsets":[6,10]}})",
                    12) == "x.safetensors: tensor 'c' bytes [6, 10) overlap tensor 'a' bytes [0, 8)");
}

TEST_CASE("shape x dtype size must equal the byte span") {
  CHECK(parse_error(R"({"w":{"dtype":"BF16","shape":[3,4],"data_offsets":[0,16]}})", 16) ==
        "x.safetensors: tensor 'w': shape [3, 4] x BF16 needs 24 bytes, data_offsets span 16");
  CHECK(parse_error(R"({"w":{"dtype":"F32","shape":[2,-1],"data_offsets":[0,8]}})", 8) ==
        "x.safetensors: tensor 'w': shape entries must be integers in [0, 2^40], got -1");
  CHECK(parse_error(R"({"w":{"dtype":"F32","shape":[1099511627776,1099511627776],"data_offsets":[0,8]}})", 8) ==
        "x.safetensors: tensor 'w': shape product overflows");
}

TEST_CASE("write_safetensors round-trips through SafetensorsFile with 8-byte aligned data") {
  TempDir dir;
  std::vector<TensorToWrite> ts(2);
  ts[0] = {"w", Dtype::f32, {2, 2}, std::vector<std::byte>(16)};
  for (int i = 0; i < 4; ++i) {
    const float v = static_cast<float>(i) + 0.5f;
    std::memcpy(ts[0].data.data() + 4 * i, &v, 4);
  }
  ts[1] = {"b", Dtype::bf16, {3}, std::vector<std::byte>(6, std::byte{7})};
  const auto path = dir / "m.safetensors";
  write_safetensors(path, ts, {{"format", "pt"}});
  auto f = SafetensorsFile::open(path);
  CHECK(f->header().data_offset % 8 == 0);
  const TensorInfo* w = f->header().find("w");
  REQUIRE(w);
  const auto bytes = f->bytes(*w);
  REQUIRE(bytes.size() == 16);
  float third = 0;
  std::memcpy(&third, bytes.data() + 8, 4);
  CHECK(third == 2.5f);
  CHECK(f->bytes(*f->header().find("b"))[5] == std::byte{7});
  CHECK(float_to_bf16(1.0f) == 0x3f80);
  CHECK(float_to_bf16(-2.0f) == 0xc000);
}

TEST_CASE("SafetensorsFile::open names the path on a missing or bad file") {
  TempDir dir;
  CHECK_THROWS_WITH_AS(SafetensorsFile::open(dir / "nope.safetensors"),
                       doctest::Contains("nope.safetensors: cannot open"), SafetensorsError);
  write_bytes(dir / "bad.safetensors", raw_safetensors("{oops", {}));
  CHECK_THROWS_WITH_AS(SafetensorsFile::open(dir / "bad.safetensors"),
                       doctest::Contains("bad.safetensors: header is not valid JSON"), SafetensorsError);
}

TEST_CASE("sharded checkpoints resolve through model.safetensors.index.json") {
  TempDir dir;
  std::vector<TensorToWrite> s1{{"a", Dtype::f32, {1}, std::vector<std::byte>(4)}};
  std::vector<TensorToWrite> s2{{"b", Dtype::bf16, {2}, std::vector<std::byte>(4)},
                                {"c", Dtype::f16, {1}, std::vector<std::byte>(2)}};
  write_safetensors(dir / "m-1.safetensors", s1);
  write_safetensors(dir / "m-2.safetensors", s2);
  auto write_index = [&](const nlohmann::json& wm) {
    std::ofstream(dir / "model.safetensors.index.json") << nlohmann::json{{"weight_map", wm}}.dump();
  };

  write_index({{"a", "m-1.safetensors"}, {"b", "m-2.safetensors"}, {"c", "m-2.safetensors"}});
  const auto set = TensorSet::open_dir(dir.path());
  CHECK(set.names() == std::vector<std::string>{"a", "b", "c"});
  CHECK(set.files().size() == 2);
  REQUIRE(set.find("b").info);
  CHECK(set.find("b").info->dtype == Dtype::bf16);
  CHECK(*set.find("b").file == dir / "m-2.safetensors");
  CHECK(set.find("zz").info == nullptr);

  write_index({{"a", "m-1.safetensors"}, {"b", "m-1.safetensors"}});
  CHECK_THROWS_WITH_AS(TensorSet::open_dir(dir.path()),
                       doctest::Contains("weight_map puts 'b' in 'm-1.safetensors', which has no such tensor"),
                       SafetensorsError);
  write_index({{"a", "m-9.safetensors"}});
  CHECK_THROWS_WITH_AS(TensorSet::open_dir(dir.path()),
                       doctest::Contains("weight_map['a'] names 'm-9.safetensors', which does not exist"),
                       SafetensorsError);
  write_index({{"a", "../m-1.safetensors"}});
  CHECK_THROWS_WITH_AS(TensorSet::open_dir(dir.path()), doctest::Contains("expected a file name in the checkpoint directory"),
                       SafetensorsError);
  // A tensor present in two shards is refused.
  std::vector<TensorToWrite> s3{{"a", Dtype::f32, {1}, std::vector<std::byte>(4)}};
  write_safetensors(dir / "m-3.safetensors", s3);
  write_index({{"a", "m-1.safetensors"}, {"b", "m-3.safetensors"}});
  CHECK_THROWS_WITH_AS(TensorSet::open_dir(dir.path()), doctest::Contains("which has no such tensor"), SafetensorsError);
  std::vector<TensorToWrite> s4{{"a", Dtype::f32, {1}, std::vector<std::byte>(4)},
                                {"d", Dtype::f32, {1}, std::vector<std::byte>(4)}};
  write_safetensors(dir / "m-4.safetensors", s4);
  write_index({{"a", "m-1.safetensors"}, {"d", "m-4.safetensors"}});
  CHECK_THROWS_WITH_AS(TensorSet::open_dir(dir.path()), doctest::Contains("tensor 'a' appears in both"), SafetensorsError);
}

TEST_CASE("a directory without safetensors says what it looked for") {
  TempDir dir;
  CHECK_THROWS_WITH_AS(TensorSet::open_dir(dir.path()),
                       doctest::Contains("expected model.safetensors or model.safetensors.index.json, found neither"),
                       SafetensorsError);
}
