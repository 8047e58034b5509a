// The small checkpoint the quantised-checkpoint tests write: the tiny model with a 512-token
// vocabulary and three layers, the middle one dense (its gate/up/down are quantised too).
#pragma once

#include "worker/model/tiny_model.hpp"

namespace servedeck::test {

inline worker::TinyModelOptions small_model(worker::WeightFormat q, int shards = 1) {
  worker::TinyModelOptions o;
  o.vocab_size = 512;
  o.num_layers = 3;
  o.mlp_only_layers = {1};
  o.shards = shards;
  o.quantize = q;
  return o;
}

}  // namespace servedeck::test
