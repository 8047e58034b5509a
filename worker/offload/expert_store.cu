#include "worker/offload/expert_store.hpp"

#include <sys/mman.h>

#include <algorithm>
#include <numeric>
#include <stdexcept>

#include "worker/cuda/cuda_check.hpp"

namespace servedeck::worker::offload {

namespace {
constexpr std::size_t k_page = 4096;
}

ExpertStore::ExpertStore(int n_layers, int n_experts, const cuda::QuantLayout& layout)
    : n_layers_(n_layers), n_experts_(n_experts), layout_(layout), block_bytes_(layout.block_bytes()) {
  const bool quantised = layout.format != cuda::ExpertFormat::bf16;
  const int align = quantised ? 32 : 8;
  if (n_layers <= 0 || n_experts <= 0 || layout.hidden % align != 0 || layout.inter % align != 0 ||
      (layout.format == cuda::ExpertFormat::fp8_block && (layout.bc % 16 != 0 || layout.br < 1)))
    throw std::invalid_argument("ExpertStore: need positive layers/experts and hidden, inter multiples of " +
                                std::to_string(align) + " (fp8: block columns a multiple of 16); got layers " +
                                std::to_string(n_layers) + ", experts " + std::to_string(n_experts) + ", hidden " +
                                std::to_string(layout.hidden) + ", inter " + std::to_string(layout.inter) + ", block " +
                                std::to_string(layout.br) + "x" + std::to_string(layout.bc));
  const std::size_t bytes = static_cast<std::size_t>(n_experts) * block_bytes();
  layer_bytes_mapped_ = (bytes + k_page - 1) / k_page * k_page;
  for (int l = 0; l < n_layers; ++l) {
    void* p = mmap(nullptr, layer_bytes_mapped_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
      throw std::runtime_error("ExpertStore: mmap of " + std::to_string(layer_bytes_mapped_) + " bytes for layer " +
                               std::to_string(l) + " failed");
    host_.push_back(static_cast<std::byte*>(p));
  }
  host_dev_.assign(static_cast<std::size_t>(n_layers), nullptr);
  hot_.assign(static_cast<std::size_t>(n_layers), nullptr);
  d_tables_.assign(static_cast<std::size_t>(n_layers), nullptr);
}

ExpertStore::~ExpertStore() {
  free_hot_cache();
  for (auto* t : d_tables_)
    if (t) cudaFree(const_cast<__nv_bfloat16**>(t));
  if (d_hot_flags_) cudaFree(d_hot_flags_);
  for (auto* p : host_) {
    if (registered_) cudaHostUnregister(p);
    munmap(p, layer_bytes_mapped_);
  }
}

std::byte* ExpertStore::host_block(int layer, int expert) {
  return host_[static_cast<std::size_t>(layer)] + static_cast<std::size_t>(expert) * block_bytes_;
}

void ExpertStore::register_host() {
  if (registered_) return;
  for (std::size_t l = 0; l < host_.size(); ++l) {
    CUDA_CHECK(cudaHostRegister(host_[l], layer_bytes_mapped_, cudaHostRegisterMapped));
    void* dev = nullptr;
    CUDA_CHECK(cudaHostGetDevicePointer(&dev, host_[l], 0));
    host_dev_[l] = static_cast<std::byte*>(dev);
  }
  registered_ = true;
  for (auto& t : d_tables_) {
    void* p = nullptr;
    CUDA_CHECK(cudaMalloc(&p, sizeof(void*) * static_cast<std::size_t>(n_experts_)));
    t = static_cast<const __nv_bfloat16**>(p);
  }
  CUDA_CHECK(cudaMalloc(&d_hot_flags_, static_cast<std::size_t>(n_layers_) * n_experts_));
  fill_hot_cache(0, nullptr, nullptr);
}

void ExpertStore::free_hot_cache() {
  for (auto& h : hot_) {
    if (h) cudaFree(h);
    h = nullptr;
  }
}

void ExpertStore::fill_hot_cache(int slots, const ExpertProfile* profile, std::vector<std::string>* warnings) {
  if (!registered_) throw std::logic_error("ExpertStore::fill_hot_cache before register_host");
  slots = std::clamp(slots, 0, n_experts_);
  free_hot_cache();
  slots_ = slots;
  std::vector<uint8_t> flags(static_cast<std::size_t>(n_layers_) * n_experts_, 0);
  vram_.assign(flags.size(), nullptr);
  std::vector<int> unmatched;  // layers the profile has no row of n_experts_ counts for: one warning names them
  for (int l = 0; l < n_layers_; ++l) {
    std::vector<int> order(static_cast<std::size_t>(n_experts_));
    std::iota(order.begin(), order.end(), 0);
    bool usable = profile && static_cast<std::size_t>(l) < profile->counts.size() &&
                  profile->counts[static_cast<std::size_t>(l)].size() == static_cast<std::size_t>(n_experts_);
    if (profile && !usable) unmatched.push_back(l);
    if (usable) {
      const auto& c = profile->counts[static_cast<std::size_t>(l)];
      std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
        return c[static_cast<std::size_t>(a)] > c[static_cast<std::size_t>(b)];
      });
    }
    std::vector<const __nv_bfloat16*> table(static_cast<std::size_t>(n_experts_));
    for (int e = 0; e < n_experts_; ++e)
      table[static_cast<std::size_t>(e)] = reinterpret_cast<const __nv_bfloat16*>(
          host_dev_[static_cast<std::size_t>(l)] + static_cast<std::size_t>(e) * block_bytes_);
    if (slots > 0) {
      void* p = nullptr;
      CUDA_CHECK(cudaMalloc(&p, static_cast<std::size_t>(slots) * block_bytes()));
      hot_[static_cast<std::size_t>(l)] = static_cast<std::byte*>(p);
      for (int s = 0; s < slots; ++s) {
        const int e = order[static_cast<std::size_t>(s)];
        std::byte* dst = hot_[static_cast<std::size_t>(l)] + static_cast<std::size_t>(s) * block_bytes_;
        CUDA_CHECK(cudaMemcpy(dst, host_block(l, e), block_bytes(), cudaMemcpyHostToDevice));
        const auto* as_table = reinterpret_cast<const __nv_bfloat16*>(dst);
        table[static_cast<std::size_t>(e)] = as_table;
        flags[static_cast<std::size_t>(l) * n_experts_ + e] = 1;
        vram_[static_cast<std::size_t>(l) * n_experts_ + e] = as_table;
      }
    }
    CUDA_CHECK(cudaMemcpy(const_cast<__nv_bfloat16**>(d_tables_[static_cast<std::size_t>(l)]), table.data(),
                          sizeof(void*) * table.size(), cudaMemcpyHostToDevice));
  }
  CUDA_CHECK(cudaMemcpy(d_hot_flags_, flags.data(), flags.size(), cudaMemcpyHostToDevice));
  if (!unmatched.empty() && warnings) {
    std::string list;
    for (std::size_t i = 0; i < unmatched.size() && i < 8; ++i) list += (i ? ", " : "") + std::to_string(unmatched[i]);
    if (unmatched.size() > 8) list += ", ...";
    warnings->push_back("hot-expert profile: " + std::to_string(unmatched.size()) + " of " + std::to_string(n_layers_) +
                        " layers have no row of " + std::to_string(n_experts_) + " expert counts (layers " + list +
                        "); those layers fill by expert id");
  }
}

cuda::ExpertTable ExpertStore::table(int layer) const {
  return cuda::ExpertTable{d_tables_[static_cast<std::size_t>(layer)], layout_.hidden, layout_.inter, layout_.format,
                           layout_.br, layout_.bc};
}

std::size_t ExpertStore::expert_bytes() const {
  return static_cast<std::size_t>(n_layers_) * n_experts_ * block_bytes();
}
std::size_t ExpertStore::host_bytes_mapped() const { return static_cast<std::size_t>(n_layers_) * layer_bytes_mapped_; }
std::size_t ExpertStore::hot_cache_bytes() const {
  return static_cast<std::size_t>(n_layers_) * slots_ * block_bytes();
}

}  // namespace servedeck::worker::offload
