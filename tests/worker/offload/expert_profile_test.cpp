// The hot-expert profile's file (worker/offload/expert_profile.hpp): a round trip, a missing file
// as "no profile", every malformed file refused with the path and what was read, and the sum a
// run leaves when it captures to the file it was filled from.
#include <doctest/doctest.h>

#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <limits>
#include <stdexcept>
#include <string>

#include "tests/worker/model/temp_dir.hpp"
#include "worker/offload/expert_profile.hpp"

using namespace servedeck::worker::offload;
using servedeck::test::TempDir;

namespace {

void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
  REQUIRE(out.good());
}

/// read_expert_profile's error for a file holding `text`.
std::string refusal(const TempDir& dir, const std::string& text) {
  const std::string path = dir / "p.json";
  write_text(path, text);
  try {
    read_expert_profile(path);
  } catch (const std::runtime_error& e) {
    const std::string what = e.what();
    CHECK(what.find(path) != std::string::npos);
    return what;
  }
  FAIL("accepted: " << text);
  return {};
}

ExpertProfile sample() {
  ExpertProfile p;
  p.layout = expert_profile_layout(2, 3);
  p.counts = {{5, 0, 7}, {1, 2, std::numeric_limits<uint64_t>::max()}};
  return p;
}

}  // namespace

TEST_CASE("a written profile reads back as it was, through a directory the write creates") {
  TempDir dir;
  const std::string path = dir / "state/hot-profiles/glm45-air.json";
  const ExpertProfile p = sample();
  write_expert_profile(p, path);
  const auto back = read_expert_profile(path);
  REQUIRE(back.has_value());
  CHECK(back->layout == "layers=2 experts=3 offloaded=all");
  CHECK(back->counts == p.counts);
  // No temporary file is left beside it.
  int files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir / "state/hot-profiles")) files += e.is_regular_file() ? 1 : 0;
  CHECK(files == 1);
}

TEST_CASE("a missing profile is no profile, not an error") {
  TempDir dir;
  CHECK_FALSE(read_expert_profile(dir / "absent.json").has_value());
  CHECK_FALSE(read_expert_profile(dir / "no-such-dir/absent.json").has_value());
}

TEST_CASE("a malformed profile is refused with what was read and what was expected") {
  TempDir dir;
  CHECK(refusal(dir, "").find("malformed JSON") != std::string::npos);
  CHECK(refusal(dir, "{\"counts\": [[1, 2]").find("malformed JSON") != std::string::npos);
  CHECK(refusal(dir, "[1, 2]").find("read array") != std::string::npos);
  CHECK(refusal(dir, "{\"layout\": \"x\"}").find("no \"counts\" array") != std::string::npos);
  CHECK(refusal(dir, "{\"layout\": 7, \"counts\": []}").find("\"layout\" is 7, expected a string") != std::string::npos);
  CHECK(refusal(dir, "{\"counts\": [[1, 2], 3]}").find("counts[1] is 3, expected an array") != std::string::npos);
  CHECK(refusal(dir, "{\"counts\": [[1, -2]]}").find("counts[0][1] is -2, expected a non-negative integer") != std::string::npos);
  CHECK(refusal(dir, "{\"counts\": [[1.5]]}").find("counts[0][0] is 1.5") != std::string::npos);
  CHECK(refusal(dir, "{\"counts\": [[\"9\"]]}").find("counts[0][0] is \"9\"") != std::string::npos);
  CHECK(refusal(dir, "{\"counts\": [[18446744073709551616]]}").find("counts[0][0]") != std::string::npos);  // 2^64: not a uint64
  CHECK(refusal(dir, "{\"counts\": [[[[[1]]]]]}").find("nested deeper") != std::string::npos);
  std::string many = "{\"counts\": [";
  for (std::size_t l = 0; l <= k_max_profile_layers; ++l) many += l ? ",[]" : "[]";
  CHECK(refusal(dir, many + "]}").find("more than 1024 layers") != std::string::npos);
  std::string wide = "{\"counts\": [[";
  for (std::size_t e = 0; e <= k_max_profile_experts; ++e) wide += e ? ",0" : "0";
  CHECK(refusal(dir, wide + "]]}").find("more than 65536") != std::string::npos);
}

TEST_CASE("a profile path that is a directory, or a file over the size limit, is refused before it is read") {
  TempDir dir;
  std::filesystem::create_directories(dir / "d.json");
  CHECK_THROWS_WITH_AS(read_expert_profile(dir / "d.json"), doctest::Contains("not a regular file"), std::runtime_error);
  const std::string big = dir / "big.json";
  {
    std::ofstream out(big, std::ios::binary);
    out << "{\"counts\": []}";
  }
  std::filesystem::resize_file(big, k_max_profile_bytes + 1);
  CHECK_THROWS_WITH_AS(read_expert_profile(big), doctest::Contains("more than the 16777216"), std::runtime_error);
}

TEST_CASE("capturing to the profile a run was filled from adds the run to it; a changed shape replaces it") {
  const ExpertProfile before = sample();
  ExpertProfile run;
  run.layout = before.layout;
  run.counts = {{1, 1, 1}, {0, 3, 9}};
  const ExpertProfile sum = accumulate_expert_profile(before, run);
  CHECK(sum.layout == before.layout);
  CHECK(sum.counts[0] == std::vector<uint64_t>{6, 1, 8});
  CHECK(sum.counts[1] == std::vector<uint64_t>{1, 5, std::numeric_limits<uint64_t>::max()});  // saturates

  ExpertProfile other_layout = run;
  other_layout.layout = expert_profile_layout(2, 4);
  CHECK(accumulate_expert_profile(before, other_layout).counts == run.counts);
  ExpertProfile other_rows = run;
  other_rows.counts = {{1, 1, 1}};
  CHECK(accumulate_expert_profile(before, other_rows).counts == other_rows.counts);
  ExpertProfile other_width = run;
  other_width.counts[1] = {1, 2};
  CHECK(accumulate_expert_profile(before, other_width).counts == other_width.counts);
}

TEST_CASE("an unwritable profile path is refused with the path, and no temporary file is left") {
  TempDir dir;
  const std::string blocker = dir / "file";
  write_text(blocker, "x");
  CHECK_THROWS_WITH_AS(write_expert_profile(sample(), blocker + "/p.json"), doctest::Contains(blocker.c_str()), std::runtime_error);
  // The rename fails (a directory is in the way): the temporary file beside it is removed.
  std::filesystem::create_directories(dir / "taken/x");
  CHECK_THROWS_WITH_AS(write_expert_profile(sample(), dir / "taken"), doctest::Contains("rename from"), std::runtime_error);
  int entries = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) entries += e.path().filename().string().find(".tmp.") == std::string::npos ? 0 : 1;
  CHECK(entries == 0);
}

TEST_CASE("a FIFO in the profile's place is refused at once, not waited on") {
  TempDir dir;
  const std::string fifo = dir / "p.json";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  CHECK_THROWS_WITH_AS(read_expert_profile(fifo), doctest::Contains("not a regular file"), std::runtime_error);
}
