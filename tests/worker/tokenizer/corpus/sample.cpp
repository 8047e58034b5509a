// A small C++20 program used as tokenizer corpus.
#include <algorithm>
#include <cstdint>
#include <map>
#include <string_view>
#include <vector>

namespace demo {

template <typename T>
concept Numeric = std::is_arithmetic_v<T>;

struct Point {
  double x_ = 0.0;
  double y_ = 0.0;
  auto operator<=>(const Point&) const = default;
};

template <Numeric T>
[[nodiscard]] constexpr T clamp_add(T a, T b, T hi) noexcept {
  return (a > hi - b) ? hi : static_cast<T>(a + b);
}

class Histogram {
 public:
  explicit Histogram(std::size_t bins) : counts_(bins, 0u) {}
  void add(std::uint32_t v) { ++counts_[v % counts_.size()]; }
  std::uint64_t total() const {
    std::uint64_t sum = 0;
    for (auto c : counts_) sum += c;
    return sum;
  }

 private:
  std::vector<std::uint32_t> counts_;  // (bins) counts
};

}  // namespace demo

int main(int argc, char** argv) {
  demo::Histogram h{16};
  for (int i = 0; i < argc; ++i) h.add(static_cast<std::uint32_t>(std::string_view(argv[i]).size()));
  std::map<std::string, int> m{{"alpha", 1}, {"beta", 2}};
  auto it = std::find_if(m.begin(), m.end(), [](const auto& kv) { return kv.second > 1; });
  if (it != m.end() && h.total() >= 0x10ULL) return 1;
  return demo::clamp_add<int>(2'147'483'000, 1000, 2147483647) == 2147483647 ? 0 : 2;
}
