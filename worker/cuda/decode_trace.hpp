// Decode-step timeline records (benchmark builds with -DSERVEDECK_DECODE_TRACE=ON only; see
// decode_trace.cuh for what is recorded and how).
#pragma once

#include <cstddef>
#include <cstdint>

namespace servedeck::worker::cuda {

/// One block of one fused decode kernel; times are %globaltimer readings in ns (0 = not
/// recorded: a kernel without a PDL wait leaves t_wait and t_waited at 0).
struct DecodeTraceRecord {
  unsigned long long grid;  // %gridid of the launch
  unsigned block, sm;       // blockIdx.x, %smid
  unsigned long long t_start, t_wait, t_waited, t_end;
  unsigned long long t_staged;  // a staging kernel's rows all in shared memory (0: no stage)
  unsigned long long t_summed;  // the staged GEMVs' and the downs' warps done with their partial sums (0: not recorded)
  unsigned long long c_start, c_end;  // %clock64 of the block's SM at t_start and t_end (cycles): its clock rate
};

/// Slots of the device buffer given to set_decode_trace_buffer (320 MiB: 80-byte records).
constexpr std::size_t k_decode_trace_slots = std::size_t{1} << 22;

#ifdef SERVEDECK_DECODE_TRACE
/// Points every fused decode kernel at `device_buffer` (k_decode_trace_slots records, zeroed by
/// the caller), or nullptr to stop recording. Kernels launched afterwards, including replays of
/// graphs captured before, record into it.
void set_decode_trace_buffer(DecodeTraceRecord* device_buffer);
#endif

}  // namespace servedeck::worker::cuda
