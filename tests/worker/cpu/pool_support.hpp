// The CPU tests' KV pool: a KvBlockPool of enough blocks for `tokens`, and the backend's pool
// storage allocated for it.
#pragma once

#include <cstddef>

#include "worker/engine/backend.hpp"
#include "worker/engine/kv_block_pool.hpp"
#include "worker/engine/kv_sequence.hpp"

namespace servedeck::worker::testing {

struct Pool {
  Pool(Backend& backend, std::size_t tokens, std::size_t block_tokens = 16)
      : blocks(KvPoolShape{(tokens + block_tokens - 1) / block_tokens, block_tokens}) {
    backend.allocate_kv_pool(blocks.shape());
  }
  KvBlockPool blocks;
};

}  // namespace servedeck::worker::testing
