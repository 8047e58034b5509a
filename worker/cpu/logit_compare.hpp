// Comparing two models' logits over the same positions: how far a quantised checkpoint moves
// the output of its BF16 original, or a backend the reference's.
//
// Thread-safety: pure function.
#pragma once

#include <cstddef>
#include <span>

namespace servedeck::worker::cpu {

struct LogitComparison {
  std::size_t positions = 0;
  double rel_l2 = 0;          // ||got - ref|| / ||ref|| over every logit
  double max_abs = 0;         // largest |got - ref|
  double top1_agreement = 0;  // share of positions whose argmax agrees (ties: the lower id)
  double mean_kl = 0;         // mean over positions of KL(softmax(ref) || softmax(got)), nats
};

/// `ref` and `got` hold the same number of rows of `vocab` logits (row-major). Precondition:
/// equal sizes, a multiple of vocab > 0.
LogitComparison compare_logits(std::span<const float> ref, std::span<const float> got, std::size_t vocab);

}  // namespace servedeck::worker::cpu
