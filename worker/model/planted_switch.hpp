// A planted switch for the tiny checkpoints: a second planted reply that replaces the first
// when a marker token occurs anywhere earlier in the context. The "tool" tiny model uses it so
// that an agent sees a whole tool-using turn: after a prompt it emits a tool call; once the
// context holds a tool result (the marker, Qwen3's <tool_response>) it answers and ends.
//
// How (layer 0, KV head 1 and the query heads that read it, 2 and 3, of the default shape; the
// other heads stay random): a bigram-planted model cannot tell the two turns apart — both end in
// the same generation prompt — so one attention head looks back for the marker.
//   - query: at the reply's start tokens (`after`), the query is the unit vector e7 of the head
//     (dimension 7 pairs with 15 in the rotation, RoPE's lowest frequency: 5.6e-6 rad per token
//     at theta 1e6, so the scores are flat over the whole context); the query rows are orthogonal
//     to every reply token's normalised input, so the tokens decoded inside a reply never look;
//   - key: the marker's key is e7 alone (cosine 1 with that query), a "\n" token's has cosine
//     ~0.7 (the sink that takes the attention when no marker is there), every other token's a
//     small one (the other key rows are 3x longer and orthogonal to both); q_norm and k_norm
//     weigh dimension 7 by 6, so the scores are 144 x cosine: marker 144, sink ~100, others
//     rarely above 60 — a margin of e^40 against 16k tokens;
//   - value: one dimension carries the marker's normalised input, orthogonalised against "\n"
//     (so the sink contributes exactly nothing); o_proj writes it along a unit direction z
//     orthogonal to every planted token's (final-norm weighted) embedding, with length `signal`;
//   - lm_head: the switch reply's first row is (1 - epsilon) times the first reply's first row
//     plus gain_z times z: without the marker the first reply wins by epsilon; with it z decides.
// The rest of the switch reply is planted like any reply (PlantedReply). Same seed, same bytes.
#pragma once

#include <cstdint>
#include <vector>

#include "worker/model/safetensors_writer.hpp"
#include "worker/model/tiny_model.hpp"

namespace servedeck::worker {

/// Plants `sw` into layer 0 of a model of shape `o` (num_kv_heads >= 2, head_dim 16) and its
/// lm_head, given its tensors. `first` is the model's primary PlantedReply (its `after` tokens
/// start both replies). Throws std::runtime_error naming a missing tensor or a shape it cannot
/// serve.
void plant_switch(const TinyModelOptions& o, const PlantedSwitch& sw, std::vector<TensorToWrite>& shard0);

}  // namespace servedeck::worker
